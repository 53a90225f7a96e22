"""Unit tests of the transaction simulator (simulator/: the handbook world, scenarios, labels)."""

from __future__ import annotations

import time
from collections import Counter

import msgspec
import numpy as np
import pytest

from contracts.transaction import decode_transaction
from scorer.features import FEATURE_NAMES, TINY_AMOUNT, build_features
from simulator.fraud import (
    DEFAULT_SCENARIOS,
    LARGE_AMOUNT_THRESHOLD,
    TAKEOVER_AMOUNT_FACTOR,
    TAKEOVER_NIGHT_S,
)
from simulator.population import COUNTRY_CURRENCY, ECOM, RADIUS
from simulator.transactions import (
    DEFAULT_START_TIME_MS,
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
#: About 30 simulated days of the handbook world (≈ 9,700 transactions a day).
LARGE_SAMPLE = 300_000


@pytest.fixture(scope="module")
def month() -> tuple[TransactionSimulator, SimulatedBatch]:
    """A month of the handbook world, long enough for every scenario to reach steady state."""
    simulator = TransactionSimulator(11)
    return simulator, simulator.generate(LARGE_SAMPLE)


@pytest.fixture(scope="module")
def day(month: tuple[TransactionSimulator, SimulatedBatch]) -> SimulatedBatch:
    return month[1]


def test_same_seed_gives_identical_stream() -> None:
    first, second = TransactionSimulator(5), TransactionSimulator(5)
    for _ in range(2):
        a, b = first.generate(3_000), second.generate(3_000)
        assert a.records == b.records
        assert np.array_equal(a.scenario, b.scenario)
        for left, right in zip(a.columns, b.columns, strict=True):
            assert np.array_equal(np.asarray(left), np.asarray(right))


def test_different_seed_gives_different_stream() -> None:
    a = TransactionSimulator(5).generate(1_000)
    b = TransactionSimulator(6).generate(1_000)
    strip = [{k: v for k, v in r.items() if k != "transaction_id"} for r in a.records]
    other = [{k: v for k, v in r.items() if k != "transaction_id"} for r in b.records]
    assert sum(x != y for x, y in zip(strip, other, strict=True)) > 900


def test_every_record_decodes_and_matches_its_columns(day: SimulatedBatch) -> None:
    columns = day.columns
    assert len(day.records) == len(columns.amount) == len(day.is_fraud) == len(day.scenario)
    for i, record in enumerate(day.records[:20_000]):
        assert set(record) == CONTRACT_FIELDS
        decoded = decode_transaction(msgspec.json.encode(record))
        assert decoded.amount == columns.amount[i]
        assert decoded.currency == columns.currency[i]
        assert decoded.mcc == columns.mcc[i]
        assert decoded.country == columns.country[i]
        assert decoded.channel == columns.channel[i]
        assert decoded.card_present == columns.card_present[i]
        assert decoded.event_time == columns.event_time[i]
        # Every transaction names its terminal (e-commerce: a virtual one); whole cents.
        assert decoded.terminal_id == record["terminal_id"] == columns.terminal_id[i]
        assert decoded.card_present == (decoded.channel != "ecom")
        assert round(decoded.amount, 2) == decoded.amount


def test_stream_continues_across_calls() -> None:
    simulator = TransactionSimulator(3, id_prefix="run7", start_time_ms=DEFAULT_START_TIME_MS)
    first = simulator.generate(1_000, rate_per_s=500.0)
    second = simulator.generate(1_000, rate_per_s=500.0)
    ids = [r["transaction_id"] for r in first.records + second.records]
    assert ids == [f"run7-{i}" for i in range(2_000)]
    times = np.concatenate((first.columns.event_time, second.columns.event_time))
    assert times[0] >= DEFAULT_START_TIME_MS
    assert np.all(np.diff(times) >= 0)
    # Compressed to 500/s on average: 2,000 records span seconds, not the simulated hours.
    assert 1_000 < times[-1] - times[0] < 30_000
    assert first.time_scale == second.time_scale > 1_000


def test_how_the_stream_is_cut_changes_nothing_but_time() -> None:
    whole = TransactionSimulator(4).generate(30_000)
    simulator = TransactionSimulator(4)
    parts = [simulator.generate(size) for size in (1, 9_999, 20_000)]
    assert [r for p in parts for r in p.records] == whole.records
    labels = [label for p in parts for label in p.labels]
    assert labels == whole.labels and labels


def test_real_time_follows_the_handbook_day(day: SimulatedBatch) -> None:
    seconds = (day.columns.event_time - DEFAULT_START_TIME_MS) // 1000 % SECONDS_PER_DAY
    assert day.time_scale == 1.0
    assert abs(np.mean(seconds) - 43_200) < 1_000  # normal around noon
    per_day = np.bincount((day.columns.event_time - DEFAULT_START_TIME_MS) // 86_400_000)
    assert 8_500 < np.median(per_day[:-1]) < 10_500  # 5,000 customers x U(0, 4) a day


def test_every_scenario_appears_at_the_handbook_rates(day: SimulatedBatch) -> None:
    counts = Counter(day.scenario.tolist())
    assert set(counts) == set(DEFAULT_SCENARIOS)
    assert np.array_equal(day.is_fraud, day.scenario != "legit")
    # The handbook's simulated data has 0.84 % fraud; a month includes the ramp-up.
    assert 0.004 < day.is_fraud.mean() < 0.012
    assert min(counts.values()) > 100


def test_fraud_scale_zero_gives_legit_only() -> None:
    batch = TransactionSimulator(1, fraud_scale=0.0).generate(20_000)
    assert not batch.is_fraud.any()
    assert set(batch.scenario.tolist()) == {"legit"}
    assert (batch.columns.amount > LARGE_AMOUNT_THRESHOLD).any()
    assert all(label["fraud"] is False for label in batch.labels)


def test_card_testing_is_bursts_of_tiny_ecom_amounts(day: SimulatedBatch) -> None:
    testing = np.flatnonzero(day.scenario == "card_testing")
    assert np.all(day.columns.amount[testing] < TINY_AMOUNT)
    assert np.all(day.columns.channel[testing] == "ecom")
    assert not day.columns.card_present[testing].any()
    # A card's probes come minutes apart.
    cards = day.card[testing]
    times = day.columns.event_time[testing]
    same = cards[1:] == cards[:-1]
    assert same.mean() > 0.5
    assert np.median(np.diff(times)[same]) < 5 * 60_000


def test_handbook_scenarios(month: tuple[TransactionSimulator, SimulatedBatch]) -> None:
    simulator, day = month
    amount = day.columns.amount
    assert np.all(day.is_fraud[amount > LARGE_AMOUNT_THRESHOLD])
    large = day.scenario == "large_amount"
    assert np.all(amount[large] > LARGE_AMOUNT_THRESHOLD)
    # Compromised terminals: a fraud-only stretch of days at a few terminals.
    terminal = day.scenario == "compromised_terminal"
    assert len(np.unique(day.terminal[terminal])) < 0.02 * len(simulator.population.terminal_ids)
    # Compromised cards: frauds of a handful of cards, five times their usual amounts.
    stolen = day.scenario == "compromised_card"
    means = simulator.population.card_mean_amount[day.card[stolen]]
    assert np.median(amount[stolen] / means) > 3.0
    legit = day.scenario == "legit"
    assert (
        abs(np.median(amount[legit] / simulator.population.card_mean_amount[day.card[legit]]) - 1)
        < 0.1
    )


def test_customers_use_terminals_within_the_radius(
    month: tuple[TransactionSimulator, SimulatedBatch],
) -> None:
    simulator, day = month
    population = simulator.population
    start = population.card_terminal_start
    # About π·5² ≈ 78 terminals around a customer, as on the handbook's grid.
    assert 50 < np.diff(start).mean() < 90
    home = population.terminal_country[day.terminal] == population.card_home[day.card]
    assert 0.9 < home.mean() < 0.99  # the rest abroad: travel, foreign web shops
    local = [
        t in population.card_terminals[start[c] : start[c + 1]]
        for c, t in zip(day.card[:2_000].tolist(), day.terminal[:2_000].tolist(), strict=True)
    ]
    assert np.mean(local) > 0.9
    assert RADIUS == 5.0


def test_every_fraud_gets_a_delayed_label(
    month: tuple[TransactionSimulator, SimulatedBatch],
) -> None:
    _, day = month
    labels = day.labels
    by_id = {str(r["transaction_id"]): r for r in day.records}
    frauds = [label for label in labels if label["fraud"]]
    legit = [label for label in labels if not label["fraud"]]
    assert len(frauds) > 0.9 * day.is_fraud.sum() and legit
    delays_h = [
        (int(str(label["reported_at"])) - int(str(label["event_time"]))) / 3.6e6 for label in frauds
    ]
    assert 1 < np.percentile(delays_h, 20) < 24  # analyst reviews: hours
    assert 24 < np.median(delays_h) < 24 * 7  # chargebacks: days
    reported = [int(str(label["reported_at"])) for label in labels]
    assert reported == sorted(reported)
    assert reported[-1] <= day.columns.event_time[-1]
    for label in frauds[:200]:
        record = by_id[str(label["transaction_id"])]
        assert label["card_id"] == record["card_id"]
        assert label["terminal_id"] == record["terminal_id"]
        assert label["event_time"] == record["event_time"]


def test_compressed_time_shortens_label_delays() -> None:
    simulator = TransactionSimulator(8, label_delay_scale=0.5)
    batches = [simulator.generate(3_000, rate_per_s=3_000.0) for _ in range(30)]
    labels = [label for b in batches for label in b.labels]
    assert any(label["fraud"] for label in labels)
    delays_s = [(int(str(x["reported_at"])) - int(str(x["event_time"]))) / 1000 for x in labels]
    assert max(delays_s) < 60


def test_card_currency_is_its_home_currency(day: SimulatedBatch) -> None:
    currency_of_card: dict[object, set[str]] = {}
    for record in day.records[:50_000]:
        currency_of_card.setdefault(record["card_id"], set()).add(str(record["currency"]))
    assert all(len(currencies) == 1 for currencies in currency_of_card.values())
    assert set().union(*currency_of_card.values()) <= set(COUNTRY_CURRENCY.values())


def test_generates_200k_rows_quickly() -> None:
    started = time.perf_counter()
    simulator = TransactionSimulator(2)
    batch = simulator.generate(200_000)
    assert time.perf_counter() - started < 15.0
    assert len(batch.records) == 200_000


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"seed": -1}, "seed"),
        ({"fraud_scale": -0.1}, "fraud_scale"),
        ({"fraud_scale": 11.0}, "fraud_scale"),
        ({"fraud_scale": float("nan")}, "fraud_scale"),
        ({"num_cards": 0}, "num_cards"),
        ({"num_terminals": 0}, "num_terminals"),
        ({"label_delay_scale": -1.0}, "label_delay_scale"),
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
        ({"fraud_scale": "0.1"}, "fraud_scale"),
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


def test_account_takeovers_start_when_switched_on_and_change_nothing_before():
    plain, drifting = TransactionSimulator(9), TransactionSimulator(9)
    before = plain.generate(20_000)
    assert drifting.generate(20_000).records == before.records  # switched on later: the same
    drifting.start_account_takeovers()
    after, unchanged = drifting.generate(60_000), plain.generate(60_000)
    takeover = after.scenario == "account_takeover"
    assert "account_takeover" not in set(unchanged.scenario.tolist())
    assert 50 < takeover.sum() < 600  # 4 accounts a day, 5 days each, 1-3 buys a night
    population = drifting.population
    card, terminal = after.card[takeover], after.terminal[takeover]
    assert (population.terminal_channel[terminal] == ECOM).all()
    assert (population.terminal_country[terminal] != population.card_home[card]).mean() > 0.95
    seconds = (after.columns.event_time[takeover] - DEFAULT_START_TIME_MS) // 1000 % 86_400
    assert (seconds <= TAKEOVER_NIGHT_S[1]).all()
    share = after.columns.amount[takeover] / population.card_mean_amount[card]
    assert (share >= TAKEOVER_AMOUNT_FACTOR[0] - 0.01).all()
    assert (share <= TAKEOVER_AMOUNT_FACTOR[1] + 0.01).all()
    assert after.is_fraud[takeover].all()
