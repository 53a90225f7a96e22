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
                     └─ labels ───► table "card-frauds" (key card_id, value TerminalState)
                                    └► changelog <app-id>-card-frauds-changelog (compacted)
                                                  ▼  when the card's frauds change
                                    card-frauds (compacted, key card_id; a tombstone once idle)
```

Both inputs are keyed by card, so they are re-keyed by terminal before they touch the table:
the router sends each record's `TerminalEvent` to its terminal's partition of one internal
topic, as faust's `Stream.group_by` would, one internal record per partition and routed batch
(faust's cost is per record). This module wires the table side:
- one agent applies each record's events to the terminals' and the cards' tables
  (terminals/entity_table.py), moves its table partition's clock with the marks the record
  carries: the minimum over the inputs of how far the router has read them
  (terminals/table_progress.py), and writes the entries changed to the tables (their
  changelogs) once an interval (terminals/table_writes.py);
- a timer runs the publication rounds (terminals/entity_table.py), then sends how far they
  reach to the progress topic (terminals/table_progress.py);
- a timer reports the agent's progress to the worker's health (`terminals/health.py`).

Guarantees: at least once, as faust gives it (terminals/table_writes.py); what a replica left
unpublished when it stopped, the next owner publishes (terminals/entity_table.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import faust
from faust.types import StreamT

from contracts.worker_progress import progress_topic_name
from terminals.config import FeaturesSettings
from terminals.entity_table import EntityTable
from terminals.events import decode_batch
from terminals.health import WorkerHealth
from terminals.kafka_auth import FaustKafkaAuth
from terminals.metrics import WorkerMetrics
from terminals.router import ROUTE_BATCH
from terminals.table_lag import EndOffsets, table_lag
from terminals.table_progress import NewestCounted, ProgressSender, TableClocks
from terminals.table_writes import TableWrites, bound_commits
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

    clocks = TableClocks(config)
    terminals = EntityTable(
        app,
        table(TABLE_NAME, "Per-terminal TerminalState (daily buckets, day, positions, labels)"),
        config,
        metrics,
        clocks,
        card=False,
    )
    cards = EntityTable(
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
    writes = TableWrites(config.write_interval_ms / 1000)
    guarded = False
    counted = NewestCounted(metrics)
    progress = ProgressSender(app, progress_topic_name(config.terminal_risk_topic), config)
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
            except ValueError as exc:  # not written by this worker, or by a newer release
                log.error(
                    "skipping an internal record (partition=%s offset=%s): %s",
                    partition,
                    offset,
                    exc,
                )
            else:
                has_events = bool(batch.events or batch.cards or batch.runs)
                terminals.apply(partition, batch.events, batch.runs)
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
        sent_terminals = await terminals.publish_due()
        sent_cards = await cards.publish_due()
        # The progress says the round's records are there to read: only once they are (a
        # scorer that trusts it never reads counts older than it says).
        delivered = await terminals.acknowledged(sent_terminals)
        delivered &= await cards.acknowledged(sent_cards)
        if delivered and writes.generation == generation:  # else the round stopped or failed
            await progress.send(reached)
        metrics.stage_cpu("publish", time.thread_time() - started)

    app.timer(config.publish_interval_ms / 1000)(publish_due)
    app.timer(GAUGE_INTERVAL_S)(count_entries)
    app.timer(HEALTH_INTERVAL_S)(report_progress)
    return app
