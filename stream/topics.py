"""Creation of the service's topics (input, decisions, dead letters), idempotently."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from contracts.errors import ConfigurationError
from stream.config import ServiceConfig

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0


def ensure_topics(config: ServiceConfig, partitions: int, replication_factor: int) -> list[str]:
    """Create the input, output and dead-letter topics where missing; return those created."""
    if partitions < 1 or replication_factor < 1:
        raise ConfigurationError(
            "partitions and replication factor must be >= 1, "
            f"got {partitions} and {replication_factor}"
        )
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers, **config.kafka_options})
    names = [config.input_topic, config.output_topic, config.dlq_topic]
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor) for name in names],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
            created.append(name)
            log.info("created topic=%s partitions=%s", name, partitions)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                log.info("topic=%s exists already", name)
                continue
            raise ConfigurationError(f"cannot create topic {name!r}: {exc}") from exc
    return created
