"""Creation of the service's topics (input, decisions, dead letters, the card state changelog),
idempotently."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from plumbing.errors import ConfigurationError
from plumbing.topic_admin import ADMIN_TIMEOUT_S, create_missing
from stream.startup.config import ScorerSettings
from stream.startup.kafka_clients import ClientErrors

log = logging.getLogger(__name__)

#: How long one metadata request may wait before the credentials are looked at again.
METADATA_POLL_S = 1.0


def ensure_topics(config: ScorerSettings, partitions: int, replication_factor: int) -> list[str]:
    """Create the input, output and dead-letter topics (and the shadow topic, with a
    FRAUD_SHADOW_MODEL) where missing; return those created."""
    if partitions < 1 or replication_factor < 1:
        raise ConfigurationError(
            "partitions and replication factor must be >= 1, "
            f"got {partitions} and {replication_factor}"
        )
    admin = _admin(config)
    names = [config.input_topic, config.output_topic, config.dlq_topic]
    if config.shadow_model is not None:
        names.append(config.shadow_output_topic)
    topics = [NewTopic(name, partitions, replication_factor) for name in names]
    if config.card_history == "on":
        topics.append(_changelog(config, partitions, replication_factor))
    return create_missing(admin, topics)


def ensure_changelog(config: ScorerSettings, errors: ClientErrors) -> None:
    """Create the card state changelog if it is missing, with the input topic's partitions (a
    card's state lives in the partition of its transactions); check an existing one has them.

    Raises ConfigurationError naming what to do when the input topic is missing, the
    changelog has too few partitions, or it cannot be created (e.g. no CREATE permission)."""
    admin = _admin(config, errors)
    metadata = _metadata(admin, errors)
    source = metadata.get(config.input_topic)
    if source is None or source.error is not None:
        raise ConfigurationError(
            f"input topic {config.input_topic!r} does not exist: create it first "
            "(fraud-scorer create-topics)"
        )
    needed = len(source.partitions)
    existing = metadata.get(config.changelog_topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) < needed:
            raise ConfigurationError(
                f"changelog {config.changelog_topic!r} has {len(existing.partitions)} partitions, "
                f"the input topic {needed}: give it as many (kafka-topics --alter)"
            )
        return
    try:
        create_missing(admin, [_changelog(config, needed, replication_factor=-1)])
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"the card state changelog: {exc}; create it (compacted, as many partitions as the "
            "input) or set FRAUD_CARD_HISTORY=off"
        ) from exc


def _changelog(config: ScorerSettings, partitions: int, replication_factor: int) -> NewTopic:
    # -1: the broker's default.replication.factor.
    return NewTopic(
        config.changelog_topic,
        partitions,
        replication_factor,
        config={"cleanup.policy": "compact"},
    )


def _admin(config: ScorerSettings, errors: ClientErrors | None = None) -> AdminClient:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        **config.kafka_settings(),
    }
    if errors is not None:
        settings["error_cb"] = errors
    return AdminClient(settings)


def _metadata(admin: AdminClient, errors: ClientErrors) -> dict[str, Any]:
    """The cluster's topics; ClientFailure as soon as the brokers refuse the credentials."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        try:
            return dict(admin.list_topics(timeout=METADATA_POLL_S).topics)
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback, which sees an authentication failure
            errors.raise_if_failed()
            if time.monotonic() > deadline:
                raise ConfigurationError(f"no answer from the brokers: {exc}") from exc
