"""The faust app of `fraud-features`: re-keyed terminal and card events in, per-terminal risk
and per-card confirmed frauds out.

```
transactions, labels (key card_id) ─► Router (terminals/router.py, librdkafka) ─┐
                                                                                ▼
               <app-id>-terminal-events (internal, FRAUD_FEATURES_TABLE_PARTITIONS partitions)
                                                  ▼
               update_terminals ──► table "terminal-state" (key terminal_id, value TerminalState)
                     │              └► changelog <app-id>-terminal-state-changelog (compacted)
                     │                            ▼  when the terminal's buckets change
                     │              terminal-risk (compacted, key terminal_id; a tombstone once
                     │                             neutral or idle)
                     └─ labels ───► table "card-state" (key card_id, value TerminalState)
                                    └► changelog <app-id>-card-state-changelog (compacted)
                                                  ▼  when the card's frauds change
                                    card-frauds (compacted, key card_id; a tombstone once idle)
```

Both inputs are keyed by card, so they are re-keyed by terminal before they touch the table:
the router sends each record's `TerminalEvent` to its terminal's partition of one internal
topic, as faust's `Stream.group_by` would, one internal record per partition and routed batch
(faust's cost is per record). This module owns the table side:
- one agent applies each terminal's events to its `TerminalState` (once per input position,
  each label once per transaction, event time bounded by the table partition's `TerminalClock`,
  which then follows the marks the record carries: the minimum over the inputs of how far the
  router has read them) and writes the entries changed to the table (its changelog) once an
  interval;
- it publishes the terminal's features and daily buckets when a label is counted or a late
  transaction lands on a day a window reads now (the scorer reads the buckets as of each
  transaction's own day), other counts once the clock is six days past their day, a day
  before the first window reads them (`close_days`, `publication_due`): a tombstone when no
  window will read any count of it again, nothing for a terminal that never had any.
  Publications are coalesced (`publish_due`): a timer runs a round every
  FRAUD_FEATURES_PUBLISH_INTERVAL_MS, each entry changed since published once, as it is then,
  however many records changed it meanwhile. What a round published
  goes to the table with the entry's next write: faust writes a table only from the agent;
- each table partition has a clock of its own, moved only by the marks of its records: faust
  reads the internal partitions at their own speeds, so one partition's progress must not make
  another's events stale;
- idle terminals (no window reads any of their days again, as of the partition's clock) are
  forgotten every FRAUD_FEATURES_EVICT_INTERVAL_S per table partition, while that partition's
  events are applied: deleted from the table (a changelog tombstone) and tombstoned in
  `terminal-risk`, so neither the table nor the scorers' copies grow without bound;
- a timer reports the agent's progress to the worker's health (`terminals/health.py`).

A card's entry is the same `TerminalState`, fed with its labels only: its buckets hold the
card's confirmed frauds by the transaction's day, each label counted once and corrections
taken back, its day is the newest report's, and the same publication, tombstone and eviction
rules apply (`_EntityTable` runs both tables). The scorer counts a card's frauds on the fresh
windows (`scorer/card_frauds.py`), which read no delay.

Guarantees: at least once, as faust gives it. The agent writes the entries a partition's records
changed once every FRAUD_FEATURES_WRITE_INTERVAL_MS, and acknowledges those records only then
(`_Writes`); faust flushes what the agent sent (changelog writes, published risk) before it
commits the internal topic's acknowledged offsets. After a crash or a rebalance the records since
the last commit are applied again, and the table skips the events it counted already. An entry
due for publication when the replica stopped, or published since its last write, differs from
what its table value says was published: the next owner publishes it in its first round
(`_due_of`), again if need be (the record is the same). A tombstone is decided on the same
value: an entry whose publication was not yet written when its replica stopped, and whose counts
then all leave the windows, gets its tombstone when it is forgotten as idle.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, cast

import faust
from faust.types import StreamT

from contracts.worker_progress import WorkerProgress, encode_progress, progress_topic_name
from terminals.config import FeaturesSettings
from terminals.events import InputMarks, TerminalEvent, decode_batch, partition_of
from terminals.health import WorkerHealth
from terminals.kafka_auth import FaustKafkaAuth
from terminals.metrics import WorkerMetrics
from terminals.publication import encode_publications
from terminals.router import ROUTE_BATCH, newest_transaction_time
from terminals.state import NO_DAY, TerminalClock, TerminalState, Unpublished
from terminals.table_lag import EndOffsets, table_lag
from terminals.topics import CARD_TABLE_NAME, TABLE_NAME, events_topic_name

log = logging.getLogger(__name__)

#: faust's default; a third of the session timeout at most, as Kafka advises.
HEARTBEAT_INTERVAL_S = 3.0
#: How long the producer waits to fill a batch (faust's default is 0: one request per record).
PRODUCER_LINGER_S = 0.02
#: How often the terminals gauge is refreshed.
GAUGE_INTERVAL_S = 10.0
#: How often the agent's progress and the event loop are reported to the worker's health.
HEALTH_INTERVAL_S = 1.0
#: Entries of a table kept decoded (a few kB each): the active terminals of a large acquirer.
MAX_DECODED = 100_000
#: `_Writes.commit_bound` of a partition that may commit nothing yet.
NO_COMMIT = -1
#: Internal records held, per table partition, until its entries are written: a catch-up
#: reads them faster than an interval passes, and each holds its value (up to 1,000 events).
MAX_HELD = 1_000


def build_app(
    config: FeaturesSettings,
    auth: FaustKafkaAuth,
    metrics: WorkerMetrics,
    health: WorkerHealth,
) -> faust.App:
    """The faust app with its topics, tables and agent, not started."""
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{server.strip()}" for server in config.bootstrap_servers.split(",")],
        broker_credentials=auth.credentials,
        store=config.store,
        datadir=config.data_dir,
        topic_partitions=config.table_partitions,
        topic_replication_factor=config.internal_replication_factor,
        consumer_auto_offset_reset=config.auto_offset_reset,
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=min(HEARTBEAT_INTERVAL_S, config.session_timeout_s / 3),
        # Nothing here waits on a single record: batch the many small sends (changelog, risk)
        # into fewer produce requests.
        producer_linger=PRODUCER_LINGER_S,
        # The agent acknowledges a record only once the entries it changed are written
        # (`write_due`): at a rebalance or a stop, faust must not wait for the records it holds
        # (they would never be acknowledged), it commits up to them and their next reader
        # applies them again, each input position counted once.
        stream_wait_empty=False,
        key_serializer="raw",
        value_serializer="raw",
        # No faust web server (the worker's health server serves /metrics, /healthz, /readyz)
        # and no leader-election topic.
        web_enabled=False,
        topic_disable_leader=True,
    )
    serializers = {"key_serializer": "raw", "value_serializer": "raw"}
    keyed: dict[str, Any] = {"key_type": str, "value_type": bytes, **serializers}
    events_topic = events_topic_name(config.app_id)
    terminal_events = app.topic(
        events_topic, internal=True, partitions=config.table_partitions, **keyed
    )

    def table(name: str, help_: str) -> Any:
        return app.Table(
            name, partitions=config.table_partitions, key_type=str, value_type=bytes, help=help_
        )

    clocks = _Clocks(config)
    terminals = _EntityTable(
        app,
        table(TABLE_NAME, "Per-terminal TerminalState (daily buckets, day, positions, labels)"),
        config,
        metrics,
        clocks,
        card=False,
    )
    cards = _EntityTable(
        app,
        table(CARD_TABLE_NAME, "Per-card TerminalState fed with labels only (frauds by day)"),
        config,
        metrics,
        clocks,
        card=True,
    )
    #: Per table partition: the next internal offset to apply.
    applied: dict[int, int] = {}
    progressed = False
    writes = _Writes(config.write_interval_ms / 1000)
    guarded = False
    counted = _NewestCounted(metrics)
    progress = _Progress(app, progress_topic_name(config.terminal_risk_topic), config)
    end_offsets = EndOffsets(app)

    @app.agent(terminal_events, name="update_terminals")
    async def update_terminals(stream: StreamT[bytes]) -> None:
        """Count each terminal's events, and each card's labels; write the entries changed to
        their tables once an interval per partition, then acknowledge the records applied
        since (faust commits what is acknowledged); publish what changed, at most once a
        round."""
        nonlocal progressed
        # StreamT does not declare noack: records are acknowledged by `writes`.
        async for event in cast(Any, stream).noack().events():
            started = time.thread_time()
            generation = writes.generation
            partition, offset = event.message.partition, event.message.offset
            has_events = False
            try:
                batch = decode_batch(event.message.value)
            except ValueError as exc:  # not written by this worker: nothing to count
                log.error("skipping an internal record: %s", exc)
            else:
                has_events = bool(batch.events or batch.cards)
                terminals.apply(partition, batch.events)
                cards.apply(partition, batch.cards)
                if batch.marks is not None:
                    clocks.of(partition).follow(batch.marks)
                    counted.follow(batch.marks)
                terminals.close_days(partition)
                cards.close_days(partition)
                await terminals.evict_if_due(partition)
                if writes.generation == generation:
                    await cards.evict_if_due(partition)
            metrics.stage_cpu("apply", time.thread_time() - started)
            if writes.generation != generation:
                continue  # partitions moved while it waited on a send: read again
            applied[partition] = offset + 1
            progressed = True
            if writes.hold(partition, event, events=has_events):
                started = time.thread_time()
                terminals.write(partition)
                cards.write(partition)
                writes.acknowledge(partition)
                metrics.stage_cpu("write", time.thread_time() - started)

    @app.on_partitions_revoked.connect
    @app.on_partitions_assigned.connect
    def _moved(_sender: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        nonlocal guarded
        if not guarded:  # the consumer exists once partitions move
            bound_commits(app.consumer, events_topic, writes)
            guarded = True
        # What another replica changed meanwhile is read again from the tables; the clocks
        # follow the marks of the records read from the committed offsets on. The records
        # applied but not written are read again from there too.
        terminals.reset()
        cards.reset()
        clocks.reset()
        applied.clear()
        writes.reset()

    async def count_entries() -> None:
        metrics.terminals(len(terminals.table))
        metrics.cards(len(cards.table))

    async def report_progress() -> None:
        nonlocal progressed
        health.loop_beat()
        recovery = cast(Any, app.tables).recovery  # TableManagerT does not declare it
        health.recovered(recovery.completed.is_set() and not app.rebalancing)
        owned = [tp for tp in app.assignor.assigned_actives() if tp.topic == events_topic]
        ends, applied_then = end_offsets.latest(owned, applied)
        behind = table_lag({tp.partition: ends.get(tp) for tp in owned}, applied_then)
        # Only partitions it has applied records of: one recovering its table waits rightly.
        waiting = any(
            high is not None and tp.partition in applied_then and high > applied_then[tp.partition]
            for tp, high in ends.items()
        )
        health.agent_progress(waiting, progressed)
        if behind is not None:
            metrics.internal_lag(behind)
        health.table_lag(None if behind is None else behind * ROUTE_BATCH)
        metrics.stalled(health.stalled)
        progressed = False

    async def publish_due() -> None:
        started = time.thread_time()
        generation = writes.generation
        reached = clocks.reached()  # before the round: what it publishes covers it
        await terminals.publish_due()
        await cards.publish_due()
        if writes.generation == generation:  # else partitions moved: the round stopped
            await progress.send(reached)
        metrics.stage_cpu("publish", time.thread_time() - started)

    app.timer(config.publish_interval_ms / 1000)(publish_due)
    app.timer(GAUGE_INTERVAL_S)(count_entries)
    app.timer(HEALTH_INTERVAL_S)(report_progress)
    return app


class _Writes:
    """Per table partition, the internal records applied since its entries were last written:
    acknowledged only once they are (faust then commits them), so that what the changelog
    lacks is always past the committed offset. One write an interval per entry, however many
    records changed it meanwhile: during a catch-up, or when a terminal sees several
    transactions an interval, that is most of the table's cost saved."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._held: dict[int, list[Any]] = {}
        self._since: dict[int, float] = {}
        #: Partitions whose applied records a rebalance dropped before they were written: read
        #: again from the committed offset, none of theirs may be committed until written.
        self._dropped: set[int] = set()
        #: Counts the revocations and assignments (`reset`).
        self.generation = 0

    def hold(self, partition: int, event: Any, *, events: bool = True) -> bool:
        """Hold an applied record; True when the partition's entries are due to be written:
        its oldest record held is an interval old, or it holds MAX_HELD records. A record
        without events (the router's marks alone, or one it could not read) changed no entry:
        with nothing held before it, it is acknowledged at once, so an idle partition's commit
        reaches its end instead of staying a record behind."""
        if not events and not self._held.get(partition):
            event.ack()
            return False
        held = self._held.setdefault(partition, [])
        held.append(event)
        now = self._clock()
        due = now - self._since.setdefault(partition, now) >= self._interval_s
        return due or len(held) >= MAX_HELD

    def acknowledge(self, partition: int) -> None:
        """The partition's entries are written: its records held are done."""
        for event in self._held.pop(partition, ()):
            event.ack()
        self._since.pop(partition, None)
        self._dropped.discard(partition)

    def commit_bound(self, partition: int) -> int | None:
        """The highest offset faust may commit for the partition (the next one it would read):
        that of its oldest record held, not written yet; NO_COMMIT while records a rebalance
        dropped unwritten wait to be read again; None: no bound."""
        held = self._held.get(partition)
        if held:
            return int(held[0].message.offset)
        return NO_COMMIT if partition in self._dropped else None

    def reset(self) -> None:
        """After a revocation or an assignment: the records held are read again from the
        committed offsets (never acknowledged, they were not committed)."""
        self._dropped.update(partition for partition, held in self._held.items() if held)
        self._held.clear()
        self._since.clear()
        self.generation += 1


def bound_commits(consumer: Any, topic: str, writes: _Writes) -> None:
    """Cap every commit faust makes of `topic` at `writes.commit_bound`.

    Faust commits the longest run of acknowledged offsets from the committed one. Besides the
    agent's acknowledgements, it acknowledges by itself a record it skips during a rebalance (one
    the agent had not started), and that run check lets one such record through when the
    committed offset is 0 or unknown, or one offset past it: a commit could then pass records
    the agent holds unwritten, which the rebalance then drops. This wraps faust's
    `Consumer._new_offset` (no public hook), and refuses to start on a faust without it."""
    original = getattr(consumer, "_new_offset", None)
    if not callable(original):
        raise RuntimeError(
            "this faust-streaming's Consumer has no _new_offset: the features worker cannot "
            "bound its commits; install the version pinned in pyproject.toml"
        )

    def bounded(tp: Any) -> int | None:
        bound = writes.commit_bound(tp.partition) if tp.topic == topic else None
        if bound == NO_COMMIT:
            return None
        offset: int | None = original(tp)
        if offset is None or bound is None:
            return offset
        return min(offset, bound)

    consumer._new_offset = bounded


class _NewestCounted:
    """The newest transaction time the table has counted: that of the marks of the records it
    applied (the router's reading up to then, every transaction before it routed first)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._newest_ms = -1

    def follow(self, marks: InputMarks) -> None:
        newest = newest_transaction_time(marks)
        if newest > self._newest_ms:
            self._newest_ms = newest
            self._metrics.counted_event_time(newest)


class _Clocks:
    """The clock of each table partition (terminals/state.py), shared by its two tables."""

    def __init__(self, config: FeaturesSettings) -> None:
        self._config = config
        self._clocks: dict[int, TerminalClock] = {}

    def of(self, partition: int) -> TerminalClock:
        clock = self._clocks.get(partition)
        if clock is None:
            clock = self._clocks[partition] = self._config.clock
        return clock

    def reset(self) -> None:
        """After an assignment: each clock starts again from the marks it reads."""
        self._clocks.clear()

    def reached(self) -> dict[int, int]:
        """Per table partition owned, its watermark (epoch ms), once it has one."""
        return {p: c.watermark_ms for p, c in self._clocks.items() if c.watermark_ms >= 0}


class _Progress:
    """Sends, after each publication round, how far each table partition's published state
    reaches (its clock's watermark before the round) to the progress topic
    (contracts/worker_progress.py): the scorer's `fraud_terminal_risk_state_age_seconds`.
    Only what moved forward is sent: a new owner starts again from its committed offset, and
    what the partition published before stays published."""

    def __init__(self, app: faust.App, topic: str, config: FeaturesSettings) -> None:
        self._app = app
        self._topic = topic
        self._partitions = config.table_partitions
        self._sent: dict[int, int] = {}

    async def send(self, reached: dict[int, int]) -> None:
        for partition, counted_to in reached.items():
            if counted_to <= self._sent.get(partition, -1):
                continue
            key, value = encode_progress(WorkerProgress(partition, self._partitions, counted_to))
            await self._app.producer.send(
                self._topic, key, value, partition=None, timestamp=None, headers=None
            )
            self._sent[partition] = counted_to


class _EntityTable:
    """One table of `TerminalState` entries (terminals, or cards) and the topic its records
    are published to: applies events, publishes, closes days and forgets idle entries."""

    def __init__(
        self,
        app: faust.App,
        table: Any,
        config: FeaturesSettings,
        metrics: WorkerMetrics,
        clocks: _Clocks,
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

    def apply(self, partition: int, pairs: list[tuple[str, TerminalEvent]]) -> None:
        """Apply one internal record's events of this table's entries, in their order, against
        the partition's clock as it was before the record (its marks come after them)."""
        by_key: dict[str, list[TerminalEvent]] = {}
        for key, event in pairs:
            by_key.setdefault(key, []).append(event)
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
        events: list[TerminalEvent],
        clock: TerminalClock,
        results: dict[tuple[str, str], int],
    ) -> None:
        try:
            state = self._load(key)
        except ValueError:
            return
        if state is None:
            state = TerminalState()
            self._keep(key, state)
        changed = publish = False
        oldest = NO_DAY  # the oldest day a change not published at once counted on
        for event in events:
            applied = state.apply(event, clock)
            counted = (event.source, applied.result)
            results[counted] = results.get(counted, 0) + 1
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

    async def publish_due(self) -> None:
        """One round (every FRAUD_FEATURES_PUBLISH_INTERVAL_MS): publish each due entry once,
        as it is now, however many records changed it since the last round. A partition's
        records are all taken and encoded before the first is sent (no event is applied in
        between, so each record is its entry as one moment saw it), its terminals' features in
        one call (`terminals/publication.py`)."""
        generation = self._generation
        for partition, due in list(self._due.items()):
            if self._generation != generation:
                return  # partitions moved meanwhile: their new owner publishes them
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
                    return  # their new owner publishes them (`_due_of`: not in its table)
                await self._send(key, value)

    async def _send(self, key: str, value: bytes | None) -> None:
        """Through the producer itself, so records and tombstones keep their order (a topic's
        send would not take a None value)."""
        await self._app.producer.send(
            self._topic, key.encode(), value, partition=None, timestamp=None, headers=None
        )
        self._metrics.published(tombstone=value is None, card=self._card)

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
