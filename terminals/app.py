"""The faust app of `fraud-features`: labels and transactions in, per-terminal risk out.

```
transactions (key card_id) ─► route_transactions ─┐  decode + validate; no terminal: skipped
labels (key card_id) ──────► route_labels ────────┤  invalid: dead letter (decode / validate)
                                                  ▼  re-keyed by terminal_id
               <app-id>-terminal-events (internal, FRAUD_FEATURES_TABLE_PARTITIONS partitions)
                                                  ▼
               update_terminals ──► table "terminal-state" (key terminal_id, value TerminalState)
                                    └► changelog <app-id>-terminal-state-changelog (compacted)
                                                  ▼  when the terminal's risk changes or its day
               terminal-risk (compacted, key terminal_id)                            advances
```

Both inputs are keyed by card, so they are re-keyed by terminal before they touch the table: the
routing agents send each record's `TerminalEvent` to one internal topic keyed by terminal id, as
faust's `Stream.group_by` would (it forwards to a `-repartition` topic the same way). One topic
for both inputs, rather than two `group_by` repartition topics, lets a single agent own the table,
carries the decoded event (decoded once) and the record's input position (for counting it once,
terminals/state.py), where `group_by` can only forward the original bytes and headers.

Guarantees: at least once, as faust gives it. Faust flushes what the agents sent (re-keyed events,
changelog writes, published risk, dead letters) before it commits the input offsets; after a
crash the records since the last commit are routed again, and the table skips those it counted
already. A dead letter is awaited until the broker has it before its label is acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import faust
from faust.types import EventT, StreamT
from faust.types.tuples import Message

from contracts.dead_letter import SourceRecord, dead_letter_headers
from contracts.errors import RecordError
from scorer.terminal_risk import encode_terminal_risk
from terminals.config import WorkerConfig
from terminals.events import decode_event, route_label, route_transaction
from terminals.kafka_auth import FaustKafkaAuth
from terminals.metrics import WorkerMetrics
from terminals.state import TerminalState
from terminals.topics import TABLE_NAME, events_topic_name

log = logging.getLogger(__name__)

#: faust's default; a third of the session timeout at most, as Kafka advises.
HEARTBEAT_INTERVAL_S = 3.0
#: How often the terminals gauge is refreshed.
GAUGE_INTERVAL_S = 10.0


def build_app(config: WorkerConfig, auth: FaustKafkaAuth, metrics: WorkerMetrics) -> faust.App:
    """The faust app with its topics, table and agents, not started."""
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
        key_serializer="raw",
        value_serializer="raw",
        # No faust web server (metrics have their own) and no leader-election topic.
        web_enabled=False,
        topic_disable_leader=True,
    )
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    transactions = app.topic(config.input_topic, **raw)
    labels = app.topic(config.labels_topic, **raw)
    dead_letters = app.topic(config.dlq_topic, **raw)
    keyed: dict[str, Any] = {"key_type": str, "value_serializer": "raw"}
    terminal_events = app.topic(
        events_topic_name(config.app_id), internal=True, partitions=config.table_partitions, **keyed
    )
    terminal_risk = app.topic(config.terminal_risk_topic, **keyed)
    table = app.Table(
        TABLE_NAME,
        partitions=config.table_partitions,
        key_type=str,
        value_type=bytes,
        help="Per-terminal TerminalState (daily buckets, current day, input positions)",
    )
    day_ms = config.day_ms

    @app.agent(transactions, name="route_transactions")
    async def route_transactions(stream: StreamT[bytes]) -> None:
        """Re-key each transaction to its terminal; skip those without one or invalid."""
        async for event in stream.events():
            message = event.message
            try:
                routed = route_transaction(message.value, message.partition, message.offset)
            except RecordError:
                metrics.transaction("invalid")  # the scorer dead-letters it
                continue
            if routed is None:
                metrics.transaction("no_terminal")
                continue
            await terminal_events.send(key=routed.terminal_id, value=routed.event)
            metrics.transaction("routed")

    @app.agent(labels, name="route_labels")
    async def route_labels(stream: StreamT[bytes]) -> None:
        """Re-key each label to its terminal; dead-letter invalid ones."""
        async for event in stream.events():
            message = event.message
            try:
                routed = route_label(message.value, message.partition, message.offset)
            except RecordError as exc:
                await _dead_letter(event, exc)
                continue
            if routed is None:
                metrics.label("no_terminal")
                continue
            await terminal_events.send(key=routed.terminal_id, value=routed.event)
            metrics.label("fraud" if routed.fraud else "legit")

    async def _dead_letter(event: EventT[bytes], error: RecordError) -> None:
        source = _source_of(event.message)
        headers = dead_letter_headers(
            source,
            error,
            reason=error.reason,
            attempts=1,
            service=config.service,
            failed_at_ms=time.time_ns() // 1_000_000,
        )
        delivered = await dead_letters.send(key=source.key, value=source.value, headers=headers)
        await delivered  # durable before the label's offset can be committed
        metrics.label("dead_lettered")
        log.warning(
            "label dead-lettered reason=%s topic=%s partition=%s offset=%s: %s",
            error.reason,
            source.topic,
            source.partition,
            source.offset,
            error,
        )

    @app.agent(terminal_events, name="update_terminals")
    async def update_terminals(stream: StreamT[bytes]) -> None:
        """Count each terminal event in the table; publish the terminal's risk on a change."""
        async for event in stream.events():
            terminal_id = event.key
            try:
                terminal_event = decode_event(event.message.value)
                stored = table.get(terminal_id)
                state = TerminalState() if stored is None else TerminalState.from_bytes(stored)
            except ValueError as exc:  # not written by this worker: nothing to count
                log.error("skipping terminal=%s: %s", terminal_id, exc)
                continue
            applied = state.apply(terminal_event, day_ms)
            metrics.event(terminal_event.source, applied.counted)
            if not applied.counted:
                continue
            table[terminal_id] = state.to_bytes()
            if applied.publish:
                value = encode_terminal_risk(terminal_id, state.as_of_day, state.features())
                await terminal_risk.send(key=terminal_id, value=value)
                metrics.published()

    async def count_terminals() -> None:
        metrics.terminals(len(table))

    app.timer(GAUGE_INTERVAL_S)(count_terminals)
    return app


def _source_of(message: Message) -> SourceRecord:
    """The original record as a dead letter carries it."""
    raw = message.headers
    pairs = list(raw.items()) if isinstance(raw, Mapping) else list(raw or [])
    return SourceRecord(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp_ms=round(message.timestamp * 1000),
        key=message.key,
        value=message.value,
        headers=[(k, bytes(v or b"")) for k, v in pairs],
    )
