"""The features worker's pure logic: re-keying records into terminal events (terminals/events.py)
and one terminal's table entry (terminals/state.py): counting once, the delay, when to publish."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.event_time import EventClock
from contracts.terminal_risk import DELAY_DAYS, HORIZON_DAYS, MS_PER_DAY
from contracts.transaction import MAX_EVENT_TIME_MS
from plumbing.errors import DecodeError, ValidationError
from scorer.terminal_risk import TerminalRisk
from terminals.events import (
    LABEL,
    TRANSACTION,
    Routed,
    TerminalEvent,
    batch_by_partition,
    decode_batch,
    partition_of,
    route_label,
    route_transaction,
)
from terminals.state import (
    CORRECTED,
    COUNTED,
    DUPLICATE,
    REPEATED,
    STALE,
    Publication,
    TerminalState,
)
from terminals.table_clock import NO_DAY, TerminalClock
from terminals.unpublished import PUBLISH_WITHIN_DAYS, Unpublished, publication_due

DAY0 = 20_000
TRANSACTION_RECORD: dict[str, Any] = {
    "transaction_id": "t-1",
    "card_id": "c-1",
    "merchant_id": "m-1",
    "terminal_id": "P",
    "amount": 10.0,
    "currency": "EUR",
    "mcc": 5411,
    "country": "DE",
    "channel": "pos",
    "card_present": True,
    "event_time": DAY0 * MS_PER_DAY + 5,
}
LABEL_RECORD: dict[str, Any] = {
    "transaction_id": "t-1",
    "card_id": "c-1",
    "terminal_id": "P",
    "fraud": True,
    "event_time": DAY0 * MS_PER_DAY + 5,
    "reported_at": (DAY0 + 9) * MS_PER_DAY,
}


def tx(offset: int, day: int, partition: int = 0) -> TerminalEvent:
    return TerminalEvent(TRANSACTION, partition, offset, day * MS_PER_DAY + 1)


def lab(
    offset: int,
    day: int,
    reported: int,
    fraud: bool = True,
    partition: int = 0,
    transaction: str | None = None,
) -> TerminalEvent:
    """A label event; its transaction is t-<partition>-<offset> unless named."""
    return TerminalEvent(
        LABEL,
        partition,
        offset,
        day * MS_PER_DAY + 1,
        fraud,
        reported * MS_PER_DAY + 2,
        transaction or f"t-{partition}-{offset}",
    )


# ── re-keying ────────────────────────────────────────────────────────────────────────────────


def test_a_transaction_becomes_an_event_of_its_terminal() -> None:
    routed = route_transaction(msgspec.json.encode(TRANSACTION_RECORD), 3, 41)
    assert routed == Routed(
        "P", TerminalEvent(TRANSACTION, 3, 41, TRANSACTION_RECORD["event_time"])
    )


def test_a_label_becomes_an_event_of_its_terminal_and_one_of_its_card() -> None:
    routed = route_label(msgspec.json.encode(LABEL_RECORD), 1, 7)
    expected = TerminalEvent(
        LABEL, 1, 7, LABEL_RECORD["event_time"], True, LABEL_RECORD["reported_at"], "t-1"
    )
    assert routed == [Routed("P", expected), Routed(LABEL_RECORD["card_id"], expected, card=True)]


def test_events_travel_in_one_record_per_partition_in_their_order() -> None:
    routed = [Routed(f"term-{i % 7}", TerminalEvent(TRANSACTION, 0, i, i)) for i in range(50)]
    routed += [Routed(f"card-{i % 5}", TerminalEvent(LABEL, 0, i, i), card=True) for i in range(30)]
    records = batch_by_partition(routed, 4)
    assert set(records) <= set(range(4))
    for partition, value in records.items():
        batch = decode_batch(value)
        for pairs in (batch.events, batch.cards):
            assert all(partition_of(key, 4) == partition for key, _ in pairs)
            offsets = [event.offset for _, event in pairs]
            assert offsets == sorted(offsets)
        assert all(key.startswith("term-") for key, _ in batch.events)
        assert all(key.startswith("card-") for key, _ in batch.cards)
    batches = [decode_batch(v) for v in records.values()]
    assert sum(len(b.events) for b in batches) == 50 and sum(len(b.cards) for b in batches) == 30


def test_an_internal_record_of_an_older_worker_has_no_card_events() -> None:
    older = b'[[["P", ["t", 0, 5, 9]]]]'  # TerminalBatch before it carried cards
    batch = decode_batch(older)
    assert batch.events == [("P", TerminalEvent(TRANSACTION, 0, 5, 9))] and batch.cards == []


def test_a_terminals_partition_is_stable() -> None:
    # The changelog is laid out by it: CRC-32, never Python's per-process string hash.
    assert [partition_of(t, 6) for t in ("a", "merch-00001-t0", "P")] == [3, 1, 1]


@pytest.mark.parametrize("terminal", [None, ""])
def test_records_without_a_terminal_route_to_no_terminal(terminal: str | None) -> None:
    assert route_transaction(encode(TRANSACTION_RECORD, terminal_id=terminal), 0, 0) is None
    routed = route_label(encode(LABEL_RECORD, terminal_id=terminal), 0, 0)
    assert [(r.key, r.card) for r in routed] == [(LABEL_RECORD["card_id"], True)]


def test_invalid_records_raise_the_contract_errors() -> None:
    with pytest.raises(DecodeError):
        route_label(b"{", 0, 0)
    with pytest.raises(ValidationError):
        route_label(encode(LABEL_RECORD, fraud="yes"), 0, 0)
    with pytest.raises(ValidationError):
        route_transaction(encode(TRANSACTION_RECORD, amount=-1), 0, 0)


def test_an_internal_record_that_is_not_one_is_a_value_error() -> None:
    for value in (None, b"", b"[1]", b'{"events": []}', b'[[["P", ["x", 0, 0, 0]]]]'):
        with pytest.raises(ValueError, match="not a batch of terminal events"):
            decode_batch(value)


def encode(record: dict[str, Any], **changes: object) -> bytes:
    return msgspec.json.encode({**record, **changes})


# ── one terminal's entry ─────────────────────────────────────────────────────────────────────


def test_a_transaction_waits_until_a_day_before_a_window_reads_its_day() -> None:
    # Issue 44: a publication per new day was a record per transaction where a terminal sees
    # about one a day; no window reads a day before DELAY_DAYS after it.
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    assert state.as_of_day == NO_DAY
    first = state.apply(tx(0, DAY0), clock)
    assert first.result == COUNTED and not first.publish and first.day == DAY0
    assert state.as_of_day == DAY0 and state.unpublished()
    again = state.apply(tx(1, DAY0 + 1), clock)
    assert again.result == COUNTED and not again.publish and state.as_of_day == DAY0 + 1
    waiting = Unpublished()
    waiting.note("T", first.day)
    waiting.note("T", again.day)
    assert waiting.take_due(DAY0 + PUBLISH_WITHIN_DAYS - 1) == []
    assert waiting.take_due(DAY0 + PUBLISH_WITHIN_DAYS) == ["T"], "due by its oldest change"
    assert "T" not in waiting and waiting.take_due(DAY0 + 100) == []
    assert PUBLISH_WITHIN_DAYS < DELAY_DAYS, "published before the first window reads it"
    assert state.take_publication() is not None and not state.unpublished()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["note", "discard", "take"]),
            st.sampled_from(["T1", "T2", "T3", "T4"]),
            st.integers(DAY0, DAY0 + 20),
        ),
        max_size=60,
    )
)
def test_the_waiting_entries_kept_by_day_give_what_a_scan_of_all_gives(
    steps: list[tuple[str, str, int]],
) -> None:
    """`Unpublished` looks only at the days due (a day close at every internal record scanned
    every waiting entry); it must take exactly what a scan would."""
    waiting, scanned = Unpublished(), dict[str, int]()
    for action, key, day in steps:
        if action == "note":
            waiting.note(key, day)
            scanned[key] = min(day, scanned.get(key, day))
        elif action == "discard":
            waiting.discard(key)
            scanned.pop(key, None)
        else:
            due = sorted(k for k, d in scanned.items() if publication_due(d, day))
            assert sorted(waiting.take_due(day)) == due
            for k in due:
                del scanned[k]
        assert all((k in waiting) == (k in scanned) for k in ("T1", "T2", "T3", "T4"))


def test_a_late_fraud_label_counts_in_the_windows_after_the_delay() -> None:
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    for offset in range(4):
        state.apply(tx(offset, DAY0), clock)
    reported = DAY0 + DELAY_DAYS + 2
    applied = state.apply(lab(0, DAY0, reported), clock)
    assert applied.result == COUNTED and applied.publish and state.as_of_day == reported
    features = state.features()
    assert features[4] == pytest.approx(0.25)  # terminal_risk_7d: 1 of 4
    assert features[1] == 0.0  # terminal_risk_1d reads only DAY0 + 2
    expected = TerminalRisk()
    for _ in range(4):
        expected.add_transaction(DAY0)
    expected.add_label(DAY0, True)
    np.testing.assert_array_equal(features, expected.features(reported))


def test_a_fraud_inside_the_delay_is_published_at_once_and_read_from_its_day_on() -> None:
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    state.apply(tx(0, DAY0 + 10), clock)
    assert state.take_publication() is not None
    applied = state.apply(lab(0, DAY0 + 8, DAY0 + 10), clock)
    # Its day is inside the delay: no window reads it today, but the published buckets carry
    # it to the scorer, which reads it as of each transaction's own day.
    assert applied.result == COUNTED and applied.publish
    assert state.take_publication() is not None
    assert state.features()[2] == 0.0
    days, counts = state.risk.buckets()
    assert counts[days == DAY0 + 8].tolist() == [[0, 1]]
    # A transaction today changes no window's count: the fraud is published already.
    assert not state.apply(tx(1, DAY0 + 8 + DELAY_DAYS), clock).publish
    assert state.features()[2] == pytest.approx(np.log1p(1))  # terminal_frauds_1d


def test_a_legitimate_outcome_changes_no_count_and_publishes_nothing_at_once() -> None:
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    state.apply(tx(0, DAY0 + 9), clock)
    before = state.features()
    assert not state.apply(lab(0, DAY0, DAY0 + 9, fraud=False), clock).publish
    np.testing.assert_array_equal(state.features(), before)
    # Its report moves the terminal's day, which no feature the scorer computes reads.
    assert not state.apply(lab(1, DAY0, DAY0 + 10, fraud=False), clock).publish
    assert state.as_of_day == DAY0 + 10


def test_an_event_read_again_is_not_counted_twice() -> None:
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    state.apply(tx(5, DAY0, partition=1), clock)
    state.apply(lab(2, DAY0, DAY0 + 9, partition=1), clock)
    counts = state.features()
    for again in (
        tx(5, DAY0, partition=1),
        tx(4, DAY0, partition=1),
        lab(2, DAY0, DAY0 + 9, partition=1),
    ):
        assert state.apply(again, clock).result == DUPLICATE
    np.testing.assert_array_equal(state.features(), counts)
    # Positions are per input and partition: these are new records.
    assert state.apply(tx(5, DAY0, partition=0), clock).result == COUNTED
    assert state.apply(lab(5, DAY0, DAY0 + 9, partition=0), clock).result == COUNTED
    assert state.positions == {"t1": 5, "l1": 2, "t0": 5, "l0": 5}


def test_a_shorter_day_for_compressed_time() -> None:
    state = TerminalState()
    day_ms = 3_200
    state.apply(TerminalEvent(TRANSACTION, 0, 0, 10 * day_ms + 5), TerminalClock(day_ms))
    assert state.as_of_day == 10


def test_the_table_value_round_trips() -> None:
    clock = TerminalClock(MS_PER_DAY)
    state = TerminalState()
    state.apply(tx(0, DAY0), clock)
    state.apply(lab(3, DAY0, DAY0 + 9, partition=2), clock)
    copy = TerminalState.from_bytes(state.to_bytes())
    assert (copy.as_of_day, copy.positions) == (state.as_of_day, state.positions)
    np.testing.assert_array_equal(copy.features(), state.features())
    assert copy.to_bytes() == state.to_bytes()


@pytest.mark.parametrize(
    "value",
    [b"", b"{}", b"[]", b'{"as_of_day": 1, "positions": {}, "risk": {"days": [1]}}', b"\xff"],
)
def test_a_table_value_it_did_not_write_is_a_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):
        TerminalState.from_bytes(value)


# ── state you can trust: hostile times, re-sent labels, idle terminals ─────────────────────


def clock_at(day: int) -> TerminalClock:
    """A worker clock whose wall clock is 1 AM on `day`."""
    return TerminalClock(MS_PER_DAY, EventClock(wall_ms=lambda: day * MS_PER_DAY + 3_600_000))


def risky(clock: TerminalClock) -> TerminalState:
    """A terminal with 7 transactions on DAY0 and one confirmed fraud, as of DAY0 + 9."""
    state = TerminalState()
    for offset in range(7):
        state.apply(tx(offset, DAY0), clock)
    state.apply(lab(0, DAY0, DAY0 + 9), clock)
    return state


RISK_7D = 4  # terminal_risk_7d in TERMINAL_FEATURE_NAMES


def test_a_future_dated_record_does_not_zero_a_terminals_risk() -> None:
    # Finding 2: the terminal's day became the record's (year 9999), so every window lay far
    # behind it, and its bucket took a day that would not come for millennia.
    clock = clock_at(DAY0 + 9)
    state = risky(clock)
    assert state.features()[RISK_7D] == pytest.approx(1 / 7)
    future = TerminalEvent(TRANSACTION, 0, 100, MAX_EVENT_TIME_MS)
    applied = state.apply(future, clock)
    assert applied.clamped and state.as_of_day == DAY0 + 9
    assert state.features()[RISK_7D] == pytest.approx(1 / 7)
    label = lab(1, DAY0, 10**9, transaction="t-x")  # reported in the far future
    assert state.apply(label, clock).clamped and state.as_of_day == DAY0 + 9
    assert state.features()[RISK_7D] == pytest.approx(2 / 7)


def test_a_future_record_read_first_after_a_restart_keeps_its_terminals_day() -> None:
    # A restarted worker's clock knows no day until a trusted record arrives. A future record
    # read first counted on the bound's day (today), moving a terminal of a replayed backlog
    # a year ahead: every window of it empty, its risk zeroed.
    state = risky(clock_at(DAY0 + 9))
    restarted = clock_at(DAY0 + 400)  # the wall clock is a year on; the stream replays DAY0
    future = TerminalEvent(TRANSACTION, 0, 100, MAX_EVENT_TIME_MS)
    assert state.apply(future, restarted).clamped
    assert state.as_of_day == DAY0 + 9 and restarted.watermark_day == NO_DAY
    # Counted on the terminal's own day, which its delayed windows do not read yet.
    assert state.features()[RISK_7D] == pytest.approx(1 / 7)


def test_a_label_sent_twice_counts_once_and_a_later_one_corrects_it() -> None:
    # Finding 4: a label re-sent at a new offset doubled its weight (risk 0.143 became 0.286).
    clock = clock_at(DAY0 + 9)
    state = risky(clock)
    again = state.apply(lab(5, DAY0, DAY0 + 9, transaction="t-0-0"), clock)
    assert again.result == REPEATED and state.features()[RISK_7D] == pytest.approx(1 / 7)
    other_partition = lab(9, DAY0, DAY0 + 9, partition=3, transaction="t-0-0")
    assert state.apply(other_partition, clock).result == REPEATED
    corrected = state.apply(lab(6, DAY0, DAY0 + 9, fraud=False, transaction="t-0-0"), clock)
    assert corrected.result == CORRECTED and corrected.publish
    assert state.features()[RISK_7D] == 0.0
    assert state.apply(lab(7, DAY0, DAY0 + 9, fraud=False, transaction="t-0-0"), clock).result == (
        REPEATED
    )
    assert state.apply(lab(8, DAY0, DAY0 + 9, transaction="t-0-0"), clock).result == CORRECTED
    assert state.features()[RISK_7D] == pytest.approx(1 / 7)
    copy = TerminalState.from_bytes(state.to_bytes())
    assert copy.apply(lab(10, DAY0, DAY0 + 9, transaction="t-0-0"), clock).result == REPEATED


def test_records_older_than_every_window_change_nothing() -> None:
    clock = clock_at(DAY0 + 100)
    state = TerminalState()
    state.apply(tx(0, DAY0 + 99), clock)
    clock.advance(DAY0 + 99)  # every input has reached it (the routers' marks)
    before = state.to_bytes()
    stale = state.apply(tx(1, DAY0), clock)
    assert stale.result == STALE and not stale.publish
    assert TerminalState.from_bytes(state.to_bytes()).features().tolist() == (
        TerminalState.from_bytes(before).features().tolist()
    )


def test_a_terminal_with_nothing_left_to_read_is_never_published_or_becomes_a_tombstone() -> None:
    # Finding 5: the worker published a record for every terminal, neutral ones included. Now a
    # terminal is published while some window reads, or will read, one of its counts.
    clock = clock_at(DAY0 + 60)
    state = TerminalState()
    assert state.take_publication() is None, "nothing counted"
    state.apply(tx(0, DAY0), clock)
    publication = state.take_publication()
    assert publication is not None and publication.buckets is not None
    assert not state.features().any(), "read from DAY0 + 7 on"
    assert state.take_publication() is None, "published already"
    state = risky(clock_at(DAY0 + 9))
    assert state.take_publication() is not None and state.features()[RISK_7D] > 0
    # A legitimate label reported 60 days on moves the day past every window of DAY0.
    state.apply(lab(9, DAY0 + 30, DAY0 + 60, fraud=False), clock_at(DAY0 + 60))
    assert state.take_publication() == Publication(DAY0 + 60, None), "a tombstone"
    assert state.take_publication() is None


def test_a_terminal_is_idle_once_no_window_reads_its_days() -> None:
    clock = clock_at(DAY0 + 200)
    state = TerminalState()
    state.apply(tx(0, DAY0), clock)
    clock.advance(DAY0 + HORIZON_DAYS)
    assert not clock.idle_since(state.newest_day)
    clock.advance(DAY0 + HORIZON_DAYS + 1)
    assert clock.idle_since(state.newest_day)


def test_remembered_labels_stay_within_the_buckets() -> None:
    clock = clock_at(DAY0 + 200)
    state = TerminalState()
    for day in range(60):
        state.apply(tx(day, DAY0 + day), clock)
        state.apply(lab(day, DAY0 + day, DAY0 + day), clock)
    assert len(state.labels) <= HORIZON_DAYS + 1
