"""Property-based tests of the state, card and terminal: arbitrary interleavings of legal
records (event times anywhere from 1970 to 9999-12-31, out of order, read again), retried and
aborted outputs, revoked and lost partitions, labels re-sent and corrected. After each sequence
the state restored from the changelog equals the state held in memory, and no card or terminal
that saw a record within its window has been forgotten.

The card state runs with the real `Redelivery` (retries) and undo (exactly-once aborts) over an
in-memory changelog; the terminal state replays what the worker's table agent does
(terminals/entity_table.py) with the real `TerminalState` and `TerminalClock`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from contracts.event_time import EventClock
from contracts.offsets import OffsetTracker, SourceOffset
from contracts.terminal_risk import HORIZON_DAYS, MS_PER_DAY, decode_terminal_risk
from contracts.transaction import MAX_EVENT_TIME_MS, Transaction
from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter
from plumbing.errors import TransientDeliveryError
from scorer.card_history_record import LONGEST_WINDOW_MS
from scorer.columns import TransactionColumns
from scorer.terminal_risk import day_length_ms
from stream.metrics import ServiceMetrics
from stream.outcomes import OutcomeGroup
from stream.owned_card_history import OwnedCardHistory
from stream.redelivery import Redelivery
from stream.sink import Output
from terminals.events import LABEL, TRANSACTION, TerminalEvent
from terminals.publication import encode_publications
from terminals.state import TerminalState
from terminals.table_clock import NO_DAY, TerminalClock
from terminals.unpublished import Unpublished
from tests.unit.fakes import MemoryChangelog, changes, message

#: The tests' wall clock: 2026-06-01. Event times are drawn around it and anywhere else.
WALL_MS = 1_780_272_000_000
TOPIC = "tx"
PARTITIONS = (0, 1)
CARDS = ("a", "b", "c", "d")

event_times = st.one_of(
    st.integers(WALL_MS - 40 * MS_PER_DAY, WALL_MS + 60_000),  # recent, out of order
    st.sampled_from([0, 1, WALL_MS - LONGEST_WINDOW_MS, WALL_MS + 400_000, MAX_EVENT_TIME_MS]),
    st.integers(0, MAX_EVENT_TIME_MS),
)


class Record(NamedTuple):
    transaction: Transaction
    position: SourceOffset


class Batch(NamedTuple):
    """New records: (partition, card, event time) each."""

    records: list[tuple[int, str, int]]


class Fail(NamedTuple):
    """The next `failures` card states sent fail (the broker does not acknowledge them)."""

    failures: int


class Retry(NamedTuple):
    """A retry round of the failed outputs."""


class Move(NamedTuple):
    """A partition is revoked (or lost, or its replica crashed) and assigned back: dropped,
    restored, and read again from its committed offset, which lags the last `uncommitted`
    records (a crash between their outputs and the commit)."""

    partition: int
    uncommitted: int


class Abort(NamedTuple):
    """Exactly-once: the open transaction aborts, and what followed the commit is read again."""


class Commit(NamedTuple):
    """Exactly-once: the open transaction commits."""


batches = st.builds(
    Batch,
    st.lists(
        st.tuples(st.sampled_from(PARTITIONS), st.sampled_from(CARDS), event_times),
        min_size=1,
        max_size=12,
    ),
)
steps = st.lists(
    st.one_of(
        batches,
        batches,
        st.builds(Fail, st.integers(1, 4)),
        st.just(Retry()),
        st.builds(Move, st.sampled_from(PARTITIONS), st.integers(0, 8)),
    ),
    max_size=25,
)
transactional_steps = st.lists(
    st.one_of(batches, batches, st.just(Abort()), st.just(Commit())), max_size=25
)


def transaction(card: str, event_time: int, n: int) -> Transaction:
    return Transaction(
        transaction_id=f"t{n}",
        card_id=card,
        merchant_id=f"m{n % 3}",
        amount=float(1 + n % 50),
        currency="EUR",
        mcc=5411,
        country="DE",
        channel="ecom" if n % 2 else "pos",
        card_present=not n % 2,
        event_time=event_time,
    )


@dataclass
class CardHarness:
    """A replica's card state with its changelog, as the service drives it."""

    exactly_once: bool = False
    changelog: MemoryChangelog = field(default_factory=lambda: MemoryChangelog(chunk=3))
    #: Exactly-once: card states of the open transaction, written only when it commits.
    open: list[tuple[int, str, bytes | None]] = field(default_factory=list)
    #: Every record read so far, by partition and offset (read again after an abort).
    read: dict[int, list[Record]] = field(default_factory=lambda: {p: [] for p in PARTITIONS})
    committed: dict[int, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})
    failing: int = 0
    #: Per partition, the newest event time within the wall clock and the skew; per card,
    #: the newest such time it saw (what "within its window" is measured against).
    watermark: dict[int, int] = field(default_factory=dict)
    newest: dict[tuple[int, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        metrics = ServiceMetrics(CollectorRegistry())
        self.clock = EventClock(wall_ms=lambda: WALL_MS)
        self.state = OwnedCardHistory(
            self.changelog,
            time_scale=1.0,
            metrics=metrics,
            clock=self.clock,
            undo=self.exactly_once,
            evict_interval_s=0.0,
        )
        self.state.restore(list(PARTITIONS))
        self.tracker = OffsetTracker()
        self.redelivery = Redelivery(
            RetryPolicy(1, 1e-6, 1e-6),
            DeadLetterRouter("dlq", "test"),
            delivery_timeout_s=0.0,
            max_message_bytes=1_000_000,
            metrics=metrics,
            current_card=self.state.current,
        )

    # -- the sink --------------------------------------------------------------------------

    def send(self, output: Output) -> None:
        if self.failing:
            self.failing -= 1
            self.redelivery.failed(output, TransientDeliveryError("timed out", "_MSG_TIMED_OUT"))
            return
        assert output.partition is not None and output.key is not None
        self.changelog.append(output.partition, output.key.decode(), output.value)
        output.delivered()

    def send_batch(self, topic: str, keys: Any, values: Any, group: Any, output_of: Any,
                   partition: int | None = None, *, headers: Any = None) -> None:  # fmt: skip
        for i in range(len(keys)):
            self.send(output_of(i))

    def poll(self) -> None:
        pass

    def flush(self, timeout_s: float) -> int:
        return 0

    # -- the steps -------------------------------------------------------------------------

    def batch(self, step: Batch) -> None:
        records: list[Record] = []
        for partition, card, event_time in step.records:
            n = sum(len(r) for r in self.read.values())
            offset = len(self.read[partition])
            record = Record(transaction(card, event_time, n), ((TOPIC, partition), offset))
            self.read[partition].append(record)
            records.append(record)
        self._update(records)

    def _update(self, records: list[Record]) -> None:
        columns = TransactionColumns.from_transactions([r.transaction for r in records])
        changed = changes(self.state.update(records, columns)[1])
        bound = self.clock.bound_ms()
        for record in records:
            partition, t = record.position[0][1], record.transaction.event_time
            if t <= bound:
                self.watermark[partition] = max(self.watermark.get(partition, -1), t)
                key = (partition, record.transaction.card_id)
                self.newest[key] = max(self.newest.get(key, -1), t)
        if not changed:
            return
        if self.exactly_once:
            self.open += [(c.partition, c.card_id, c.state) for c in changed]
            return
        positions = [r.position for r in records]
        self.tracker.track_all(positions, [1] * len(positions))
        group = OutcomeGroup(
            self.tracker, positions, Counter({("changelog", "card_state"): len(changed)}),
            lambda _labels: None,
        )  # fmt: skip
        for change in changed:
            source = message(change.batch_index, partition=change.partition, topic=TOPIC)
            self.send(
                Output(
                    "changelog", self.changelog.topic, change.card_id.encode(), change.state,
                    None, source, group, "card_state", change.partition,
                )
            )  # fmt: skip

    def retry(self) -> None:
        if self.redelivery.pending:
            self.redelivery.retry(self)

    def move(self, step: Move) -> None:
        partition = step.partition
        self.retry()  # a revoke waits for what is in flight (it may fail again)
        finished = self.tracker.commit_position((TOPIC, partition)) or 0
        start = min(finished, max(0, len(self.read[partition]) - step.uncommitted))
        self.tracker.forget([(TOPIC, partition)])
        self.state.drop([partition])
        self.state.restore([partition])
        again = self.read[partition][start:]
        if again:
            self._update(again)

    def commit(self) -> None:
        for partition, card, state in self.open:
            self.changelog.append(partition, card, state)
        self.open = []
        self.committed = {p: len(self.read[p]) for p in PARTITIONS}
        self.state.committed({(TOPIC, p): o for p, o in self.committed.items()})

    def abort(self) -> None:
        self.open = []
        self.state.rollback(dict(self.committed))
        again = [r for p in PARTITIONS for r in self.read[p][self.committed[p] :]]
        if again:
            self._update(again)

    # -- the properties --------------------------------------------------------------------

    def check(self) -> None:
        """In memory equals restored from the changelog (as written, and compacted), and every
        card with a record within its window is held."""
        self.failing = 0  # the broker is back: every output goes through
        self.retry()
        if self.exactly_once:
            self.commit()
        held = {p: self._states(self.state, p) for p in PARTITIONS}
        restored = OwnedCardHistory(
            self.changelog, time_scale=1.0, metrics=ServiceMetrics(CollectorRegistry())
        )
        restored.restore(list(PARTITIONS))
        assert {p: self._states(restored, p) for p in PARTITIONS} == held
        self.changelog.compact()
        compacted = OwnedCardHistory(
            self.changelog, time_scale=1.0, metrics=ServiceMetrics(CollectorRegistry())
        )
        compacted.restore(list(PARTITIONS))
        assert {p: self._states(compacted, p) for p in PARTITIONS} == held
        for (partition, card), newest in self.newest.items():
            if newest >= self.watermark[partition] - LONGEST_WINDOW_MS:
                assert card in held[partition], f"card {card} of {partition} forgotten"

    @staticmethod
    def _states(state: OwnedCardHistory, partition: int) -> dict[str, bytes]:
        found = {card: state.current(partition, card).state for card in CARDS}
        return {card: value for card, value in found.items() if value is not None}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_card_state_restored_from_its_changelog_equals_the_state_held(steps: list[Any]) -> None:
    harness = CardHarness()
    for step in steps:
        if isinstance(step, Batch):
            harness.batch(step)
        elif isinstance(step, Fail):
            harness.failing = step.failures
        elif isinstance(step, Retry):
            harness.retry()
        else:
            harness.move(step)
    harness.check()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transactional_steps)
def test_aborted_transactions_leave_the_card_state_its_changelog_restores(
    steps: list[Any],
) -> None:
    harness = CardHarness(exactly_once=True)
    for step in steps:
        if isinstance(step, Batch):
            harness.batch(step)
        elif isinstance(step, Commit):
            harness.commit()
        else:
            harness.abort()
    harness.check()


# ── terminals ────────────────────────────────────────────────────────────────────────────────

TERMINALS = ("p", "q")
DAY_MS = day_length_ms(1.0)

terminal_events = st.lists(
    st.tuples(
        st.sampled_from(TERMINALS),
        st.sampled_from([TRANSACTION, LABEL]),
        st.sampled_from([0, 1]),  # input partition
        event_times,
        st.integers(0, 45 * MS_PER_DAY),  # report delay of a label
        st.booleans(),  # fraud
        st.sampled_from(["t1", "t2", "t3", "t4"]),  # labelled transaction (re-sent often)
        st.integers(-3, 3),  # offset step: <= 0 reads an earlier offset again
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(terminal_events)
def test_terminal_state_restored_and_published_equals_the_state_held(events: list[Any]) -> None:
    clock = TerminalClock(DAY_MS, EventClock(wall_ms=lambda: WALL_MS))
    table: dict[str, bytes] = {}  # the table's changelog: each terminal's last value
    published: dict[str, list[float] | None] = {}  # the scorer's copy of terminal-risk
    held: dict[str, TerminalState] = {}
    offsets = {("t", 0): 0, ("t", 1): 0, ("l", 0): 0, ("l", 1): 0}
    newest: dict[str, int] = {}  # per terminal, its newest day within the wall clock
    waiting = Unpublished()

    def publish_now(terminal: str) -> None:
        waiting.discard(terminal)
        publication = held[terminal].take_publication()
        if publication is not None:
            [value] = encode_publications([(terminal, publication)], card=False)
            published[terminal] = (
                None if value is None else decode_terminal_risk(value).features.tolist()
            )
            table[terminal] = held[terminal].to_bytes()  # the entry's next write says so

    for terminal, source, partition, event_time, delay, fraud, tx, step in events:
        offsets[source, partition] = max(0, offsets[source, partition] + step)
        reported = min(event_time + delay, MAX_EVENT_TIME_MS)
        event = TerminalEvent(
            source, partition, offsets[source, partition], event_time, fraud, reported, tx
        )
        state = held.setdefault(terminal, TerminalState())
        applied = state.apply(event, clock)  # what the table agent does (terminals/entity_table.py)
        # The marks after it: the inputs have reached its times (the router's order).
        clock.advance_to(event_time if source == TRANSACTION else reported)
        if applied.publish:
            publish_now(terminal)
        elif applied.changed:
            waiting.note(terminal, state.as_of_day if applied.day == NO_DAY else applied.day)
        for due in waiting.take_due(clock.watermark_day):  # the day close
            publish_now(due)
        if applied.changed:
            table[terminal] = state.to_bytes()
        counted = source == TRANSACTION and applied.result == "counted" and not applied.clamped
        if counted:
            newest[terminal] = max(newest.get(terminal, NO_DAY), event_time // DAY_MS)

    for terminal, state in held.items():
        if terminal in table:
            restored = TerminalState.from_bytes(table[terminal])
            assert restored.to_bytes() == state.to_bytes()
            np.testing.assert_array_equal(restored.features(), state.features())
        days, counts = state.risk.buckets()
        live = counts[days >= state.as_of_day - HORIZON_DAYS].any()
        expected = state.features().tolist() if live else None
        if terminal in waiting:  # a change whose publication is not due yet: the next close
            publish_now(terminal)
        assert published.get(terminal) == expected, "the scorer's copy is what the state says"
        assert len(msgspec.json.encode(state.labels)) < 10_000
    for terminal, day in newest.items():
        if day >= clock.watermark_day - HORIZON_DAYS:
            assert not clock.idle_since(held[terminal].newest_day), f"{terminal} forgotten"
