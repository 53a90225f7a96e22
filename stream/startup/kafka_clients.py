"""librdkafka settings of the service's consumer and producer, each choice explained.

These are thin factories: the loop in `stream/service.py` uses confluent-kafka's own objects.
Settings given in `ScorerSettings.kafka_options` override the defaults here (security, tuning).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from plumbing.errors import ClientFailure
from stream.lag import STATISTICS_INTERVAL_MS
from stream.startup.config import ScorerSettings

log = logging.getLogger(__name__)

CONSUMER_DEFAULTS: dict[str, Any] = {
    # At-least-once: the service stores an offset only after the decision or dead letter of that
    # record (and of every record before it) is acknowledged; librdkafka then commits the
    # stored offsets in the background, and on close.
    "enable.auto.offset.store": False,
    "enable.auto.commit": True,
    # After a crash, what was decided since the last commit is decided again: commit often
    # (a commit is one small request) so that tail stays short.
    "auto.commit.interval.ms": 250,
    # A new group starts from the oldest transaction: none may go undecided.
    "auto.offset.reset": "earliest",
    # Low latency: the broker answers a fetch as soon as one byte is there (fetch.min.bytes)
    # and holds an empty fetch at most 5 ms (the default 500 ms would add up to half a second
    # to a lone transaction at night).
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 5,
    # Bounded pre-fetch: librdkafka's own queue must not grow without bound under a backlog.
    "queued.max.messages.kbytes": 16_384,
    # When that queue is full librdkafka waits this long before fetching again; the default
    # (1 s) starves a consumer that drains the queue faster than that (measured: up to ~1 s
    # stalls under a backlog).
    "fetch.queue.backoff.ms": 10,
    # A short pre-fetch per partition. The consumer queue is one FIFO for every partition, so a
    # partition with a backlog (one just taken over in a rebalance) queued up to 100,000 records
    # (the default) and 1 MiB per fetch ahead of the new records of the partitions kept, which
    # then waited until that backlog was decided: over a second in fault scenario 6. It cost about
    # 2 % of backlog throughput on 3 partitions (docs/faults.md, scenario 6).
    "queued.min.messages": 1_000,
    "max.partition.fetch.bytes": 262_144,
    # Cooperative rebalancing: a joining replica does not stop the others' partitions.
    "partition.assignment.strategy": "cooperative-sticky",
    # A crashed replica's partitions move after 10 s instead of the default 45 s.
    "session.timeout.ms": 10_000,
    # A member learns that the group rebalances at its next heartbeat. A cooperative
    # rebalance takes two rounds, and the partitions on the move wait for the second, so with
    # the default 3 s every partition a replica took at a join waited up to 3 s more
    # (docs/faults.md, scenario 6). Twice a second is a small request to the coordinator.
    "heartbeat.interval.ms": 500,
    # Per-partition lag arrives through the statistics callback (stream/lag.py).
    "statistics.interval.ms": STATISTICS_INTERVAL_MS,
}

#: librdkafka's default `message.max.bytes`.
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000

PRODUCER_DEFAULTS: dict[str, Any] = {
    # Idempotence: broker retries never duplicate or reorder a partition's records, so the
    # decisions of one card (one key) stay in transaction order.
    "enable.idempotence": True,
    "acks": "all",
    # A batch's decisions are produced in one tight loop and batch by themselves; waiting
    # longer than 1 ms for more would only add latency.
    "linger.ms": 1,
    # librdkafka retries on its own until this passes; then the failure reaches the service's
    # policy (deadletter/policy.py), which retries visibly (metrics, readiness) instead of the
    # default five silent minutes.
    "message.timeout.ms": 30_000,
}


#: Errors after which a client cannot do anything useful: retrying only repeats them.
CLIENT_FAILURES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})


class ClientErrors:
    """The error callback of every client of a replica: logs each error, and keeps the first
    one the replica cannot go on after (the service loop stops on it: `raise_if_failed`)."""

    def __init__(self) -> None:
        self._failure: KafkaError | None = None
        self._on_cluster_lost: list[Callable[[], None]] = []

    def __call__(self, error: KafkaError) -> None:
        log.error(
            "kafka client error code=%s fatal=%s: %s", error.name(), error.fatal(), error.str()
        )
        if error.code() in CLIENT_FAILURES and self._failure is None:
            self._failure = error
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            for callback in self._on_cluster_lost:
                callback()

    def on_cluster_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever a client reports every broker down."""
        self._on_cluster_lost.append(callback)

    def raise_if_failed(self) -> None:
        """Raise ClientFailure, naming what to check, once a client failed for good."""
        error = self._failure
        if error is not None:
            raise ClientFailure(
                f"Kafka authentication failed ({error.str()}): check sasl.username and "
                "sasl.password (FRAUD_KAFKA_CONFIG_FILE) and the SASL mechanism"
            )


def _settings(
    config: ScorerSettings, defaults: dict[str, Any], errors: ClientErrors
) -> dict[str, Any]:
    return {
        **defaults,
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.group_id}-{config.instance_id}",
        "error_cb": errors,
        # librdkafka's own log lines go through Python logging, not straight to stderr.
        "logger": logging.getLogger("librdkafka"),
        **config.kafka_settings(),
    }


#: Exactly-once: the transaction carries the offsets, so the consumer commits nothing itself,
#: and it reads only committed records (the default, stated because it matters here).
EXACTLY_ONCE_CONSUMER: dict[str, Any] = {
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
}
#: Exactly-once: delivery reports for failures only (the commit reports success). A short
#: transaction timeout bounds how long a crashed replica's open transaction holds
#: read_committed consumers back when its successor cannot fence it (another transactional.id);
#: librdkafka wants message.timeout.ms within it.
EXACTLY_ONCE_PRODUCER: dict[str, Any] = {
    "delivery.report.only.error": True,
    "transaction.timeout.ms": 15_000,
    "message.timeout.ms": 10_000,
}


#: The shadow topic's own producer (stream/shadow.py): nothing waits for it, and what it cannot
#: deliver is dropped, so it must never fail for good (no idempotence, whose errors can be
#: fatal) nor hold records long (a topic that does not exist is reported after this timeout).
#: Failures only: a delivered shadow record needs no callback.
SHADOW_PRODUCER: dict[str, Any] = {
    "enable.idempotence": False,
    "acks": "all",
    "linger.ms": 5,
    "message.timeout.ms": 10_000,
    "delivery.report.only.error": True,
}


def create_shadow_producer(config: ScorerSettings, errors: ClientErrors) -> Producer:
    """The producer of shadow decisions: plain in either guarantee, outside any transaction."""
    settings = {**_settings(config, PRODUCER_DEFAULTS, errors), **SHADOW_PRODUCER}
    settings.pop("transactional.id", None)
    settings["client.id"] += "-shadow"
    return Producer(settings)


def create_consumer(
    config: ScorerSettings, on_statistics: Callable[[str], None], errors: ClientErrors
) -> Consumer:
    """The consumer of the input topic, in the service's consumer group."""
    defaults = {**CONSUMER_DEFAULTS, **(EXACTLY_ONCE_CONSUMER if config.exactly_once else {})}
    return Consumer(
        {
            **_settings(config, defaults, errors),
            "group.id": config.group_id,
            "stats_cb": on_statistics,
        }
    )


def create_producer(config: ScorerSettings, errors: ClientErrors) -> Producer:
    """The producer of decisions and dead letters (transactional in exactly-once mode)."""
    if not config.exactly_once:
        return Producer(_settings(config, PRODUCER_DEFAULTS, errors))
    settings = _settings(config, {**PRODUCER_DEFAULTS, **EXACTLY_ONCE_PRODUCER}, errors)
    return Producer({**settings, "transactional.id": config.producer_transactional_id})


#: The replica's plain readers (card-state restore, the compacted tables) read a topic whole.
READER_DEFAULTS: dict[str, Any] = {
    # librdkafka waits this long before fetching again once its queue holds queued.min.messages
    # (100,000 by default). Its default, 1 s, kept these readers waiting most of the time, though
    # they drain that queue in a fraction of it: 500,000 changelog records read in 3.3-3.4 s at
    # the default, 1.5-1.7 s at 1 to 50 ms (the broker and the reader using under a core between
    # them either way); a compacted table of 500,000 records loaded in 2.8-3.8 s, at 10 ms in
    # 0.4 s.
    "fetch.queue.backoff.ms": 10,
}


def reader_settings(config: ScorerSettings, errors: ClientErrors) -> dict[str, Any]:
    """Settings of the replica's plain readers (card state restore, the compacted tables):
    connection and security, and `READER_DEFAULTS`; none of the service consumer's tuning."""
    return {
        **READER_DEFAULTS,
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.group_id}-{config.instance_id}-reader",
        "error_cb": errors,
        "logger": logging.getLogger("librdkafka"),
        **config.kafka_settings(),
    }


def delivery_timeout_s(config: ScorerSettings) -> float:
    """How long librdkafka tries one output before reporting it failed."""
    settings = _settings(config, PRODUCER_DEFAULTS, ClientErrors())
    return float(settings["message.timeout.ms"]) / 1000.0


def max_message_bytes(config: ScorerSettings) -> int:
    """The largest record the producer sends (librdkafka's `message.max.bytes`)."""
    settings = _settings(config, PRODUCER_DEFAULTS, ClientErrors())
    return int(settings.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))
