"""Label regimes (simulator/label_regimes.py): the review queue, the chargeback delays, and the
simulated streams each regime reports (simulator/replay.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.terminal_risk import MS_PER_DAY
from scorer.fallback import red_flags
from simulator.label_regimes import (
    CASE_EXPIRY_MS,
    CHARGEBACK_DELAY_S,
    MAX_CHARGEBACK_DELAY_S,
    NEVER,
    REVIEW_WORK_MS,
    REVIEWS_PER_DAY,
    SHIFT_MS,
    LabelRegime,
    Reviewers,
    ReviewQueue,
    audit_sample,
    capacity_reports,
    chargeback_delays_ms,
    reviews_in_shift,
)
from simulator.replay import Stream, simulate
from simulator.transactions import DEFAULT_START_TIME_MS
from training.fold_data import training_targets
from training.protocol import assessed_days

SEED, DAYS, CARDS = 6, 12, 2_000
#: A reviewed outcome comes at the latest this long after the transaction.
REVIEWED_WITHIN_MS = CASE_EXPIRY_MS + SHIFT_MS + REVIEW_WORK_MS


@pytest.fixture(scope="module")
def streams() -> dict[LabelRegime, Stream]:
    return {regime: simulate(SEED, DAYS, CARDS, regime) for regime in LabelRegime}


def test_the_queue_gives_the_highest_expected_loss_first_and_drops_expired_cases() -> None:
    queue = ReviewQueue(expiry_ms=1_000)
    queue.add(np.array([1, 2, 3, 4]), np.array([0, 500, 900, 100]), np.array([5.0, 9.0, 1.0, 7.0]))
    assert queue.take(2, now_ms=1_050) == [2, 4]
    assert queue.take(5, now_ms=1_050) == [3], "row 1, flagged at 0, expired at 1,000"
    assert len(queue) == 0
    queue.add(np.array([7, 8]), np.array([2_000, 2_000]), np.array([1.0, 2.0]))
    assert queue.take(5, now_ms=2_000) == [8, 7]


def test_the_queue_stays_bounded_when_no_one_reaches_its_cases() -> None:
    queue = ReviewQueue(expiry_ms=10)
    for hour in range(100):
        rows = np.arange(1_000) + 1_000 * hour
        queue.add(rows, np.full(1_000, 100 * hour), np.ones(1_000))
        queue.take(1, now_ms=100 * hour)
    assert len(queue) <= 11_000


def test_reviewers_take_the_shifts_share_of_the_flagged_and_audit_the_others() -> None:
    reviewers = Reviewers(np.random.default_rng(3), audit_share=0.5, reviews_per_day=48)
    rows = np.arange(100)
    flagged = rows < 10
    reviewers.see(rows, flagged, np.zeros(100, np.int64), np.arange(10, dtype=np.float64))
    reviewed, done = reviewers.end_shift(SHIFT_MS)
    flagged_reviews = [row for row in reviewed if row < 10]
    assert flagged_reviews == [9, 8], "2 reviews an hour, highest expected loss first"
    audits = [row for row in reviewed if row >= 10]
    assert 25 < len(audits) < 65, "about half of the 90 unflagged rows"
    assert all(SHIFT_MS <= at < SHIFT_MS + REVIEW_WORK_MS for at in done)
    again, _ = reviewers.end_shift(2 * SHIFT_MS)
    assert again == [7, 6], "audits are drawn once; the queue goes on"


@given(st.integers(0, 10_000), st.integers(0, 2_000))
def test_any_24_hours_hold_the_days_reviews(first: int, per_day: int) -> None:
    shifts = [reviews_in_shift(first + k, per_day) for k in range(24)]
    assert sum(shifts) == per_day
    assert max(shifts) - min(shifts) <= 1


def test_chargeback_delays_follow_the_stated_distribution() -> None:
    delays_s = chargeback_delays_ms(np.random.default_rng(1), 200_000) / 1000.0
    assert delays_s.min() >= 0.001 and delays_s.max() <= MAX_CHARGEBACK_DELAY_S
    median_s, _ = CHARGEBACK_DELAY_S
    assert np.median(delays_s) == pytest.approx(median_s, rel=0.02)
    assert np.quantile(delays_s, 0.9) == pytest.approx(15.1 * 86_400, rel=0.03)


def test_today_reports_what_the_simulator_drew(streams: dict[LabelRegime, Stream]) -> None:
    stream = streams[LabelRegime.TODAY]
    reported = stream.reported_at != NEVER
    assert len(stream.labels) == int(reported.sum())
    assert (reported & ~stream.is_fraud).any(), "today confirms some legitimate rows"


def test_chargebacks_report_frauds_only_days_later(streams: dict[LabelRegime, Stream]) -> None:
    stream = streams[LabelRegime.CHARGEBACKS]
    reported = stream.reported_at != NEVER
    assert not (reported & ~stream.is_fraud).any()
    assert all(label["fraud"] for label in stream.labels)
    assert len(stream.labels) == int(reported.sum()) > 0
    delay = stream.reported_at[reported] - stream.columns.event_time[reported]
    assert np.median(delay) > 2 * MS_PER_DAY
    last_two_days = stream.is_fraud & (stream.day >= DAYS - 2)
    assert (~reported[last_two_days]).mean() > 0.9, "a median of 7 days: mostly still to come"


def test_capacity_reviews_only_what_is_flagged_or_audited_within_capacity(
    streams: dict[LabelRegime, Stream],
) -> None:
    stream = streams[LabelRegime.CAPACITY]
    delay = stream.reported_at - stream.columns.event_time
    reviewed = (stream.reported_at != NEVER) & (delay <= REVIEWED_WITHIN_MS)
    flagged = np.any(np.stack(list(red_flags(stream.features).values())), axis=0)
    audited = reviewed & ~flagged
    # Chargebacks that come this soon are rare (log-normal, median 7 days): the rest are audits.
    assert 0 < audited.sum() <= 0.003 * len(flagged)
    # A review is reported within the hour after its shift: a day's count may take the next
    # day's first hour.
    review_day = (stream.reported_at[reviewed & flagged] - DEFAULT_START_TIME_MS) // MS_PER_DAY
    assert np.bincount(review_day).max() <= REVIEWS_PER_DAY * 1.1
    assert (reviewed & ~stream.is_fraud).any(), "analysts also clear legitimate transactions"
    assert (stream.is_fraud & ~reviewed & (stream.reported_at != NEVER)).any(), "chargebacks"


def test_capacity_with_every_row_audited_labels_every_unflagged_row_within_hours() -> None:
    stream = simulate(SEED, 3, 300, LabelRegime.CAPACITY, audit_share=1.0)
    flagged = np.any(np.stack(list(red_flags(stream.features).values())), axis=0)
    delay = stream.reported_at[~flagged] - stream.columns.event_time[~flagged]
    end_ms = DEFAULT_START_TIME_MS + 3 * MS_PER_DAY
    late = stream.columns.event_time[~flagged] >= end_ms - 2 * SHIFT_MS
    assert (delay[~late] <= SHIFT_MS + REVIEW_WORK_MS).all()


def test_the_capacity_replay_computes_what_one_pass_over_its_reports_computes(
    streams: dict[LabelRegime, Stream],
) -> None:
    """The hour-by-hour replay, whose reviews depend on the features, gives every row the
    features that one pass computes from the same report times: nothing it learnt came before
    its report, and nothing reported was missed."""
    stream = streams[LabelRegime.CAPACITY]
    again = simulate(SEED, DAYS, CARDS, LabelRegime.CAPACITY)
    assert np.array_equal(again.features, stream.features), "deterministic"
    one_pass = _one_pass(stream)
    assert np.array_equal(one_pass, stream.features)


def _one_pass(stream: Stream) -> np.ndarray:
    from simulator import replay
    from simulator.transactions import TransactionSimulator

    population = TransactionSimulator(SEED, num_cards=CARDS, num_terminals=2 * CARDS).population
    index = {name: i for i, name in enumerate(population.terminal_ids)}
    terminal = np.array([index[str(t)] for t in stream.columns.terminal_id], np.int64)
    passes = replay.Replay(
        stream.columns,
        replay.replay_history(stream.columns),
        stream.card,
        terminal,
        len(population.card_ids),
        len(population.terminal_ids),
    )
    return replay.replay_once(passes, stream.is_fraud, stream.reported_at)


def test_training_learns_only_the_frauds_reported_before_going_live(
    streams: dict[LabelRegime, Stream],
) -> None:
    start = 0
    go_live_ms = DEFAULT_START_TIME_MS + assessed_days(start)[0] * MS_PER_DAY
    for regime in (LabelRegime.CHARGEBACKS, LabelRegime.CAPACITY):
        stream = streams[regime]
        rows = np.flatnonzero(stream.day < 7)
        targets = training_targets(stream, start, rows)
        late = stream.is_fraud[rows] & (stream.reported_at[rows] >= go_live_ms)
        assert late.any(), f"{regime}: some frauds are reported after go-live"
        assert not targets[late].any()
        assert np.array_equal(targets | late, stream.is_fraud[rows])
    today = streams[LabelRegime.TODAY]
    rows = np.flatnonzero(today.day < 7)
    assert np.array_equal(training_targets(today, start, rows), today.is_fraud[rows])


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_an_audit_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="audit_share"):
        simulate(SEED, 1, 100, LabelRegime.CAPACITY, audit_share=share)


def test_the_audit_sample_is_the_share_of_ids_and_grows_with_it() -> None:
    ids = [f"tx-{i}" for i in range(100_000)]
    small, large = audit_sample(ids, 0.001), audit_sample(ids, 0.01)
    # Binomial: 100 and 1,000 expected, each within 5 standard deviations.
    assert abs(int(small.sum()) - 100) < 5 * 10
    assert abs(int(large.sum()) - 1_000) < 5 * 31.5
    assert not (small & ~large).any(), "raising the share keeps the earlier audits"
    assert (audit_sample(ids[:500], 0.01) == large[:500]).all(), "a hash of the id alone"
    assert not audit_sample(ids, 0.0).any()
    assert audit_sample(ids[:1_000], 1.0).all()


def _day_of_flags(rng: np.random.Generator, n: int = 4_800) -> tuple[np.ndarray, ...]:
    """`n` transactions over two days, a quarter flagged, a tenth frauds."""
    at_ms = np.sort(rng.integers(0, 2 * MS_PER_DAY, n)).astype(np.int64)
    flagged = rng.random(n) < 0.25
    is_fraud = rng.random(n) < 0.1
    return at_ms, flagged, rng.random(n) * 100.0, is_fraud


def test_capacity_reports_review_the_flags_within_capacity_and_the_audit() -> None:
    at_ms, flagged, loss, is_fraud = _day_of_flags(np.random.default_rng(5))
    audited = ~flagged & (np.arange(len(at_ms)) % 50 == 0)
    reports = capacity_reports(
        at_ms, flagged, loss, is_fraud, audited, np.random.default_rng(6), reviews_per_day=48
    )
    reviewed = reports.reviewed
    assert (reviewed & flagged).sum() == 2 * 48, "two days of capacity, the queue never empty"
    assert (reviewed[audited]).all() and not (reviewed & ~flagged & ~audited).any()
    # A review reports its outcome within the hour after its shift; a fraud nobody reviewed
    # waits for its chargeback; a legitimate one nobody reviewed is never reported.
    late = reports.reported_at[reviewed] - at_ms[reviewed]
    assert (late <= CASE_EXPIRY_MS + SHIFT_MS + REVIEW_WORK_MS).all()
    missed = is_fraud & ~reviewed
    assert (reports.reported_at[missed] - at_ms[missed] >= 1).all()
    assert (reports.reported_at[~is_fraud & ~reviewed] == NEVER).all()
    # Each hour's reviews take the highest expected loss first: the reviewed flags outweigh,
    # on average, those left to chargebacks.
    assert loss[reviewed & flagged].mean() > loss[flagged & ~reviewed].mean() + 10.0


def test_capacity_reports_without_flags_or_audits_are_chargebacks_alone() -> None:
    at_ms, _, loss, is_fraud = _day_of_flags(np.random.default_rng(7))
    none = np.zeros(len(at_ms), np.bool_)
    reports = capacity_reports(at_ms, none, loss, is_fraud, none, np.random.default_rng(8))
    assert not reports.reviewed.any()
    assert ((reports.reported_at != NEVER) == is_fraud).all()
    median_s = np.median(reports.reported_at[is_fraud] - at_ms[is_fraud]) / 1000.0
    assert 0.8 * CHARGEBACK_DELAY_S[0] < median_s < 1.25 * CHARGEBACK_DELAY_S[0]
