"""The faust app of `fraud-features`: re-keyed terminal events in, per-terminal risk out.

```
transactions, labels (key card_id) ─► Router (terminals/router.py, librdkafka) ─┐
                                                                                ▼
               <app-id>-terminal-events (internal, FRAUD_FEATURES_TABLE_PARTITIONS partitions)
                                                  ▼
               update_terminals ──► table "terminal-state" (key terminal_id, value TerminalState)
                                    └► changelog <app-id>-terminal-state-changelog (compacted)
                                                  ▼  when the terminal's buckets change
               terminal-risk (compacted, key terminal_id; a tombstone once neutral or idle)
```

Both inputs are keyed by card, so they are re-keyed by terminal before they touch the table:
the router sends each record's `TerminalEvent` to its terminal's partition of one internal
topic, as faust's `Stream.group_by` would, one internal record per partition and routed batch
(faust's cost is per record). This module owns the table side:
- one agent applies each terminal's events to its `TerminalState` (once per input position,
  each label once per transaction, event time bounded by `TerminalClock`), writes the entry to
  the table (its changelog) and publishes the terminal's features and daily buckets when its
  day advances or a label is counted (the scorer reads the buckets as of each transaction's
  own day), the rest of a day's counts once the clock has passed the day (`_close_days`): a
  tombstone when no window will read any count of it again, nothing for a terminal that never
  had any;
- idle terminals (no window reads any of their days again, as of the worker's newest day) are
  forgotten every FRAUD_FEATURES_EVICT_INTERVAL_S per table partition, while that partition's
  events are applied: deleted from the table (a changelog tombstone) and tombstoned in
  `terminal-risk`, so neither the table nor the scorers' copies grow without bound;
- a timer reports the agent's progress to the worker's health (`terminals/health.py`).

Guarantees: at least once, as faust gives it. Faust flushes what the agent sent (changelog
writes, published risk) before it commits the internal topic's offsets; after a crash the events
since the last commit are applied again, and the table skips those it counted already.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import faust
import numpy as np
import numpy.typing as npt
from faust.types import StreamT

from contracts.terminal_risk import encode_terminal_risk
from terminals.config import WorkerConfig
from terminals.events import TerminalEvent, decode_batch, partition_of
from terminals.health import WorkerHealth
from terminals.kafka_auth import FaustKafkaAuth
from terminals.metrics import WorkerMetrics
from terminals.state import TerminalClock, TerminalState
from terminals.topics import TABLE_NAME, events_topic_name

log = logging.getLogger(__name__)

#: faust's default; a third of the session timeout at most, as Kafka advises.
HEARTBEAT_INTERVAL_S = 3.0
#: How long the producer waits to fill a batch (faust's default is 0: one request per record).
PRODUCER_LINGER_S = 0.02
#: How often the terminals gauge is refreshed.
GAUGE_INTERVAL_S = 10.0
#: How often the agent's progress and the event loop are reported to the worker's health.
HEALTH_INTERVAL_S = 1.0


def build_app(
    config: WorkerConfig,
    auth: FaustKafkaAuth,
    metrics: WorkerMetrics,
    health: WorkerHealth,
    clock: TerminalClock,
) -> faust.App:
    """The faust app with its topics, table and agent, not started."""
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
    table = app.Table(
        TABLE_NAME,
        partitions=config.table_partitions,
        key_type=str,
        value_type=bytes,
        help="Per-terminal TerminalState (daily buckets, current day, input positions, labels)",
    )
    #: Per table partition: the next internal offset to apply, and when idle terminals were
    #: last looked for.
    applied: dict[int, int] = {}
    last_eviction: dict[int, float] = {}
    #: Per table partition: terminal → its newest day, for the idle ones to be found without
    #: reading every entry (filled from the table once per assignment, then kept).
    newest_days: dict[int, dict[str, int]] = {}
    #: Per table partition: terminal → its day, for those with counts not published yet (the
    #: rest of their day's transactions): published once the clock has passed that day.
    unpublished: dict[int, dict[str, int]] = {}
    progressed = False

    @app.agent(terminal_events, name="update_terminals")
    async def update_terminals(stream: StreamT[bytes]) -> None:
        """Count each terminal's events in the table (one changelog write per terminal and
        record); publish the terminal's risk when its features change."""
        nonlocal progressed
        async for event in stream.events():
            partition, offset = event.message.partition, event.message.offset
            try:
                batch = decode_batch(event.message.value)
            except ValueError as exc:  # not written by this worker: nothing to count
                log.error("skipping an internal record: %s", exc)
                batch = []
            by_terminal: dict[str, list[TerminalEvent]] = {}
            for terminal_id, terminal_event in batch:
                by_terminal.setdefault(terminal_id, []).append(terminal_event)
            for terminal_id, events in by_terminal.items():
                await _update(partition, terminal_id, events)
            await _close_days(partition)
            await _evict_if_due(partition)
            applied[partition] = offset + 1
            progressed = True

    async def _update(partition: int, terminal_id: str, events: list[TerminalEvent]) -> None:
        stored = table.get(terminal_id)
        try:
            state = TerminalState() if stored is None else TerminalState.from_bytes(stored)
        except ValueError as exc:
            log.error("skipping terminal=%s: %s", terminal_id, exc)
            return
        changed = publish = False
        for terminal_event in events:
            applied_ = state.apply(terminal_event, clock)
            metrics.event(terminal_event.source, applied_.result)
            if applied_.clamped:
                metrics.future_event()
            changed |= applied_.changed
            publish |= applied_.publish
        if not changed:
            return
        newest_days.setdefault(partition, {})[terminal_id] = state.newest_day
        publish, features = state.to_publish() if publish else (False, None)
        table[terminal_id] = state.to_bytes()
        waiting = unpublished.get(partition)
        if waiting is None:
            waiting = unpublished[partition] = _unpublished(partition)
        if state.unpublished():
            waiting[terminal_id] = state.as_of_day
        else:
            waiting.pop(terminal_id, None)
        if publish:
            await _publish_state(terminal_id, state, features)

    async def _close_days(partition: int) -> None:
        """Publish the terminals whose day the clock has passed with counts not published."""
        waiting = unpublished.get(partition)
        if waiting is None:
            waiting = unpublished[partition] = _unpublished(partition)
        if not waiting:
            return
        closed = [t for t, day in waiting.items() if day < clock.watermark_day]
        for terminal_id in closed:
            del waiting[terminal_id]
            stored = table.get(terminal_id)
            if stored is None:
                continue
            try:
                state = TerminalState.from_bytes(stored)
            except ValueError as exc:
                log.error("skipping terminal=%s: %s", terminal_id, exc)
                continue
            publish, features = state.to_publish()
            if publish:
                table[terminal_id] = state.to_bytes()
                await _publish_state(terminal_id, state, features)

    async def _publish_state(
        terminal_id: str, state: TerminalState, features: npt.NDArray[np.float32] | None
    ) -> None:
        """The terminal's record (its features and buckets), or its tombstone (None)."""
        value = (
            None
            if features is None
            else encode_terminal_risk(terminal_id, state.as_of_day, features, state.risk.buckets())
        )
        await _publish(terminal_id, value)

    async def _publish(terminal_id: str, value: bytes | None) -> None:
        """The terminal's risk record, or its tombstone (None): through the producer itself,
        so both keep their order (a topic's send would not take a None value)."""
        await app.producer.send(
            config.terminal_risk_topic,
            terminal_id.encode(),
            value,
            partition=None,
            timestamp=None,
            headers=None,
        )
        metrics.published(tombstone=value is None)

    async def _evict_if_due(partition: int) -> None:
        """Forget the partition's idle terminals, at most every `evict_interval_s`."""
        now = time.monotonic()
        if now - last_eviction.get(partition, 0.0) < config.evict_interval_s:
            return
        last_eviction[partition] = now
        known = newest_days.get(partition)
        if known is None:
            known = newest_days[partition] = _newest_days(partition)
        idle = [t for t, day in known.items() if clock.idle_since(day)]
        for terminal_id in idle:
            del known[terminal_id]
            if terminal_id in table:
                del table[terminal_id]
                await _publish(terminal_id, None)
        if idle:
            metrics.evicted(len(idle))
            log.info("forgot %s idle terminals of partition %s", len(idle), partition)

    def _unpublished(partition: int) -> dict[str, int]:
        """Each terminal of the partition whose counts are not all published, with its day
        (after an assignment: what another replica, or this one before a restart, left)."""
        waiting = {}
        for terminal_id, value in table.items():
            if partition_of(terminal_id, config.table_partitions) != partition:
                continue
            try:
                state = TerminalState.from_bytes(value)
            except ValueError:
                continue
            if state.unpublished():
                waiting[terminal_id] = state.as_of_day
        return waiting

    def _newest_days(partition: int) -> dict[str, int]:
        """Each terminal of the partition held in the table, with its newest day."""
        days = {}
        for terminal_id, value in table.items():
            if partition_of(terminal_id, config.table_partitions) != partition:
                continue
            try:
                days[terminal_id] = TerminalState.from_bytes(value).newest_day
            except ValueError:
                continue
        return days

    @app.on_partitions_assigned.connect
    def _assigned(_sender: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
        # What another replica changed meanwhile is read again from the table.
        newest_days.clear()
        unpublished.clear()
        applied.clear()

    async def count_terminals() -> None:
        metrics.terminals(len(table))

    async def report_progress() -> None:
        nonlocal progressed
        health.loop_beat()
        recovery = cast(Any, app.tables).recovery  # TableManagerT does not declare it
        health.recovered(recovery.completed.is_set() and not app.rebalancing)
        waiting = False
        for tp in app.assignor.assigned_actives():
            if tp.topic != events_topic or tp.partition not in applied:
                continue
            high = app.consumer.highwater(tp)
            waiting |= high is not None and high > applied[tp.partition]
        health.agent_progress(waiting, progressed)
        metrics.stalled(health.stalled)
        progressed = False

    app.timer(GAUGE_INTERVAL_S)(count_terminals)
    app.timer(HEALTH_INTERVAL_S)(report_progress)
    return app
