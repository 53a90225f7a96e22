"""Wiring of one replica: what the service loop talks to, built once from the configuration.

`ScoringService` takes its collaborators ready-made (as httpx's `Client(transport=…)` takes its
transport), so the loop is unit-tested with an in-memory consumer, sink and scorer, and run
for real with the objects `build_collaborators` makes here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer

from contracts.decision import encode_decision
from contracts.event_time import EventClock
from contracts.field_mapping import FieldMapping
from contracts.input_formats import TransactionDecoder, transaction_decoder
from contracts.offsets import OffsetTracker, PartitionKey
from contracts.output_formats import DecisionEncoder, decision_encoder
from contracts.transaction import decode_transaction
from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter
from plumbing.health import HealthState
from scorer.decide import DecisionPolicy
from scorer.model import Scorer
from scorer.model_source import ModelSource, open_model_source
from scorer.reasons import Explainer
from scorer.recent_rows import RecentRows
from scorer.rules import Rules
from scorer.terminal_risk import day_length_ms
from stream.card_history_changelog import KafkaChangelog
from stream.lag import LagMonitor
from stream.metrics import ServiceMetrics
from stream.model_reload import (
    ModelReloader,
    ServingModel,
    load_shadow_model,
    shadow_config,
)
from stream.observed_precision import ObservedPrecision
from stream.owned_card_history import OwnedCardHistory
from stream.redelivery import Redelivery
from stream.rules_guard import RulesGuard
from stream.rules_table import RulesTable
from stream.scoring import BatchScorer
from stream.shadow import Shadow, ShadowOutput
from stream.sink import KafkaSink, OutputSink
from stream.startup.config import ScorerSettings
from stream.startup.kafka_clients import ClientErrors, create_shadow_producer
from stream.tracing import BatchTracer, batch_tracer
from stream.transactional_sink import TransactionalSink
from stream.worker_alignment import WorkerAlignment
from stream.worker_tables import CardFraudsTable, TerminalRiskTable


@dataclass(frozen=True)
class Collaborators:
    """Everything the service loop reads from or writes to, besides its own state.

    `sink` reports failed outputs to `redelivery.failed`; `tracker` is shared by the loop, the
    outcome groups and the sink's delivery reports.
    """

    consumer: Consumer
    sink: OutputSink
    scorer: Scorer
    redelivery: Redelivery
    router: DeadLetterRouter
    health: HealthState
    lag: LagMonitor
    metrics: ServiceMetrics
    #: How scores become decisions (`ScorerSettings.decision_policy`).
    policy: DecisionPolicy
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    #: Exactly-once mode: the sink, which also commits the transactions.
    transactions: TransactionalSink | None = None
    #: Per-card history (FRAUD_CARD_HISTORY=on), the copies of terminal-risk and card-frauds.
    card_history: OwnedCardHistory | None = None
    terminals: TerminalRiskTable | None = None
    card_frauds: CardFraudsTable | None = None
    #: FRAUD_WAIT_FOR_WORKER=on: when a batch may be scored (stream/worker_alignment.py).
    worker_alignment: WorkerAlignment | None = None
    #: What the Kafka clients' error callback saw (a client that failed for good stops the loop).
    client_errors: ClientErrors | None = None
    #: How an input record's value becomes a transaction (FRAUD_INPUT_FORMAT), and a
    #: decision the output's value (FRAUD_OUTPUT_FORMAT).
    decode: TransactionDecoder = decode_transaction
    encode: DecisionEncoder = encode_decision
    #: The rules in force (FRAUD_RULES and its topic), and the reasons of flagged decisions.
    rules: RulesTable | None = None
    explainer: Explainer | None = None
    #: Where a new model comes from without a restart (FRAUD_MODEL_POLL_S > 0).
    reloader: ModelReloader | None = None
    #: The challenger scored in shadow (FRAUD_SHADOW_MODEL).
    shadow: Shadow | None = None
    #: Flagged transactions followed until their labels arrive (FRAUD_OBSERVED_PRECISION).
    observed_precision: ObservedPrecision | None = None
    #: One span per scored batch (an OTLP endpoint set and the otel extra installed).
    tracer: BatchTracer | None = None
    #: A few rows of each batch the model decided: the known-good rows a new model must score,
    #: and that tell a broken model from poison records (scorer/recent_rows.py).
    recent_rows: RecentRows | None = None


def batch_scorer(config: ScorerSettings, parts: Collaborators) -> BatchScorer:
    """The scoring stage of a replica, over its collaborators."""
    return BatchScorer(
        parts.scorer,
        parts.sink,
        parts.tracker,
        parts.router,
        output_topic=config.output_topic,
        policy=parts.policy,
        metrics=parts.metrics,
        card_history=parts.card_history,
        terminals=parts.terminals,
        card_frauds=parts.card_frauds,
        encode=parts.encode,
        rules=parts.rules,
        explainer=parts.explainer,
        reloader=parts.reloader,
        shadow=parts.shadow,
        observed_precision=parts.observed_precision,
        log_features=config.decision_features == "on",
        drift_window=config.drift_window,
        tracer=parts.tracer,
        recent=parts.recent_rows,
    )


def event_clock(config: ScorerSettings) -> EventClock:
    """How far the state's clocks trust event times, from the configuration."""
    return EventClock(config.max_clock_skew_ms, config.history_time_scale)


def retry_policy(config: ScorerSettings) -> RetryPolicy:
    """The failure policy's retries, from the configuration."""
    return RetryPolicy(
        config.delivery_attempts,
        config.retry_backoff_ms / 1000.0,
        config.retry_backoff_max_ms / 1000.0,
    )


def dead_letter_router(config: ScorerSettings) -> DeadLetterRouter:
    """The router that names this replica in its dead letters."""
    return DeadLetterRouter(config.dlq_topic, f"{config.group_id}/{config.instance_id}")


def build_collaborators(
    config: ScorerSettings,
    consumer: Consumer,
    new_producer: Callable[[], Producer],
    model: ServingModel,
    health: HealthState,
    lag: LagMonitor,
    metrics: ServiceMetrics,
    *,
    model_source: ModelSource,
    delivery_timeout_s: float,
    max_message_bytes: int,
    kafka: Mapping[str, Any],
    client_errors: ClientErrors,
) -> Collaborators:
    """The collaborators of a replica on real Kafka clients; `kafka` holds the settings of the
    readers it makes itself (the state restore, the terminal-risk and rules tables); `model`:
    the model loaded at start-up from `model_source` (FRAUD_MODEL_PATH), replaced by newer ones
    there while FRAUD_MODEL_POLL_S > 0."""
    router = dead_letter_router(config)
    card_history = (
        OwnedCardHistory(
            KafkaChangelog(kafka, config.changelog_topic),
            time_scale=config.history_time_scale,
            metrics=metrics,
            clock=event_clock(config),
            undo=config.exactly_once,
            evict_interval_s=config.state_evict_interval_s,
            retain_s=config.state_retain_s,
        )
        if config.card_history == "on"
        else None
    )
    redelivery = Redelivery(
        retry_policy(config),
        router,
        delivery_timeout_s=delivery_timeout_s,
        max_message_bytes=max_message_bytes,
        metrics=metrics,
        current_card=None if card_history is None else card_history.current,
    )
    tracker = OffsetTracker()

    def committed(positions: dict[PartitionKey, int]) -> None:
        lag.committed(positions)
        if card_history is not None:
            card_history.committed(positions)

    transactions = (
        TransactionalSink(
            new_producer,
            consumer,
            tracker,
            router,
            commit_interval_s=config.transaction_ms / 1000.0,
            max_records=config.transaction_max_records,
            max_message_bytes=max_message_bytes,
            metrics=metrics,
            on_committed=committed,
        )
        if config.exactly_once
        else None
    )
    if transactions is not None:
        client_errors.on_cluster_lost(transactions.cluster_lost)
    # The worker's tables count days as the worker does, and trust dates as far as the card state.
    clock, day_ms = event_clock(config), day_length_ms(config.history_time_scale)
    recent = RecentRows()
    terminals = TerminalRiskTable(
        kafka, config.terminal_risk_topic, metrics, clock=clock, day_ms=day_ms
    )
    card_frauds = CardFraudsTable(
        kafka, config.card_frauds_topic, metrics, clock=clock, day_ms=day_ms
    )
    return Collaborators(
        consumer=consumer,
        sink=transactions or KafkaSink(new_producer(), redelivery.failed),
        scorer=model.scorer,
        redelivery=redelivery,
        router=router,
        health=health,
        lag=lag,
        metrics=metrics,
        policy=model.policy,
        tracker=tracker,
        transactions=transactions,
        card_history=card_history,
        terminals=terminals,
        card_frauds=card_frauds,
        worker_alignment=(
            WorkerAlignment(terminals, card_frauds, clock, metrics)
            if config.wait_for_worker == "on"
            else None
        ),
        client_errors=client_errors,
        decode=transaction_decoder(
            config.input_format,
            config.input_topic,
            config.registry_settings(),
            None if config.input_mapping is None else FieldMapping.load(config.input_mapping),
            config.input_protobuf_message,
            subjects=config.schema_subjects,
            max_record_bytes=config.max_record_bytes,
        ),
        encode=decision_encoder(
            config.output_format, config.output_topic, config.registry_settings()
        ),
        rules=RulesTable(
            Rules.EMPTY if config.rules is None else Rules.load(config.rules),
            metrics,
            kafka=kafka,
            topic=config.rules_topic,
            router=router,
            guard=(
                RulesGuard(config.rules_guard_share)
                if config.rules_topic is not None and config.rules_guard_share > 0
                else None
            ),
        ),
        explainer=model.explainer,
        reloader=(
            ModelReloader(config, metrics, model, source=model_source, recent=recent)
            if config.model_poll_s > 0
            else None
        ),
        shadow=shadow_scoring(config, metrics, client_errors, recent),
        observed_precision=(
            ObservedPrecision(
                metrics,
                maturity_days=config.observed_precision_maturity_days,
                time_scale=config.history_time_scale,
                max_pending=config.observed_precision_max_pending,
                clock=event_clock(config),
                kafka=kafka,
                topic=config.labels_topic,
            )
            if config.observed_precision == "on"
            else None
        ),
        tracer=batch_tracer(
            input_topic=config.input_topic,
            group_id=config.group_id,
            instance_id=config.instance_id,
            max_batch_size=config.max_batch_size,
        ),
        recent_rows=recent,
    )


def shadow_scoring(
    config: ScorerSettings,
    metrics: ServiceMetrics,
    errors: ClientErrors,
    recent: RecentRows | None = None,
) -> Shadow | None:
    """The challenger of FRAUD_SHADOW_MODEL, loaded, warmed up and sanity-scored, with its own
    producer (None without one); ConfigurationError when it cannot serve. Reloaded, it must
    score the `recent` rows the served model decided too."""
    if config.shadow_model is None:
        return None
    source = open_model_source(config.shadow_model)
    model = load_shadow_model(config, source)
    model.scorer.warm_up()
    reloader = (
        ModelReloader(
            shadow_config(config), metrics, model, source=source, role="shadow", recent=recent
        )
        if config.model_poll_s > 0
        else None
    )
    output = ShadowOutput(
        create_shadow_producer(config, errors), config.shadow_output_topic, metrics
    )
    return Shadow(model, output, metrics, reloader, timeout_s=config.shadow_timeout_ms / 1000.0)
