"""The faust app of `fraud-features`: labels and transactions in, per-terminal risk out.

```
transactions (key card_id) ─► route_transactions ─┐  decode + validate; no terminal: skipped
labels (key card_id) ──────► route_labels ────────┤  invalid: dead letter (decode / validate)
                                                  ▼  re-keyed: the partition of the terminal
               <app-id>-terminal-events (internal, FRAUD_FEATURES_TABLE_PARTITIONS partitions)
                                                  ▼
               update_terminals ──► table "terminal-state" (key terminal_id, value TerminalState)
                                    └► changelog <app-id>-terminal-state-changelog (compacted)
                                                  ▼  when the terminal's features change
               terminal-risk (compacted, key terminal_id)
```

Both inputs are keyed by card, so they are re-keyed by terminal before they touch the table: the
routing agents send each record's `TerminalEvent` to its terminal's partition of one internal
topic, as faust's `Stream.group_by` would (it forwards to a `-repartition` topic the same way).
One topic for both inputs, rather than two `group_by` repartition topics, lets a single agent own
the table; it carries the decoded event (decoded once) and the record's input position (for
counting it once, terminals/state.py), where `group_by` can only forward the original bytes and
headers; and the routers send the events of a batch of input records (`take_events`, at most
ROUTE_BATCH, ROUTE_WITHIN_S) as one internal record per partition, since faust's cost is per
record (measured: about 500 transactions/s one record each, 1,000 to 2,500 batched, on the
shared 2-core development machine).

Guarantees: at least once, as faust gives it. Faust flushes what the agents sent (re-keyed events,
changelog writes, published risk, dead letters) before it commits the input offsets; after a
crash the records since the last commit are routed again, and the table skips those it counted
already. A dead letter is awaited until the broker has it before its label is acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import faust
from faust.types import EventT, StreamT
from faust.types.tuples import Message

from contracts.dead_letter import SourceRecord, dead_letter_headers
from contracts.errors import RecordError
from scorer.terminal_risk import encode_terminal_risk
from terminals.config import WorkerConfig
from terminals.events import (
    Routed,
    TerminalEvent,
    batch_by_partition,
    decode_batch,
    route_label,
    route_transaction,
)
from terminals.kafka_auth import FaustKafkaAuth
from terminals.metrics import WorkerMetrics
from terminals.state import TerminalState
from terminals.topics import TABLE_NAME, events_topic_name

log = logging.getLogger(__name__)

#: faust's default; a third of the session timeout at most, as Kafka advises.
HEARTBEAT_INTERVAL_S = 3.0
#: Input records routed together (one internal record per partition and batch), and how long
#: a batch waits for more after its first record.
ROUTE_BATCH = 1_000
ROUTE_WITHIN_S = 0.2
#: How long the producer waits to fill a batch (faust's default is 0: one request per record).
PRODUCER_LINGER_S = 0.02
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
        # Nothing here waits on a single record: batch the many small sends (re-keyed events,
        # changelog, risk) into fewer produce requests.
        producer_linger=PRODUCER_LINGER_S,
        key_serializer="raw",
        value_serializer="raw",
        # No faust web server (metrics have their own) and no leader-election topic.
        web_enabled=False,
        topic_disable_leader=True,
    )
    # Typed as bytes (str for terminal ids), so faust never tries to reconstruct models.
    serializers = {"key_serializer": "raw", "value_serializer": "raw"}
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, **serializers}
    transactions = app.topic(config.input_topic, **raw)
    labels = app.topic(config.labels_topic, **raw)
    dead_letters = app.topic(config.dlq_topic, **raw)
    keyed: dict[str, Any] = {"key_type": str, "value_type": bytes, **serializers}
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

    async def forward(routed: list[Routed]) -> None:
        """Send routed events to their terminals' partitions: one record per partition."""
        for partition, value in batch_by_partition(routed, config.table_partitions).items():
            await terminal_events.send(value=value, partition=partition)

    @app.agent(transactions, name="route_transactions")
    async def route_transactions(stream: StreamT[bytes]) -> None:
        """Re-key each transaction to its terminal; skip those without one or invalid."""
        async for events in _batches(stream):
            routed = []
            for event in events:
                message = event.message
                try:
                    found = route_transaction(message.value, message.partition, message.offset)
                except RecordError:
                    metrics.transaction("invalid")  # the scorer dead-letters it
                    continue
                if found is None:
                    metrics.transaction("no_terminal")
                    continue
                routed.append(found)
                metrics.transaction("routed")
            await forward(routed)

    @app.agent(labels, name="route_labels")
    async def route_labels(stream: StreamT[bytes]) -> None:
        """Re-key each label to its terminal; dead-letter invalid ones."""
        async for events in _batches(stream):
            routed = []
            for event in events:
                message = event.message
                try:
                    found = route_label(message.value, message.partition, message.offset)
                except RecordError as exc:
                    await _dead_letter(event, exc)
                    continue
                if found is None:
                    metrics.label("no_terminal")
                    continue
                routed.append(found)
                metrics.label("fraud" if found.event.fraud else "legit")
            await forward(routed)

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
        """Count each terminal's events in the table (one changelog write per terminal and
        record); publish the terminal's risk when its features change."""
        async for event in stream.events():
            try:
                batch = decode_batch(event.message.value)
            except ValueError as exc:  # not written by this worker: nothing to count
                log.error("skipping an internal record: %s", exc)
                continue
            by_terminal: dict[str, list[TerminalEvent]] = {}
            for terminal_id, terminal_event in batch:
                by_terminal.setdefault(terminal_id, []).append(terminal_event)
            for terminal_id, terminal_events_ in by_terminal.items():
                await _update(terminal_id, terminal_events_)

    async def _update(terminal_id: str, events: list[TerminalEvent]) -> None:
        stored = table.get(terminal_id)
        try:
            state = TerminalState() if stored is None else TerminalState.from_bytes(stored)
        except ValueError as exc:
            log.error("skipping terminal=%s: %s", terminal_id, exc)
            return
        counted = publish = False
        for terminal_event in events:
            applied = state.apply(terminal_event, day_ms)
            metrics.event(terminal_event.source, applied.counted)
            counted |= applied.counted
            publish |= applied.publish
        if not counted:
            return
        features = state.changed_features() if publish else None
        table[terminal_id] = state.to_bytes()
        if features is not None:
            value = encode_terminal_risk(terminal_id, state.as_of_day, features)
            await terminal_risk.send(key=terminal_id, value=value)
            metrics.published()

    async def count_terminals() -> None:
        metrics.terminals(len(table))

    app.timer(GAUGE_INTERVAL_S)(count_terminals)
    return app


def _batches(stream: StreamT[bytes]) -> AsyncIterator[Sequence[EventT[bytes]]]:
    """The stream's events in batches of at most ROUTE_BATCH, each closed ROUTE_WITHIN_S after
    its first event at the latest; acknowledged once the next batch is asked for."""
    # Stream has take_events; its interface StreamT does not declare it.
    return cast(faust.Stream[bytes], stream).take_events(ROUTE_BATCH, within=ROUTE_WITHIN_S)


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
