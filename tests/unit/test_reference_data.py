"""Reference data (contracts/reference_data.py) against its sources: the country currencies are
CLDR's as babel ships them, every merchant category code is in ISO 18245, the simulated world
agrees with both; and the features read them: a Swiss card in francs is not cross-border."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import iso18245
import numpy as np
import pytest

from contracts.country_currencies import COUNTRY_CURRENCIES
from contracts.reference_data import MCC_FAMILIES, MCC_FAMILY_CODES, MCC_FAMILY_RANGES
from scorer.columns import TransactionColumns
from scorer.features import FEATURE_NAMES, build_features
from simulator.population import COUNTRY_CURRENCY

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_country_currencies_are_what_the_generator_writes_from_cldr():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "ops" / "tools" / "country_currencies.py")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    committed = (ROOT / "contracts" / "country_currencies.py").read_text(encoding="utf-8")
    assert generated == committed, "regenerate: ops/tools/country_currencies.py (see its header)"
    assert len(COUNTRY_CURRENCIES) > 240 and COUNTRY_CURRENCIES["CH"] == ("CHF",)


def test_the_simulated_world_bills_in_a_legal_tender_of_each_country():
    for country, currency in COUNTRY_CURRENCY.items():
        assert currency in COUNTRY_CURRENCIES[country], country


def test_every_merchant_category_code_is_in_iso_18245():
    for family, codes in MCC_FAMILY_CODES.items():
        for code in codes:
            assert iso18245.get_mcc(str(code)), (family, code)  # raises MCCNotFound otherwise
    for low, high in MCC_FAMILY_RANGES["travel"]:
        iso_range = iso18245.get_mcc(str(low)).range
        assert (int(iso_range.start), int(iso_range.end)) == (low, high)
    assert 3650 in MCC_FAMILIES["travel"] and 3650 not in MCC_FAMILY_CODES["travel"]


def columns(country: str, currency: str, mcc: int = 5411) -> TransactionColumns:
    return TransactionColumns(
        amount=np.array([20.0]),
        currency=np.array([currency], dtype="<U3"),
        mcc=np.array([mcc], np.int64),
        country=np.array([country], dtype="<U2"),
        channel=np.array(["pos"], dtype="<U4"),
        card_present=np.array([True]),
        event_time=np.array([1_800_000_000_000], np.int64),
        card_id=["c"],
        merchant_id=["m"],
        terminal_id=[None],
    )


def feature(name: str, country: str, currency: str, mcc: int = 5411) -> float:
    return float(build_features(columns(country, currency, mcc))[0, FEATURE_NAMES.index(name)])


@pytest.mark.parametrize(
    ("country", "currency", "cross_border"),
    [
        ("CH", "CHF", 0.0),  # once flagged: the 22-country table did not know Switzerland
        ("CH", "EUR", 1.0),
        ("PA", "PAB", 0.0),  # two legal tenders: either is at home
        ("PA", "USD", 0.0),
        ("PA", "EUR", 1.0),
        ("DE", "EUR", 0.0),
        ("ZZ", "EUR", 1.0),  # a country CLDR does not know: cross-border, as before
    ],
)
def test_cross_border_reads_every_countrys_currencies(country, currency, cross_border):
    assert feature("cross_border", country, currency) == cross_border


def test_an_airline_or_hotel_code_of_the_iso_range_is_travel():
    assert feature("mcc_travel", "US", "USD", mcc=3650) == 1.0  # a hotel chain's own code
    assert feature("mcc_travel", "US", "USD", mcc=4000) == 0.0


def test_hour_night_and_weekend_read_the_local_clock_when_the_transaction_gives_it():
    # Saturday 2027-01-02 02:30 UTC: night in UTC; 21:30 on Friday in New York (-05:00);
    # 08:00 on Saturday in Kolkata (+05:30); 16:30 on Saturday at +14:00 (Kiribati).
    moment = 1_798_857_000_000
    batch = columns("US", "USD")._replace(
        event_time=np.full(4, moment, np.int64),
        utc_offset_minutes=np.array([0, -300, 330, 840], np.int64),
        **{
            name: np.repeat(getattr(columns("US", "USD"), name), 4)
            for name in ("amount", "currency", "mcc", "country", "channel", "card_present")
        },
        card_id=["c"] * 4,
        merchant_id=["m"] * 4,
        terminal_id=[None] * 4,
    )
    rows = build_features(batch)
    sin, cos = (rows[:, FEATURE_NAMES.index(name)] for name in ("hour_sin", "hour_cos"))
    assert np.allclose(np.degrees(np.arctan2(sin, cos)) / 15 % 24, [2.5, 21.5, 8.0, 16.5])
    assert rows[:, FEATURE_NAMES.index("night")].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert rows[:, FEATURE_NAMES.index("weekend")].tolist() == [1.0, 0.0, 1.0, 1.0]
    # Unoffset, the same instant reads as UTC: the columns without offsets are the old ones.
    plain = build_features(batch._replace(utc_offset_minutes=None))
    assert np.array_equal(plain[0], rows[0]) and np.array_equal(plain[1], rows[0])


def test_offsets_survive_concatenation_and_row_selection():
    given = columns("US", "USD")._replace(utc_offset_minutes=np.array([330], np.int64))
    joined = TransactionColumns.concat([columns("US", "USD"), given, columns("DE", "EUR")])
    assert joined.utc_offset_minutes is not None
    assert joined.utc_offset_minutes.tolist() == [0, 330, 0]
    picked = joined.rows(np.array([1]))._replace(card_id=["c"]).utc_offset_minutes
    assert picked is not None and picked.tolist() == [330]
    plain = TransactionColumns.concat([columns("US", "USD"), columns("DE", "EUR")])
    assert plain.utc_offset_minutes is None and plain.rows(np.array([1])).country.tolist() == ["DE"]
