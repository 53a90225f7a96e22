"""Creating topics that may exist already, for the commands that create their own (the scorer's
`topics`/changelog, the features worker's tables and output)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from plumbing.errors import ConfigurationError

log = logging.getLogger(__name__)

#: How long an admin request may take before the command gives up with one line.
ADMIN_TIMEOUT_S = 30.0


def create_missing(admin: AdminClient, topics: list[NewTopic]) -> list[str]:
    """Create the topics that are missing; return the names of those created.

    Raises ConfigurationError naming the topic when the broker refuses one for another reason
    than that it exists (no CREATE permission, a bad setting, …)."""
    futures = admin.create_topics(
        topics, operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
            created.append(name)
            log.info("created topic=%s", name)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                log.info("topic=%s exists already", name)
                continue
            raise ConfigurationError(f"cannot create topic {name!r}: {exc}") from exc
    return created
