"""One table of the worker's: `TerminalState` entries, of terminals or of cards, and the topic
they are published to (`EntityTable`; the agent, terminals/app.py, runs one of each).

- Each entry's events are applied to its `TerminalState` (once per input position, each label
  once per transaction, event time bounded by the table partition's `TerminalClock`,
  terminals/state.py), and the entries changed are written to the table (its
  changelog) when the agent says (terminals/table_writes.py).
- It publishes the terminal's features and daily buckets when a label is counted or a late
  transaction lands on a day a window reads now (the scorer reads the buckets as of each
  transaction's own day), other counts once the clock is six days past their day, a day
  before the first window reads them (`close_days`, `publication_due`): a tombstone when no
  window will read any count of it again, nothing for a terminal that never had any.
  Publications are coalesced (`publish_due`): a timer runs a round every
  FRAUD_FEATURES_PUBLISH_INTERVAL_MS, each entry changed since published once, as it is then,
  however many records changed it meanwhile. What a round published
  goes to the table with the entry's next write: faust writes a table only from the agent.
- Idle terminals (no window reads any of their days again, as of the partition's clock) are
  forgotten every FRAUD_FEATURES_EVICT_INTERVAL_S per table partition, while that partition's
  events are applied: deleted from the table (a changelog tombstone) and tombstoned in
  `terminal-risk`, so neither the table nor the scorers' copies grow without bound.

A card's entry is the same `TerminalState`, fed with its labels only: its buckets hold the
card's confirmed frauds by the transaction's day, each label counted once and corrections
taken back, its day is the newest report's, and the same publication, tombstone and eviction
rules apply (`EntityTable` runs both tables). The scorer counts a card's frauds on the fresh
windows (`scorer/card_frauds.py`), which read no delay.

After a crash or a rebalance, an entry due for publication when the replica stopped, or
published since its last write, differs from what its table value says was published: the next
owner publishes it in its first round (`_due_of`), again if need be (the record is the same). A
tombstone is decided on the same value: an entry whose publication was not yet written when its
replica stopped, and whose counts then all leave the windows, gets its tombstone when it is
forgotten as idle.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any, NamedTuple

import faust

from terminals.config import FeaturesSettings
from terminals.events import TRANSACTION, TerminalEvent, TransactionRun, partition_of
from terminals.metrics import WorkerMetrics
from terminals.publication import encode_publications
from terminals.state import COUNTED, DUPLICATE, STALE, TerminalState
from terminals.table_clock import NO_DAY, TerminalClock
from terminals.table_progress import TableClocks
from terminals.unpublished import Unpublished

log = logging.getLogger(__name__)

#: Entries of a table kept decoded (a few kB each): the active terminals of a large acquirer.
MAX_DECODED = 100_000
#: The metric's result of an event not applied: its entry's table value cannot be read (one
#: of a newer release's format, terminals/state.py), so the entry is left as it is.
UNREADABLE = "unreadable"


class Sent(NamedTuple):
    """A record a publication round sent: its entry and what completes on its acknowledgement."""

    partition: int
    key: str
    delivery: Awaitable[object]


class EntityTable:
    """One table of `TerminalState` entries (terminals, or cards) and the topic its records
    are published to: applies events, publishes, closes days and forgets idle entries."""

    def __init__(
        self,
        app: faust.App,
        table: Any,
        config: FeaturesSettings,
        metrics: WorkerMetrics,
        clocks: TableClocks,
        *,
        card: bool,
    ) -> None:
        self.table = table
        self._app = app
        self._config = config
        self._metrics = metrics
        self._clocks = clocks
        self._card = card
        self._topic = config.card_frauds_topic if card else config.terminal_risk_topic
        self._what = "card" if card else "terminal"
        #: Per table partition: when idle entries were last looked for.
        self._last_eviction: dict[int, float] = {}
        #: Per table partition: entry → its newest day, for the idle ones to be found without
        #: reading every entry: kept as events are applied, and filled once per assignment
        #: from the table with the entries not changed since (`_take_over`).
        self._newest_days: defaultdict[int, dict[str, int]] = defaultdict(dict)
        #: The table partitions whose entries were looked at since the last assignment.
        self._taken_over: set[int] = set()
        #: Per table partition: the entries with changes not published at once, each with the
        #: oldest day they counted on (published once due: the day close).
        self._unpublished: defaultdict[int, Unpublished] = defaultdict(Unpublished)
        #: Per table partition: the entries to publish in its next round (in order; after an
        #: assignment, every entry whose record is not the one last published).
        self._due: dict[int, dict[str, None]] = {}
        #: Entries read or written since the last assignment, decoded, most recently used last
        #: (at most MAX_DECODED, beside those in `_unwritten`): each is decoded once, not at
        #: every record and round. A round's publication marks the entry here (`published`);
        #: the table has it with the entry's next write (faust writes a table only from the
        #: agent, and a round runs beside it).
        self._decoded: dict[str, TerminalState] = {}
        #: Per table partition: the entries changed (counted, or published by a round) since
        #: their last write (`write`). Never dropped from `_decoded`: the table holds an older
        #: value of them.
        self._unwritten: defaultdict[int, set[str]] = defaultdict(set)
        #: Counts the assignments and revocations: a round stops when one comes while it waits
        #: on a send.
        self._generation = 0

    def reset(self) -> None:
        """After a revocation or an assignment: what another replica changed is read again
        from the table (and what a round published but the table does not say is published
        again in the first round: `_due_of`)."""
        self._newest_days.clear()
        self._taken_over.clear()
        self._unpublished.clear()
        self._due.clear()
        self._decoded.clear()
        self._unwritten.clear()
        self._generation += 1

    def apply(
        self,
        partition: int,
        pairs: list[tuple[str, TerminalEvent]],
        runs: Sequence[tuple[str, TransactionRun]] = (),
    ) -> None:
        """Apply one internal record's events and transaction runs of this table's entries, in
        the router's order (a run after the first `events_before` events of its terminal),
        against the partition's clock as it was before the record (its marks come after)."""
        by_key: dict[str, list[TerminalEvent | TransactionRun]] = {}
        for key, event in pairs:
            by_key.setdefault(key, []).append(event)
        if runs:
            _place_runs(by_key, runs)
        clock = self._clocks.of(partition)
        results: dict[tuple[str, str], int] = {}
        for key, events in by_key.items():
            self._update(partition, key, events, clock, results)
        for (source, result), count in results.items():
            self._metrics.event(source, result, card=self._card, count=count)

    def close_days(self, partition: int) -> None:
        """Once the partition's clock followed a record's marks: the entries with counts not
        published whose publication is due (`publication_due`) are due."""
        waiting = self._unpublished[partition]
        due = self._due_of(partition)
        for key in waiting.take_due(self._clocks.of(partition).watermark_day):
            due[key] = None

    def _load(self, key: str) -> TerminalState | None:
        """The entry, None when the table has none; ValueError (logged) when it cannot be
        read: the caller skips it."""
        decoded = self._decoded
        state = decoded.pop(key, None)
        if state is not None:
            decoded[key] = state  # the most recently used, last
            return state
        stored = self.table.get(key)
        if stored is None:
            return None
        try:
            state = TerminalState.from_bytes(stored)
        except ValueError as exc:
            log.error("skipping %s=%s: %s", self._what, key, exc)
            raise
        self._keep(key, state)
        return state

    def _keep(self, key: str, state: TerminalState) -> None:
        """Keep a decoded entry; past MAX_DECODED, the least recently used one that the table
        holds as it is is dropped (read again from the table when needed)."""
        decoded = self._decoded
        if len(decoded) >= MAX_DECODED:
            old = next((k for k in decoded if not self._is_unwritten(k)), None)
            if old is not None:
                del decoded[old]
        decoded[key] = state

    def _update(
        self,
        partition: int,
        key: str,
        events: list[TerminalEvent | TransactionRun],
        clock: TerminalClock,
        results: dict[tuple[str, str], int],
    ) -> None:
        try:
            state = self._load(key)
        except ValueError:  # logged; overwriting it would lose what a newer release counted
            for event in events:
                if isinstance(event, TransactionRun):
                    _add(results, TRANSACTION, UNREADABLE, len(event.offsets))
                else:
                    _add(results, event.source, UNREADABLE)
            return
        if state is None:
            state = TerminalState()
            self._keep(key, state)
        changed = publish = False
        oldest = NO_DAY  # the oldest day a change not published at once counted on
        for event in events:
            if isinstance(event, TransactionRun):
                run = state.apply_run(event, clock)
                _add(results, TRANSACTION, COUNTED, run.counted)
                _add(results, TRANSACTION, DUPLICATE, run.duplicate)
                _add(results, TRANSACTION, STALE, run.stale)
                if run.clamped:
                    self._metrics.future_event(run.clamped)
                changed |= run.changed
                publish |= run.publish
                if run.oldest_day != NO_DAY:
                    oldest = run.oldest_day if oldest == NO_DAY else min(oldest, run.oldest_day)
                continue
            applied = state.apply(event, clock)
            _add(results, event.source, applied.result)
            if applied.clamped:
                self._metrics.future_event()
            changed |= applied.changed
            publish |= applied.publish
            if applied.changed and applied.day != NO_DAY:
                oldest = applied.day if oldest == NO_DAY else min(oldest, applied.day)
        if not changed:
            return
        self._newest_days[partition][key] = state.newest_day
        self._unwritten[partition].add(key)
        waiting = self._unpublished[partition]
        if publish:
            self._due_of(partition)[key] = None
            waiting.discard(key)
        else:  # published once its oldest change is due (a day before a window reads it)
            waiting.note(key, state.as_of_day if oldest == NO_DAY else oldest)

    def write(self, partition: int) -> None:
        """Write the partition's entries changed since their last write to the table (its
        changelog): called from the agent, on a record of that partition (faust writes a
        table only there, to the record's partition of the changelog)."""
        for key in self._unwritten.pop(partition, ()):
            state = self._decoded.get(key)
            if state is not None:
                self.table[key] = state.to_bytes()

    def _is_unwritten(self, key: str) -> bool:
        partition = partition_of(key, self._config.table_partitions)
        return key in self._unwritten.get(partition, ())

    def _due_of(self, partition: int) -> dict[str, None]:
        self._take_over(partition)
        return self._due[partition]

    def _take_over(self, partition: int) -> None:
        """Once per table partition after an assignment, one pass over the entries the table
        holds of it (what another replica, or this one before a restart, left): each one whose
        record is not the one last published is due, and each one's newest day is known for
        the idle ones to be found. An entry changed since keeps what the change said (the
        table holds an older value of it)."""
        if partition in self._taken_over:
            return
        self._taken_over.add(partition)
        due = self._due.setdefault(partition, {})
        newest_days = self._newest_days[partition]
        for key, value in self.table.items():
            if partition_of(key, self._config.table_partitions) != partition:
                continue
            try:
                state = TerminalState.from_bytes(value)
            except ValueError:
                continue
            if state.unpublished():
                due.setdefault(key, None)
            newest_days.setdefault(key, state.newest_day)

    async def publish_due(self) -> list[Sent]:
        """One round (every FRAUD_FEATURES_PUBLISH_INTERVAL_MS): publish each due entry once,
        as it is now, however many records changed it since the last round. A partition's
        records are all taken and encoded before the first is sent (no event is applied in
        between, so each record is its entry as one moment saw it), its terminals' features in
        one call (`terminals/publication.py`). Returns what it sent, for `acknowledged`."""
        generation = self._generation
        sent: list[Sent] = []
        for partition, due in list(self._due.items()):
            if self._generation != generation:
                return sent  # partitions moved meanwhile: their new owner publishes them
            keys = list(due)
            due.clear()
            taken = []
            for key in keys:
                try:
                    state = self._load(key)
                except ValueError:
                    continue
                if state is None:  # forgotten meanwhile
                    continue
                publication = state.take_publication()
                if publication is not None:
                    self._unwritten[partition].add(key)
                    taken.append((key, publication))
            values = encode_publications(taken, card=self._card)
            for (key, _), value in zip(taken, values, strict=True):
                if self._generation != generation:
                    return sent  # their new owner publishes them (`_due_of`: not in its table)
                sent.append(Sent(partition, key, await self._send(key, value)))
        return sent

    async def acknowledged(self, sent: list[Sent]) -> bool:
        """Wait until the broker has acknowledged every record of a round (`publish_due`);
        False when one failed. A failed entry is due again (its next round sends it as it is
        then), unless its partition moved meanwhile (its new owner publishes it)."""
        generation = self._generation
        failed = 0
        for partition, key, delivery in sent:
            try:
                await delivery
            except Exception as exc:  # whatever the producer failed with, the entry is unpublished
                failed += 1
                if failed == 1:
                    log.error("publishing %s %r failed: %s; sending it again", self._what, key, exc)
                state = self._decoded.get(key) if self._generation == generation else None
                if state is not None:  # else forgotten, or its partition moved: not ours
                    state.publication_lost()
                    self._unwritten[partition].add(key)
                    self._due_of(partition)[key] = None
        if failed:
            log.error("%s %s publications of a round failed: due again", failed, self._what)
        return not failed

    async def _send(self, key: str, value: bytes | None) -> Awaitable[object]:
        """Through the producer itself, so records and tombstones keep their order (a topic's
        send would not take a None value); returns what completes on the broker's
        acknowledgement."""
        delivery = await self._app.producer.send(
            self._topic, key.encode(), value, partition=None, timestamp=None, headers=None
        )
        self._metrics.published(tombstone=value is None, card=self._card)
        return delivery

    async def evict_if_due(self, partition: int) -> None:
        """Forget the partition's idle entries, at most every `evict_interval_s`."""
        now = time.monotonic()
        if now - self._last_eviction.get(partition, 0.0) < self._config.evict_interval_s:
            return
        self._last_eviction[partition] = now
        self._take_over(partition)
        known = self._newest_days[partition]
        clock = self._clocks.of(partition)
        idle = [key for key, day in known.items() if clock.idle_since(day)]
        waiting = self._unpublished[partition]
        due = self._due.get(partition, {})
        unwritten = self._unwritten.get(partition, set())
        generation = self._generation
        for key in idle:
            if self._generation != generation:
                return  # partitions moved while it waited on a send: their new owner evicts
            del known[key]
            waiting.discard(key)
            due.pop(key, None)
            self._decoded.pop(key, None)
            held = key in unwritten  # perhaps not written yet, but published
            unwritten.discard(key)
            stored = key in self.table
            if stored:
                del self.table[key]
            if stored or held:
                await self._send(key, None)
        if idle:
            self._metrics.evicted(len(idle), card=self._card)
            log.info("forgot %s idle %ss of partition %s", len(idle), self._what, partition)


def _place_runs(
    events: dict[str, list[TerminalEvent | TransactionRun]],
    runs: Sequence[tuple[str, TransactionRun]],
) -> None:
    """Put each run among its entry's events, in the router's order: after the first
    `events_before` of them. The entries without runs are left as they are."""
    placed: dict[str, list[TerminalEvent | TransactionRun]] = {}
    taken: dict[str, int] = {}
    for key, run in runs:
        items = placed.get(key)
        if items is None:
            items = placed[key] = []
        done = taken.get(key, 0)
        if run.events_before > done:
            items.extend(events.get(key, [])[done : run.events_before])
            taken[key] = run.events_before
        items.append(run)
    for key, items in placed.items():
        own = events.get(key)
        if own is not None:
            items.extend(own[taken.get(key, 0) :])
        events[key] = items


def _add(results: dict[tuple[str, str], int], source: str, result: str, count: int = 1) -> None:
    """Count `count` events of `source` with `result` (the metric's labels)."""
    if count:
        results[(source, result)] = results.get((source, result), 0) + count
