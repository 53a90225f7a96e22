"""The features worker's inputs in event-time order (terminals/order.py) and the table clock that
follows the routers' marks (terminals/state.py, `TerminalClock.follow`), with in-memory inputs:
a backlog, the labels read to their end first, and an outage, count as a live run does."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.event_time import EventClock
from contracts.terminal_risk import MS_PER_DAY
from terminals.events import LABEL, TRANSACTION, InputMarks, TerminalEvent
from terminals.order import NO_TIME, EventTimeOrder
from terminals.state import COUNTED, STALE, TerminalState
from terminals.table_clock import NO_DAY, TerminalClock

DAY0 = 20_000
HOUR_MS = 3_600_000


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def order(
    max_queued: int = 1_000, max_bytes: int = 10**6, wait_s: float = 5.0
) -> tuple[EventTimeOrder[str], FakeClock]:
    clock = FakeClock()
    return EventTimeOrder(max_queued, max_bytes, wait_s, clock), clock


def read(order: EventTimeOrder[str], key: str, times: list[int], size: int = 100) -> None:
    """Records of `key` read, named after their partition and time, each holding `size` bytes."""
    order.extend(key, times, [f"{key}@{t}" for t in times], [size] * len(times))


def names(taken: tuple[list[str], dict[str, str]]) -> list[str]:
    """The records taken, checking the last of each partition is the one the order says."""
    items, last = taken
    for key, item in last.items():
        assert item == [i for i in items if i.startswith(f"{key}@")][-1]
    assert set(last) == {item.split("@")[0] for item in items}
    return items


# ── the order ────────────────────────────────────────────────────────────────────────────────


def test_labels_read_to_their_end_first_wait_for_the_transactions_of_their_report_time() -> None:
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "t1", "l0"])
    read(routing, "l0", [15, 35, 55])  # report times: the labels topic read to its end
    routing.at_end("l0")
    assert names(routing.take(100)) == [], "nothing is due before the transactions are read"
    read(routing, "t0", [10, 20, 30])
    assert names(routing.take(100)) == [], "t1 has read nothing yet"
    read(routing, "t1", [12, 22])
    assert names(routing.take(100)) == ["t0@10", "t1@12", "l0@15", "t0@20", "t1@22"]
    clock.now += 5.0
    read(routing, "t1", [40, 50])  # t0 has read nothing for the wait: t1 alone holds l0 back
    assert names(routing.take(100)) == ["t0@30", "l0@35", "t1@40", "t1@50"]
    clock.now += 5.0
    assert names(routing.take(100)) == ["l0@55"]


def test_an_input_with_nothing_read_is_waited_for_at_most_its_wait() -> None:
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "t1"])
    read(routing, "t0", [10, 20])
    assert names(routing.take(100)) == []
    clock.now += 4.9
    assert names(routing.take(100)) == []
    clock.now += 0.2
    assert names(routing.take(100)) == ["t0@10", "t0@20"]
    # Once it has records it holds the others back again, and the wait starts afresh from
    # its last read.
    read(routing, "t1", [15])
    read(routing, "t0", [30])
    assert names(routing.take(100)) == ["t1@15"]
    clock.now += 4.0
    assert names(routing.take(100)) == []
    clock.now += 1.0
    assert names(routing.take(100)) == ["t0@30"]


def test_partitions_read_long_ago_do_not_take_their_waits_in_turn() -> None:
    # The wait counts from a partition's last read, not from when its queue emptied: records
    # that waited for another partition's do not start a wait of their own (a live run's
    # step would end a wait per partition later).
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "t1", "t2"])
    read(routing, "t0", [10])
    read(routing, "t1", [20])
    read(routing, "t2", [30])
    assert names(routing.take(100)) == ["t0@10"]
    clock.now += 5.0
    assert names(routing.take(100)) == ["t1@20", "t2@30"]


def test_a_partition_read_to_its_end_is_waited_for_as_a_backfill_may_still_come() -> None:
    # Issue 44: a backfill produced while the worker routes it. t0 read to the end of what the
    # broker had a moment ago was idle at once, t1's later records went first and moved the
    # clock, and t0's next, older records were judged stale against it.
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "t1"])
    read(routing, "t0", [10])
    routing.at_end("t0")
    read(routing, "t1", [11, 20, 30])
    assert names(routing.take(100)) == ["t0@10"]
    assert routing.marks((2, 0)).reached["t0"] == (10, False)
    read(routing, "t0", [15, 25])  # the producer was still writing t0
    assert names(routing.take(100)) == ["t1@11", "t0@15", "t1@20", "t0@25"]
    routing.at_end("t0")
    clock.now += 4.9
    assert names(routing.take(100)) == [] and routing.marks((2, 0)).reached["t0"] == (25, False)
    clock.now += 0.1  # nothing for the wait: idle
    assert names(routing.take(100)) == ["t1@30"]
    assert routing.marks((2, 0)).reached["t0"] == (25, True)


def test_an_empty_partition_is_waited_for_from_its_assignment() -> None:
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "l0"])
    routing.at_end("l0")  # an empty labels partition
    read(routing, "t0", [10, 20])
    assert names(routing.take(100)) == []
    clock.now += 5.0
    assert names(routing.take(100)) == ["t0@10", "t0@20"]


def test_each_partition_keeps_its_offset_order_and_records_without_a_time_take_their_turn() -> None:
    routing, _clock = order()
    routing.assign(["t0", "t1"])
    # t0: a late record (3 after 5) and one without a trusted time keep their place behind 5.
    read(routing, "t0", [5, 3, NO_TIME, 7])
    read(routing, "t1", [4, 6, 8])
    assert names(routing.take(100)) == ["t1@4", "t0@5", "t0@3", f"t0@{NO_TIME}", "t1@6", "t0@7"]


def test_a_batch_is_never_larger_than_its_limit_and_the_rest_comes_next() -> None:
    routing, _clock = order(wait_s=0.0)  # a partition emptied is idle at once
    routing.assign(["t0", "t1"])
    read(routing, "t0", [1, 3, 5, 7])
    read(routing, "t1", [2, 4, 6, 8])
    taken = names(routing.take(3)) + names(routing.take(3)) + names(routing.take(3))
    assert taken == [f"t{(t + 1) % 2}@{t}" for t in range(1, 9)]
    assert names(routing.take(3)) == [] and routing.queued() == 0


def test_a_partition_read_ahead_is_paused_and_resumed_below_half() -> None:
    routing, _clock = order(max_queued=10)
    routing.assign(["t0", "l0"])
    read(routing, "l0", list(range(100, 112)))  # labels far ahead of the transactions
    assert routing.to_pause() == ["l0"] and routing.to_pause() == []
    read(routing, "t0", list(range(110)))
    assert len(names(routing.take(1_000))) == 110 + 10  # the transactions, the labels up to 109
    assert routing.to_resume() == ["l0"] and routing.to_resume() == []


def test_a_partition_holding_large_records_is_paused_on_their_bytes() -> None:
    # Invalid labels of a megabyte each are held as dead letters until their turn: the bytes
    # bound pauses their partition long before the record bound would.
    routing, _clock = order(max_queued=1_000, max_bytes=4_000_000)
    routing.assign(["t0", "l0"])
    read(routing, "l0", [50, 51, 52], size=1_000_000)
    assert routing.to_pause() == [] and routing.queued_bytes() == 3_000_000
    read(routing, "l0", [53], size=1_000_000)
    assert routing.to_pause() == ["l0"]
    read(routing, "t0", [51])
    routing.take(100)  # t0@51 and the labels up to 51
    assert routing.queued_bytes() == 2_000_000 and routing.to_resume() == []
    read(routing, "t0", [60])
    routing.take(100)  # the last labels; t0@60 waits for l0, not at its end
    assert routing.queued_bytes() == 100 and routing.to_resume() == ["l0"]


def test_a_revoked_partition_drops_what_it_queued() -> None:
    routing, _clock = order()
    routing.assign(["t0", "t1"])
    read(routing, "t0", [1, 2])
    routing.revoke(["t1"])
    assert "t1" not in routing and names(routing.take(100)) == ["t0@1", "t0@2"]
    routing.revoke(["t0"])
    assert routing.queued() == 0 and routing.marks((0, 0)).reached == {}


def test_marks_say_what_every_record_still_to_route_has_reached() -> None:
    routing, clock = order(wait_s=5.0)
    routing.assign(["t0", "t1", "l0"])
    assert routing.marks((2, 1)) == InputMarks(
        (2, 1), {"t0": (NO_TIME, False), "t1": (NO_TIME, False), "l0": (NO_TIME, False)}
    )
    read(routing, "t0", [10, 20])
    read(routing, "t1", [15])
    read(routing, "l0", [30])
    routing.at_end("l0")
    routing.take(100)  # t0@10, t1@15: t1 has no more, and is not at its end
    marks = routing.marks((2, 1)).reached
    assert marks == {"t0": (20, False), "t1": (15, False), "l0": (30, False)}
    clock.now += 5.0  # t1 silent too long: idle
    assert routing.marks((2, 1)).reached["t1"] == (15, True)
    # t0@20, then l0@30: every partition was read 5 s ago, so each is idle once it has nothing.
    assert names(routing.take(100)) == ["t0@20", "l0@30"]
    assert routing.marks((2, 1)).reached == {"t0": (20, True), "t1": (15, True), "l0": (30, True)}


# ── the clock that follows the marks ─────────────────────────────────────────────────────────


def day(d: int) -> int:
    return (DAY0 + d) * MS_PER_DAY + HOUR_MS


def test_the_clock_moves_only_once_every_input_is_heard_of_and_with_the_oldest() -> None:
    clock = TerminalClock(MS_PER_DAY)
    # Another replica's router owns t1: until its marks come, the clock stays.
    clock.follow(InputMarks((2, 1), {"t0": (day(40), False), "l0": (day(60), False)}))
    assert clock.watermark_day == NO_DAY and clock.watermark_ms == NO_TIME
    clock.follow(InputMarks((2, 1), {"t1": (day(5), False)}))
    assert clock.watermark_day == DAY0 + 5, "the slower replica's input holds the clock"
    assert clock.watermark_ms == day(5), "the worker's progress, to the millisecond"
    clock.follow(InputMarks((2, 1), {"t1": (day(45), False)}))
    assert clock.watermark_day == DAY0 + 40
    # An idle input (the labels read to their end) holds nothing back; never back either.
    clock.follow(InputMarks((2, 1), {"t0": (day(30), False), "l0": (day(60), True)}))
    assert clock.watermark_day == DAY0 + 40
    clock.follow(InputMarks((2, 1), {"t0": (day(50), False)}))
    assert clock.watermark_day == DAY0 + 45
    # Every input idle: the newest of them.
    clock.follow(InputMarks((2, 1), {"t0": (day(50), True), "t1": (day(46), True)}))
    assert clock.watermark_day == DAY0 + 60
    assert clock.watermark_ms == day(60)


def test_the_clock_never_moves_past_the_bound_nor_on_an_input_not_read_yet() -> None:
    wall = day(10)
    clock = TerminalClock(MS_PER_DAY, EventClock(0, wall_ms=lambda: wall))
    clock.follow(InputMarks((1, 1), {"t0": (NO_TIME, False), "l0": (day(5), True)}))
    assert clock.watermark_day == NO_DAY
    clock.follow(InputMarks((1, 1), {"t0": (day(400), False)}))
    assert clock.watermark_day == NO_DAY
    clock.follow(InputMarks((1, 1), {"t0": (day(9), False)}))
    assert clock.watermark_day == DAY0 + 9


# ── a backlog and an outage count as a live run ───────────────────────────────────────────────

TERMINALS = [f"T{i}" for i in range(12)]


def history(days: int) -> tuple[dict[str, list[TerminalEvent]], dict[str, list[str]]]:
    """Per input partition (t0, t1, l0), its events in offset order, and each one's terminal:
    transactions every few hours at every terminal; a fraud label for one in 13, reported
    a week later."""
    rng = np.random.default_rng(7)
    events: dict[str, list[TerminalEvent]] = {"t0": [], "t1": [], "l0": []}
    terminals: dict[str, list[str]] = {"t0": [], "t1": [], "l0": []}
    labels = []
    for n, at in enumerate(range(day(0), day(days), 5 * HOUR_MS)):
        for i, terminal in enumerate(TERMINALS):
            key = f"t{i % 2}"
            time_ms = at + int(rng.integers(0, HOUR_MS))
            events[key].append(TerminalEvent(TRANSACTION, i % 2, len(events[key]), time_ms))
            terminals[key].append(terminal)
            if (n + i) % 13 == 0:
                labels.append((time_ms + 7 * MS_PER_DAY + 3 * HOUR_MS, time_ms, terminal))
    for reported, time_ms, terminal in sorted(labels):
        offset = len(events["l0"])
        label = TerminalEvent(LABEL, 0, offset, time_ms, True, reported, f"x-{offset}")
        events["l0"].append(label)
        terminals["l0"].append(terminal)
    return events, terminals


def order_time(event: TerminalEvent) -> int:
    return event.reported_at if event.source == LABEL else event.event_time


class Table:
    """What the table agent does with one table partition's records (terminals/entity_table.py)."""

    def __init__(self) -> None:
        self.clock = TerminalClock(MS_PER_DAY)
        self.states: dict[str, TerminalState] = {}
        self.results: dict[str, int] = {}

    def apply(self, events: list[tuple[str, TerminalEvent]], marks: InputMarks) -> None:
        for terminal, event in events:
            result = self.states.setdefault(terminal, TerminalState()).apply(event, self.clock)
            self.results[result.result] = self.results.get(result.result, 0) + 1
        self.clock.follow(marks)

    def counts(self) -> dict[str, tuple[int, list[int], list[list[int]]]]:
        out = {}
        for terminal, state in self.states.items():
            days, counts = state.risk.buckets()
            out[terminal] = (state.as_of_day, days.tolist(), counts.tolist())
        return out


def live(events: dict[str, list[TerminalEvent]], terminals: dict[str, list[str]]) -> Table:
    """Every record routed alone, as it happens: the marks say every input reached its time."""
    table = Table()
    merged = sorted(
        (order_time(e), key, i) for key, evs in events.items() for i, e in enumerate(evs)
    )
    for time_ms, key, i in merged:
        marks = InputMarks((2, 1), {k: (time_ms, False) for k in events})
        table.apply([(terminals[key][i], events[key][i])], marks)
    return table


def catch_up(
    events: dict[str, list[TerminalEvent]],
    terminals: dict[str, list[str]],
    table: Table,
    since_day: int,
    until_day: int,
    chunk: int,
) -> None:
    """A router started on a backlog (or after an outage): the labels partition read to its end
    first, each transactions partition fetched `chunk` records at a time, batches of 100."""
    clock = FakeClock()
    routing: EventTimeOrder[tuple[str, TerminalEvent]] = EventTimeOrder(10_000, 10**8, 5.0, clock)
    routing.assign(events)
    since, until = day(since_day) - HOUR_MS, day(until_day) - HOUR_MS
    backlog = {
        key: [(terminals[key][i], e) for i, e in enumerate(evs) if since <= order_time(e) < until]
        for key, evs in events.items()
    }

    def fetch(key: str, records: list[tuple[str, TerminalEvent]]) -> None:
        routing.extend(key, [order_time(e) for _, e in records], records, [300] * len(records))

    fetch("l0", backlog["l0"])
    routing.at_end("l0")
    cursor = {"t0": 0, "t1": 0}
    while True:
        for key in ("t0", "t1"):
            fetched = backlog[key][cursor[key] : cursor[key] + chunk]
            cursor[key] += len(fetched)
            if fetched:
                fetch(key, fetched)
            elif cursor[key] >= len(backlog[key]):
                routing.at_end(key)
        while batch := routing.take(100)[0]:
            table.apply(batch, routing.marks((2, 1)))
        if routing.queued() == 0 and all(cursor[k] >= len(backlog[k]) for k in cursor):
            break
        clock.now += 5.0  # a round of fetches: a partition that had nothing more is idle now


def test_a_backlog_and_a_catch_up_after_an_outage_count_as_a_live_run() -> None:
    events, terminals = history(90)
    expected = live(events, terminals)
    assert expected.results.get(STALE, 0) == 0
    table = Table()
    catch_up(events, terminals, table, 0, 50, chunk=37)  # then the worker is down
    table.clock = TerminalClock(MS_PER_DAY)  # restarted: the clock follows the marks anew
    catch_up(events, terminals, table, 50, 98, chunk=53)  # and catches up again
    assert table.results == expected.results
    assert table.results[COUNTED] == sum(map(len, events.values()))
    assert table.counts() == expected.counts()


def test_without_the_order_the_labels_read_first_make_the_backlog_stale() -> None:
    # The defect itself: routed as read (the labels topic to its end first), the clock is
    # past every window of the first days when their transactions arrive.
    events, terminals = history(90)
    table = Table()
    for key in ("l0", "t0", "t1"):
        for terminal, event in zip(terminals[key], events[key], strict=True):
            marks = InputMarks((2, 1), dict.fromkeys(events, (order_time(event), False)))
            table.apply([(terminal, event)], marks)
    assert table.results.get(STALE, 0) > 1_000


# ── any reading order gives the same routing order ────────────────────────────────────────────


@st.composite
def partitions_and_fetches(draw: st.DrawFn) -> tuple[dict[str, list[int]], list[tuple[str, int]]]:
    """Input partitions with times mostly in order (a few late, a few without a time), and an
    order of fetches of some size from them."""
    count = draw(st.integers(1, 4))
    partitions = {}
    for p in range(count):
        steps = draw(st.lists(st.integers(-3, 20), max_size=30))
        times, now = [], 0
        for step in steps:
            now += step
            times.append(NO_TIME if step == -3 else max(now, 0))
        partitions[f"t{p}"] = times
    fetches = draw(
        st.lists(st.tuples(st.sampled_from(sorted(partitions)), st.integers(1, 8)), max_size=40)
    )
    return partitions, fetches


@settings(max_examples=150, deadline=None)
@given(partitions_and_fetches(), st.integers(1, 10))
def test_records_are_routed_once_each_in_key_order_whatever_the_reading_order(
    drawn: tuple[dict[str, list[int]], list[tuple[str, int]]], limit: int
) -> None:
    partitions, fetches = drawn
    clock = FakeClock()
    routing: EventTimeOrder[tuple[str, int]] = EventTimeOrder(10**6, 10**9, 1e9, clock)
    routing.assign(partitions)
    cursor = dict.fromkeys(partitions, 0)
    routed: list[tuple[str, int]] = []

    def fetch(key: str, size: int) -> None:
        times = partitions[key][cursor[key] : cursor[key] + size]
        items = [(key, cursor[key] + i) for i in range(len(times))]
        routing.extend(key, times, items, [1] * len(times))
        cursor[key] += len(times)
        if cursor[key] == len(partitions[key]):
            routing.at_end(key)
        while True:
            batch, last = routing.take(limit)
            if not batch:
                break
            assert len(batch) <= limit
            assert last == {k: max(item for item in batch if item[0] == k) for k, _ in batch}
            routed.extend(batch)

    for key, size in fetches:
        fetch(key, size)
    for key in partitions:  # then read to their ends
        fetch(key, len(partitions[key]))
    while routing.queued():  # and silent for the wait: idle, so the others' records go
        clock.now += 1e9
        fetch(next(iter(partitions)), 0)
    # Every record once, each partition's in offset order.
    assert sorted(routed) == [(k, i) for k in sorted(partitions) for i in range(len(partitions[k]))]
    for key in partitions:
        offsets = [i for k, i in routed if k == key]
        assert offsets == sorted(offsets)
    # In key order: each record's key is the newest time its partition had shown up to it.
    keys = {}
    for key, times in partitions.items():
        newest = NO_TIME
        for i, t in enumerate(times):
            newest = max(newest, t)
            keys[key, i] = newest
    assert all(keys[a] <= keys[b] for a, b in pairwise(routed))


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_queued"):
        EventTimeOrder(1, 10, 1.0)
    with pytest.raises(ValueError, match="max_bytes"):
        EventTimeOrder(10, 1, 1.0)
    with pytest.raises(ValueError, match="wait_s"):
        EventTimeOrder(10, 10, -1.0)
