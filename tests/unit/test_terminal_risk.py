"""Terminal risk with the handbook's delay (scorer/terminal_risk.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.terminal_risk import (
    BUCKET_DAYS,
    DELAY_DAYS,
    TERMINAL_FEATURE_NAMES,
    TerminalRiskRecord,
    decode_terminal_risk,
    encode_terminal_risk,
)
from scorer.terminal_risk import (
    NEUTRAL_TERMINAL_FEATURES,
    TerminalRisk,
    add_events,
    day_of,
    empty_buckets,
    terminal_features,
    window_features,
)

F = {name: i for i, name in enumerate(TERMINAL_FEATURE_NAMES)}


def risk_with(frauds_on: list[int], transactions_on: list[int]) -> TerminalRisk:
    risk = TerminalRisk()
    for day in transactions_on:
        risk.add_transaction(day)
    for day in frauds_on:
        risk.add_label(day, True)
    return risk


def test_outcomes_count_in_the_delayed_windows_only_once_the_delay_has_passed() -> None:
    risk = risk_with(frauds_on=[100, 100], transactions_on=[100] * 4)
    delayed = [F[name] for name in TERMINAL_FEATURE_NAMES if "fresh" not in name]
    assert not risk.features(100 + DELAY_DAYS - 1)[delayed].any()
    on_time = risk.features(100 + DELAY_DAYS)
    assert on_time[F["terminal_risk_1d"]] == pytest.approx(0.5)
    assert on_time[F["terminal_tx_1d"]] == pytest.approx(np.log1p(4))
    assert on_time[F["terminal_frauds_1d"]] == pytest.approx(np.log1p(2))
    a_day_later = risk.features(100 + DELAY_DAYS + 1)
    assert a_day_later[F["terminal_risk_1d"]] == 0.0
    assert a_day_later[F["terminal_risk_7d"]] == pytest.approx(0.5)
    month_later = risk.features(100 + DELAY_DAYS + 30)
    assert month_later[F["terminal_risk_30d"]] == 0.0
    assert month_later[F["terminal_risk_30d"]] == 0.0
    assert risk.features(100 + DELAY_DAYS + 29)[F["terminal_risk_30d"]] == pytest.approx(0.5)


def test_a_legit_outcome_changes_nothing_and_old_outcomes_are_dropped() -> None:
    risk = risk_with(frauds_on=[], transactions_on=[10, 10])
    before = risk.features(10 + DELAY_DAYS)
    risk.add_label(10, False)
    assert np.array_equal(risk.features(10 + DELAY_DAYS), before)
    risk.add_transaction(10 + BUCKET_DAYS)  # takes day 10's bucket
    risk.add_label(10, True)  # too old to count now
    assert risk.features(10 + BUCKET_DAYS)[F["terminal_frauds_30d"]] == 0.0


def test_events_count_the_same_in_any_order_and_batch() -> None:
    rng = np.random.default_rng(3)
    terminal = rng.integers(0, 5, 400)
    day = rng.integers(0, 80, 400)
    fraud = rng.random(400) < 0.3
    together = empty_buckets(5)
    add_events(*together, terminal, day, None)
    add_events(*together, terminal, day, fraud)
    one_by_one = empty_buckets(5)
    for i in rng.permutation(400).tolist():
        add_events(*one_by_one, terminal[i : i + 1], day[i : i + 1], None)
        add_events(*one_by_one, terminal[i : i + 1], day[i : i + 1], fraud[i : i + 1])
    as_of = np.full(5, 90)
    assert np.array_equal(window_features(*together, as_of), window_features(*one_by_one, as_of))
    values = [TerminalRisk() for _ in range(5)]
    for t, d, f in zip(terminal.tolist(), day.tolist(), fraud.tolist(), strict=True):
        values[t].add_transaction(d)
        values[t].add_label(d, f)
    stacked = np.stack([value.features(90) for value in values])
    assert np.array_equal(stacked, window_features(*together, as_of))


@given(st.lists(st.integers(0, 200), max_size=300))
def test_one_transaction_at_a_time_buckets_as_a_batch_does(days: list[int]) -> None:
    # add_transaction is add_events for one event, without its array set-up (the worker calls
    # it once per transaction): the buckets must end the same, day for day.
    one_at_a_time = TerminalRisk()
    for day in days:
        one_at_a_time.add_transaction(day)
    batch = empty_buckets(1)
    add_events(*batch, np.zeros(len(days), np.int64), np.array(days, np.int64), None)
    held_days, counts = one_at_a_time.buckets()
    assert np.array_equal(held_days, batch[0][0]) and np.array_equal(counts, batch[1][0])


def test_state_and_record_round_trip() -> None:
    risk = risk_with(frauds_on=[3], transactions_on=[3, 3, 4])
    again = TerminalRisk.from_bytes(risk.to_bytes())
    assert np.array_equal(again.features(12), risk.features(12))
    with pytest.raises(ValueError, match="terminal risk state"):
        TerminalRisk.from_bytes(b"{}")
    value = encode_terminal_risk("t-1", 12, risk.features(12))
    record = decode_terminal_risk(value)
    assert record.terminal_id == "t-1" and record.as_of_day == 12
    assert np.array_equal(record.features, risk.features(12))
    for bad in (b"[", b"[]", b'{"terminal_id": 1}', b'{"terminal_id": "t", "as_of_day": 1}'):
        with pytest.raises(ValueError, match="terminal-risk"):
            decode_terminal_risk(bad)


def test_fresh_labels_count_at_once_by_report_for_a_week() -> None:
    risk = risk_with(frauds_on=[100, 100], transactions_on=[100] * 4)
    assert not risk.features(99).any(), "nothing before the transactions' day"
    for day, two_days, week in ((100, 2, 2), (101, 2, 2), (102, 0, 2), (106, 0, 2), (107, 0, 0)):
        features = risk.features(day)
        assert features[F["terminal_fresh_frauds_2d"]] == pytest.approx(np.log1p(two_days)), day
        assert features[F["terminal_fresh_frauds_7d"]] == pytest.approx(np.log1p(week)), day


def test_terminal_features_are_read_from_the_buckets_as_of_each_transactions_day() -> None:
    risk = risk_with(frauds_on=[3], transactions_on=[3, 3, 4])
    with_buckets = decode_terminal_risk(
        encode_terminal_risk("t-1", 4, risk.features(4), risk.buckets())
    )
    older = TerminalRiskRecord("t-old", 4, np.ones(len(TERMINAL_FEATURE_NAMES), np.float32))
    known = {"t-1": with_buckets, "t-old": older}
    ids = ["t-1", "t-1", "t-old", None, "t-unknown"]
    out = terminal_features(known, ids, np.array([4, 12, 12, 12, 12]))
    # As of day 4 no delayed window reads day 3 yet, only the fresh ones; as of day 12 the
    # 7-day window does, exactly as training's `window_features` computes it for day 12.
    assert np.array_equal(out[0], risk.features(4)) and out[0][F["terminal_risk_7d"]] == 0.0
    assert out[0][F["terminal_fresh_frauds_2d"]] > 0
    assert np.array_equal(out[1], risk.features(12)) and out[1].any()
    assert np.array_equal(out[2], older.features), "a record without buckets, as published"
    assert np.array_equal(out[3:], np.stack([NEUTRAL_TERMINAL_FEATURES] * 2))


def test_a_record_with_malformed_buckets_is_refused() -> None:
    risk = risk_with(frauds_on=[3], transactions_on=[3])
    days, counts = risk.buckets()
    for bad in ((days[:-1], counts), (days, -counts - 1), (days, counts[:, :1])):
        with pytest.raises(ValueError, match="terminal-risk record"):
            decode_terminal_risk(encode_terminal_risk("t", 3, risk.features(3), bad))


@pytest.mark.parametrize("value", [3.4028235677973366e38, -1e39, 1e308])
def test_a_feature_past_float32s_range_is_refused_not_read_as_infinite(value: float) -> None:
    # Found by the worker tables' property test (issue 43): the cast overflowed to inf.
    record = {"terminal_id": "t", "as_of_day": 1, **dict.fromkeys(TERMINAL_FEATURE_NAMES, 0.5)}
    record[TERMINAL_FEATURE_NAMES[0]] = value
    with pytest.raises(ValueError, match="not a finite float32"):
        decode_terminal_risk(json.dumps(record).encode())


def test_days_of_event_times() -> None:
    assert day_of([0, 86_399_999, 86_400_000]).tolist() == [0, 0, 1]
    assert day_of([3_600_000], day_ms=1_800_000).tolist() == [2]
    with pytest.raises(ValueError, match="day_ms"):
        day_of([0], day_ms=0)
