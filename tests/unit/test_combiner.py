"""The combiner (`FRAUD_FEATURES_COMBINE=on`, terminals/events.py): a terminal's transactions of
one input partition travel in a routed batch as one run, and the table counts the run in one
step. These tests hold it to what the events one by one do: the table agent's real code
(`EntityTable`) is fed the same deliveries twice, as events and as runs, including batches
routed again after a crash that end elsewhere than the first time, and must end with the same
table values and the same counts by result."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from contracts.event_time import EventClock
from contracts.terminal_risk import MS_PER_DAY
from terminals.config import FeaturesSettings
from terminals.entity_table import EntityTable
from terminals.events import (
    LABEL,
    TRANSACTION,
    InputMarks,
    Routed,
    TerminalEvent,
    TransactionRun,
    batch_by_partition,
    decode_batch,
)
from terminals.metrics import WorkerMetrics
from terminals.state import COUNTED, DUPLICATE, RunApplied, TerminalState
from terminals.table_clock import TerminalClock
from terminals.table_progress import TableClocks

#: Input partitions of each topic, and the terminals the events name.
PARTITIONS = 3
TERMINALS = ("T0", "T1", "T2")
#: The tests' "now": event times are drawn around the real wall clock (the worker's bound).
NOW_MS = int(time.time() * 1000)


class Drawn(NamedTuple):
    terminal: str
    label: bool
    partition: int
    #: Milliseconds before now (negative: past the clock's bound, counted on the clock's day).
    age_ms: int
    fraud: bool
    transaction: int
    report_delay_ms: int


drawn_events = st.lists(
    st.builds(
        Drawn,
        st.sampled_from(TERMINALS[:1] * 3 + TERMINALS[1:]),  # one terminal most: long runs
        st.integers(0, 4).map(lambda n: n == 0),  # a label in five: runs of several
        st.sampled_from([0, 0, 0, 1, 2]),
        st.one_of(
            st.integers(0, 50 * MS_PER_DAY),  # out of order, some older than every window
            st.sampled_from([-2 * MS_PER_DAY, 45 * MS_PER_DAY]),  # in the future; stale
        ),
        st.booleans(),
        st.integers(0, 5),
        st.integers(0, 9 * MS_PER_DAY),
    ),
    min_size=1,
    max_size=120,
)
#: Where each delivery ends (a fraction of what is left), where the batch routed again after a
#: crash ends (anywhere up to the last event), and whether it crashes before its commit.
deliveries = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans()), max_size=8)


def routed_of(drawn: list[Drawn]) -> list[Routed]:
    """The events in the router's order, each input partition's offsets increasing."""
    offsets: dict[tuple[bool, int], int] = {}
    routed = []
    for d in drawn:
        offset = offsets[d.label, d.partition] = offsets.get((d.label, d.partition), -1) + 1
        event_time = NOW_MS - d.age_ms
        if d.label:
            event = TerminalEvent(
                LABEL,
                d.partition,
                offset,
                event_time,
                d.fraud,
                event_time + d.report_delay_ms,
                f"tx-{d.transaction}",
            )
        else:
            event = TerminalEvent(TRANSACTION, d.partition, offset, event_time)
        routed.append(Routed(d.terminal, event))
    return routed


def slices(count: int, cuts: list[tuple[float, float, bool]]) -> list[tuple[int, int]]:
    """Deliveries [start, end) covering every event: each from the last commit (its start
    again after a crash, the batch not committed) to a drawn end, then the rest."""
    committed, out = 0, []
    for end_at, back_at, crash in cuts:
        end = committed + round(end_at * (count - committed))
        if end == committed:
            continue
        out.append((committed, end))
        if crash:  # routed and applied, not committed: read again, cut elsewhere
            again = committed + round(back_at * (count - committed))
            if again > committed:
                out.append((committed, again))
            continue
        committed = end
    if committed < count:
        out.append((committed, count))
    return out


class Arm:
    """The table agent of one table partition, fed as terminals/app.py feeds it."""

    def __init__(self) -> None:
        self.table: dict[str, bytes] = {}
        config = FeaturesSettings(table_partitions=1)
        self.metrics = WorkerMetrics(CollectorRegistry())
        self.clocks = TableClocks(config)
        self.entities = EntityTable(
            cast(Any, None), self.table, config, self.metrics, self.clocks, card=False
        )

    def deliver(self, routed: list[Routed], marks: InputMarks, *, combine: bool) -> None:
        [value] = batch_by_partition(
            routed, 1, marks, combine_to_ms=NOW_MS if combine else None
        ).values()
        batch = decode_batch(value)
        self.entities.apply(0, batch.events, batch.runs)
        assert batch.marks is not None
        self.clocks.of(0).follow(batch.marks)
        self.entities.close_days(0)
        self.entities.write(0)

    def results(self) -> dict[tuple[str, str], float]:
        [family] = [
            m for m in self.metrics.registry.collect() if m.name == "fraud_features_terminal_events"
        ]
        return {
            (s.labels["source"], s.labels["result"]): s.value
            for s in family.samples
            if s.name.endswith("_total") and s.value
        }


def marks_after(routed: list[Routed]) -> InputMarks:
    """Every input read up to the newest time routed so far (within the clock's bound)."""
    times = [r.event.reported_at or r.event.event_time for r in routed]
    reached = max((t for t in times if t <= NOW_MS), default=-1)
    keys = [f"{s}{p}" for s in (TRANSACTION, LABEL) for p in range(PARTITIONS)]
    return InputMarks((PARTITIONS, PARTITIONS), {k: (reached, False) for k in keys})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn_events, deliveries)
def test_runs_count_what_the_events_one_by_one_count_even_when_routed_again(
    drawn: list[Drawn], cuts: list[tuple[float, float, bool]]
) -> None:
    routed = routed_of(drawn)
    events, runs = Arm(), Arm()
    for start, end in slices(len(routed), cuts):
        marks = marks_after(routed[:end])
        events.deliver(routed[start:end], marks, combine=False)
        runs.deliver(routed[start:end], marks, combine=True)
    assert runs.table == events.table, "the same counts, days, positions and labels"
    assert runs.results() == events.results(), "the same results: counted, duplicate, stale"
    counted = sum(runs.results().get(("transaction", r), 0) for r in ("counted", "stale"))
    assert counted == sum(1 for r in routed if r.event.source == TRANSACTION)


def test_a_run_holds_a_terminals_transactions_in_order_cut_at_its_other_events() -> None:
    def tx(partition: int, offset: int, time_ms: int) -> TerminalEvent:
        return TerminalEvent(TRANSACTION, partition, offset, time_ms)

    label = TerminalEvent(LABEL, 0, 0, NOW_MS, True, NOW_MS, "tx-1")
    future = tx(1, 8, NOW_MS + 1)  # past the bound: its day depends on what came before
    routed = [Routed("A", tx(0, 1, NOW_MS - 1)), Routed("B", tx(0, 2, NOW_MS - 2))]
    routed += [Routed("A", tx(1, 7, NOW_MS - 7)), Routed("A", label)]
    routed += [Routed("A", tx(0, 3, NOW_MS)), Routed("C", label, card=True)]
    routed += [Routed("A", future), Routed("A", tx(0, 4, NOW_MS)), Routed("A", tx(0, 5, NOW_MS))]
    routed += [Routed("B", tx(0, 6, NOW_MS))]
    routed += [Routed("D", tx(2, 9, NOW_MS))]  # its only transaction: an event
    batch = decode_batch(batch_by_partition(routed, 1, combine_to_ms=NOW_MS)[0])
    assert batch.format_version == 2 and batch.cards == [("C", label)]
    assert batch.events == [("A", label), ("A", future), ("D", tx(2, 9, NOW_MS))]
    assert batch.runs == [
        ("A", TransactionRun(0, [0, 1], [1, 7], [NOW_MS - 1, NOW_MS - 7])),
        ("B", TransactionRun(0, [0, 0], [2, 6], [NOW_MS - 2, NOW_MS])),
        ("A", TransactionRun(1, [0], [3], [NOW_MS])),  # after the label
        ("A", TransactionRun(2, [0, 0], [4, 5], [NOW_MS, NOW_MS])),  # after the future one
    ]
    plain = decode_batch(batch_by_partition(routed, 1)[0])
    assert plain.format_version == 1 and plain.runs == [], "off: the format every release reads"
    assert plain.events == [(r.key, r.event) for r in routed if not r.card], "in their order"


class Format1Batch(msgspec.Struct, array_like=True):
    """`TerminalBatch` as the release before the combiner declares it (format 1)."""

    events: list[tuple[str, TerminalEvent]]
    cards: list[tuple[str, TerminalEvent]] = []
    marks: InputMarks | None = None
    format_version: int = 1


def test_a_release_that_reads_format_1_refuses_a_record_with_runs_rather_than_lose_them() -> None:
    routed = [Routed("A", TerminalEvent(TRANSACTION, 0, o, NOW_MS)) for o in (1, 2)]
    value = batch_by_partition(routed, 1, combine_to_ms=NOW_MS)[0]
    older = msgspec.json.decode(value, type=Format1Batch)
    assert older.events == [] and older.format_version == 2, "its check_format refuses it"


@pytest.mark.parametrize(
    "value",
    [
        b'[[],[],null,2,[["A",[0,[],[],[]]]]]',  # an empty run
        b'[[],[],null,2,[["A",[0,[0,0],[1,2],[5]]]]]',  # an offset without its time
        b'[[],[],null,2,[["A",[0,[0],[1,2],[5,6]]]]]',  # an offset without its partition
        b'[[],[],null,1,[["A",[0,[0,0],[1,2],[5,6]]]]]',  # runs in a record of format 1
    ],
)
def test_an_internal_record_with_a_malformed_run_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="not a batch of terminal events"):
        decode_batch(value)


def state_after(steps: Sequence[TerminalEvent | TransactionRun]) -> tuple[bytes, list[object]]:
    """An entry fed `steps` against one clock (its wall clock NOW_MS), and what each did."""
    state = TerminalState()
    clock = TerminalClock(MS_PER_DAY, EventClock(wall_ms=lambda: NOW_MS))
    done: list[object] = []
    for step in steps:
        if isinstance(step, TransactionRun):
            done.append(state.apply_run(step, clock))
        else:
            done.append(state.apply(step, clock).result)
    return state.to_bytes(), done


def test_a_run_routed_again_past_where_it_ended_counts_only_its_new_transactions() -> None:
    day = MS_PER_DAY
    first = TransactionRun(0, [0, 1, 0, 0], [1, 7, 2, 3], [NOW_MS - 3 * day, NOW_MS - day] * 2)
    # Routed again after a crash, in a batch that ends later: 2, 3 and 7 were counted.
    again = TransactionRun(0, [0, 0, 1, 0, 1], [2, 3, 7, 4, 8], [NOW_MS - 9 * day, *[NOW_MS] * 4])
    held, done = state_after([first, again])
    assert done[1] == RunApplied(counted=2, duplicate=3, changed=True, oldest_day=NOW_MS // day)
    one_by_one, results = state_after(
        [
            TerminalEvent(TRANSACTION, p, o, t)
            for run in (first, again)
            for p, o, t in zip(run.partitions, run.offsets, run.event_times, strict=True)
        ]
    )
    assert held == one_by_one and results.count(DUPLICATE) == 3


def test_a_run_dated_past_the_tables_bound_counts_as_its_transactions_one_by_one() -> None:
    # The router's bound let it into a run; this host's clock is behind the router's.
    times = [NOW_MS - MS_PER_DAY, NOW_MS + 10 * MS_PER_DAY, NOW_MS]
    held, [applied] = state_after([TransactionRun(0, [1, 1, 1], [4, 5, 6], times)])
    assert isinstance(applied, RunApplied) and (applied.counted, applied.clamped) == (3, 1)
    one_by_one, results = state_after(
        [TerminalEvent(TRANSACTION, 1, o, t) for o, t in zip([4, 5, 6], times, strict=True)]
    )
    assert held == one_by_one and results == [COUNTED] * 3
