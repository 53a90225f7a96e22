"""Unit tests of the transaction simulator (simulator/transactions.py)."""

from __future__ import annotations

import time
from collections import Counter

import msgspec
import numpy as np
import pytest

from contracts.transaction import decode_transaction
from scorer.features import COUNTRY_CURRENCY, FEATURE_NAMES, TINY_AMOUNT, build_features
from simulator.transactions import (
    DEFAULT_START_TIME_MS,
    SCENARIOS,
    SimulatedBatch,
    TransactionSimulator,
)

CONTRACT_FIELDS = {
    "transaction_id",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount",
    "currency",
    "mcc",
    "country",
    "channel",
    "card_present",
    "event_time",
}
SECONDS_PER_DAY = 86_400
LARGE_SAMPLE = 60_000


@pytest.fixture(scope="module")
def day() -> SimulatedBatch:
    """A whole simulated day, so that night and day traffic are both in it."""
    simulator = TransactionSimulator(11)
    return simulator.generate(LARGE_SAMPLE, rate_per_s=LARGE_SAMPLE / SECONDS_PER_DAY)


def column(batch: SimulatedBatch, name: str) -> np.ndarray:
    return np.asarray(build_features(batch.columns)[:, FEATURE_NAMES.index(name)])


def test_same_seed_gives_identical_stream() -> None:
    first, second = TransactionSimulator(5), TransactionSimulator(5)
    for _ in range(2):
        a, b = first.generate(3_000), second.generate(3_000)
        assert a.records == b.records
        assert np.array_equal(a.scenario, b.scenario)
        for left, right in zip(a.columns, b.columns, strict=True):
            assert np.array_equal(left, right)


def test_different_seed_gives_different_stream() -> None:
    a = TransactionSimulator(5).generate(1_000)
    b = TransactionSimulator(6).generate(1_000)
    strip = [{k: v for k, v in r.items() if k != "transaction_id"} for r in a.records]
    other = [{k: v for k, v in r.items() if k != "transaction_id"} for r in b.records]
    assert sum(x != y for x, y in zip(strip, other, strict=True)) > 900


def test_every_record_decodes_and_matches_its_columns(day: SimulatedBatch) -> None:
    columns = day.columns
    assert len(day.records) == len(columns.amount) == len(day.is_fraud) == len(day.scenario)
    for i, record in enumerate(day.records):
        assert set(record) <= CONTRACT_FIELDS
        assert set(record) >= CONTRACT_FIELDS - {"terminal_id"}
        decoded = decode_transaction(msgspec.json.encode(record))
        assert decoded.amount == columns.amount[i]
        assert decoded.currency == columns.currency[i]
        assert decoded.mcc == columns.mcc[i]
        assert decoded.country == columns.country[i]
        assert decoded.channel == columns.channel[i]
        assert decoded.card_present == columns.card_present[i]
        assert decoded.event_time == columns.event_time[i]
        # A terminal exactly where a card can be present; amounts in whole cents.
        assert (decoded.terminal_id is not None) == (decoded.channel != "ecom")
        assert decoded.card_present == (decoded.channel != "ecom")
        assert round(decoded.amount, 2) == decoded.amount


def test_stream_continues_across_calls() -> None:
    simulator = TransactionSimulator(3, id_prefix="run7", start_time_ms=DEFAULT_START_TIME_MS)
    first = simulator.generate(1_000, rate_per_s=500.0)
    second = simulator.generate(1_000, rate_per_s=500.0)
    ids = [r["transaction_id"] for r in first.records + second.records]
    assert ids == [f"run7-{i}" for i in range(2_000)]
    times = np.concatenate((first.columns.event_time, second.columns.event_time))
    assert times[0] == DEFAULT_START_TIME_MS
    assert np.all(np.diff(times) >= 0)
    # 2,000 records at 500/s span 4 s of simulated time.
    assert times[-1] - times[0] == pytest.approx(3_998, abs=1)


def test_every_scenario_appears_at_about_the_fraud_rate(day: SimulatedBatch) -> None:
    counts = Counter(day.scenario.tolist())
    assert set(counts) == set(SCENARIOS)
    assert min(counts.values()) > 100
    assert np.array_equal(day.is_fraud, day.scenario != "legit")
    assert 0.015 < day.is_fraud.mean() < 0.025


def test_fraud_rate_zero_gives_legit_only() -> None:
    batch = TransactionSimulator(1, fraud_rate=0.0).generate(5_000)
    assert not batch.is_fraud.any()
    assert set(batch.scenario.tolist()) == {"legit"}


def test_card_testing_is_bursts_of_tiny_ecom_amounts(day: SimulatedBatch) -> None:
    testing = np.flatnonzero(day.scenario == "card_testing")
    assert np.all(day.columns.amount[testing] < TINY_AMOUNT)
    assert np.all(day.columns.channel[testing] == "ecom")
    assert not day.columns.card_present[testing].any()
    # Consecutive records of one burst share the card.
    cards = np.array([str(record["card_id"]) for record in day.records])
    is_testing = day.scenario == "card_testing"
    same_card_as_next = np.append(cards[1:] == cards[:-1], False)
    with_next = is_testing & np.append(is_testing[1:], False) & same_card_as_next
    with_previous = np.insert(with_next[:-1], 0, False)
    assert (with_next | with_previous)[testing].mean() > 0.95


def test_scenarios_have_their_signature(day: SimulatedBatch) -> None:
    legit = day.scenario == "legit"
    stolen = day.scenario == "compromised_card"
    large = day.scenario == "large_amount"
    terminal = day.scenario == "compromised_terminal"
    cross_border = column(day, "cross_border")
    night = column(day, "night").astype(bool)
    assert cross_border[stolen].mean() > 0.9
    assert column(day, "high_risk_country")[stolen].mean() > 0.4
    assert day.columns.card_present[stolen].mean() < 0.4
    # Compromised-card fraud is likelier at night; legit traffic is not.
    assert stolen[night].mean() > 2 * stolen[~night].mean()
    assert np.median(day.columns.amount[large]) > 5 * np.median(day.columns.amount[legit])
    assert day.columns.card_present[terminal].all()
    # A small fixed set of terminals, at which legit traffic goes on beside the fraud.
    terminal_ids = np.array([str(r.get("terminal_id", "")) for r in day.records])
    compromised = np.isin(terminal_ids, terminal_ids[terminal])
    assert len(set(terminal_ids[terminal])) < 0.05 * len(set(terminal_ids))
    assert 0.1 < terminal[compromised].mean() < 0.9
    # Legit traffic overlaps the fraud patterns: abroad, tiny and large amounts occur.
    assert 0.01 < cross_border[legit].mean() < 0.1
    assert (day.columns.amount[legit] < TINY_AMOUNT).sum() > 50
    assert (day.columns.amount[legit] > np.median(day.columns.amount[large])).sum() > 20


def test_card_currency_is_its_home_currency(day: SimulatedBatch) -> None:
    currency_of_card: dict[object, set[str]] = {}
    for record in day.records:
        currency_of_card.setdefault(record["card_id"], set()).add(str(record["currency"]))
    assert all(len(currencies) == 1 for currencies in currency_of_card.values())
    assert set().union(*currency_of_card.values()) <= set(COUNTRY_CURRENCY.values())


def test_generates_200k_rows_quickly() -> None:
    simulator = TransactionSimulator(2)
    started = time.perf_counter()
    batch = simulator.generate(200_000)
    assert time.perf_counter() - started < 10.0
    assert len(batch.records) == 200_000


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"seed": -1}, "seed"),
        ({"fraud_rate": -0.1}, "fraud_rate"),
        ({"fraud_rate": 0.9}, "fraud_rate"),
        ({"fraud_rate": float("nan")}, "fraud_rate"),
        ({"num_cards": 0}, "num_cards"),
        ({"num_merchants": 10}, "num_merchants"),
        ({"start_time_ms": -5}, "start_time_ms"),
        ({"id_prefix": ""}, "id_prefix"),
        ({"id_prefix": "x" * 60}, "id_prefix"),
    ],
)
def test_constructor_rejects_out_of_range(kwargs: dict[str, object], name: str) -> None:
    arguments: dict[str, object] = {"seed": 1, **kwargs}
    with pytest.raises(ValueError, match=name):
        TransactionSimulator(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"fraud_rate": "0.1"}, "fraud_rate"),
        ({"num_cards": 10.0}, "num_cards"),
        ({"id_prefix": 7}, "id_prefix"),
    ],
)
def test_constructor_rejects_wrong_types(kwargs: dict[str, object], name: str) -> None:
    arguments: dict[str, object] = {"seed": 1, **kwargs}
    with pytest.raises(TypeError, match=name):
        TransactionSimulator(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "rate_per_s", "error", "name"),
    [
        (-1, 1.0, ValueError, "n"),
        (10, 0.0, ValueError, "rate_per_s"),
        (10, float("inf"), ValueError, "rate_per_s"),
        (10, float("nan"), ValueError, "rate_per_s"),
        (2.0, 1.0, TypeError, "n"),
    ],
)
def test_generate_rejects_bad_arguments(
    n: object, rate_per_s: float, error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name):
        TransactionSimulator(1).generate(n, rate_per_s=rate_per_s)  # type: ignore[arg-type]


def test_generate_zero_rows() -> None:
    batch = TransactionSimulator(1).generate(0)
    assert batch.records == []
    assert len(batch.columns.amount) == 0
    assert build_features(batch.columns).shape == (0, len(FEATURE_NAMES))
