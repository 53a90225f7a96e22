"""The worker's own topics: `labels` (its input), the compacted `terminal-risk` and
`card-frauds` (its outputs), and the compacted `terminal-risk-progress` (how far its outputs
reach, one partition: contracts/worker_progress.py).

`fraud-features create-topics` creates them, and `fraud-features run` does too where they are
missing, so the worker starts on a broker that has only the scorer's topics. The outputs must
be compacted: the scorer rebuilds its copies by reading each whole topic, and under the default
delete policy a terminal (or card) whose record has not changed for the retention time would
lose it. An existing output topic without `cleanup.policy=compact` stops the worker.

The internal topics, `<app id>-terminal-events` (the re-keyed events), and the tables' changelogs
`<app id>-terminal-state-changelog` and `<app id>-card-frauds-changelog` (compacted), with
FRAUD_FEATURES_TABLE_PARTITIONS partitions, are created here too before faust starts, and `run`
waits until the broker's metadata lists every topic the worker reads: faust would create its
internal topics itself, but a consumer group that forms before a brand-new topic shows in the
metadata is assigned none of its partitions, and nothing would be read from it until the next
metadata refresh (minutes). An internal topic with another partition count stops the worker (the
count is fixed once they exist). The per-card table's changelog of release 0.1.0, `<app id>-card-
state-changelog`, is copied into the new one first (terminals/card_table_migration.py).

The transactions and dead-letter topics belong to the scorer (`fraud-scorer create-topics`); a
missing transactions topic stops the worker with a message that says so.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from contracts.worker_progress import progress_topic_name
from plumbing.errors import ConfigurationError
from plumbing.topic_admin import ADMIN_TIMEOUT_S, create_missing
from terminals.card_table_migration import FORMER_CARD_TABLE_NAME, migrate_card_table
from terminals.config import FeaturesSettings

log = logging.getLogger(__name__)

#: How often the metadata is read while waiting for new internal topics to show.
METADATA_POLL_S = 0.2
COMPACT = {"cleanup.policy": "compact"}
#: faust's names of the tables (a changelog is <app id>-<table>-changelog).
TABLE_NAME = "terminal-state"
CARD_TABLE_NAME = "card-frauds"


def events_topic_name(app_id: str) -> str:
    """The internal topic of re-keyed terminal events."""
    return f"{app_id}-terminal-events"


def changelog_topic_name(app_id: str, table: str = TABLE_NAME) -> str:
    """A table's changelog topic (faust's naming)."""
    return f"{app_id}-{table}-changelog"


def ensure_topics(config: FeaturesSettings, partitions: int, replication_factor: int) -> list[str]:
    """Create the labels, terminal-risk, card-frauds and progress topics where missing; return
    those created.

    Raises ConfigurationError when a topic cannot be created, or an output topic exists without
    compaction.
    """
    if partitions < 1 or replication_factor < 1:
        raise ConfigurationError(
            "partitions and replication factor must be >= 1, "
            f"got {partitions} and {replication_factor}"
        )
    admin = _admin(config)
    progress = progress_topic_name(config.terminal_risk_topic)
    created = create_missing(
        admin,
        [
            NewTopic(config.labels_topic, partitions, replication_factor),
            NewTopic(config.terminal_risk_topic, partitions, replication_factor, config=COMPACT),
            NewTopic(config.card_frauds_topic, partitions, replication_factor, config=COMPACT),
            NewTopic(progress, 1, replication_factor, config=COMPACT),
        ],
    )
    for topic, setting in (
        (config.terminal_risk_topic, "FRAUD_TERMINAL_RISK_TOPIC"),
        (config.card_frauds_topic, "FRAUD_CARD_FRAUDS_TOPIC"),
        (progress, "FRAUD_TERMINAL_RISK_TOPIC"),
    ):
        if topic not in created:
            _check_compacted(admin, topic, setting)
    return created


def prepare_topics(config: FeaturesSettings) -> None:
    """Before faust starts: create what is missing of the labels, output and internal topics,
    and wait until the metadata lists them all and the transactions topic.

    Raises ConfigurationError when a topic cannot be created, the transactions topic does not
    exist, an output topic is not compacted, an internal topic has another partition count than
    FRAUD_FEATURES_TABLE_PARTITIONS, or a new topic does not show within ADMIN_TIMEOUT_S.
    """
    partitions, replicas = config.table_partitions, config.internal_replication_factor
    ensure_topics(config, partitions, replicas)
    admin = _admin(config)
    changelogs = [changelog_topic_name(config.app_id, t) for t in (TABLE_NAME, CARD_TABLE_NAME)]
    internal = [events_topic_name(config.app_id), *changelogs]
    create_missing(
        admin,
        [
            NewTopic(internal[0], partitions, replicas),
            *(NewTopic(name, partitions, replicas, config=COMPACT) for name in changelogs),
        ],
    )
    outputs = [config.terminal_risk_topic, config.card_frauds_topic]
    names = [config.labels_topic, *outputs, progress_topic_name(outputs[0]), *internal]
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        topics = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
        source = topics.get(config.input_topic)
        if source is None or source.error is not None:
            raise ConfigurationError(
                f"input topic {config.input_topic!r} does not exist: create it first "
                "(fraud-scorer create-topics)"
            )
        shown = {name: topics[name] for name in names if name in topics}
        if len(shown) == len(names) and all(t.error is None for t in shown.values()):
            break
        if time.monotonic() > deadline:
            raise ConfigurationError(f"the topics {names} do not all show in the metadata")
        time.sleep(METADATA_POLL_S)
    for name in internal:
        if len(shown[name].partitions) != partitions:
            raise ConfigurationError(
                f"internal topic {name!r} has {len(shown[name].partitions)} partitions, "
                f"FRAUD_FEATURES_TABLE_PARTITIONS is {partitions}: the count is fixed once the "
                "topics exist (set it back, or start afresh with a new FRAUD_FEATURES_APP_ID)"
            )
    former = changelog_topic_name(config.app_id, FORMER_CARD_TABLE_NAME)
    migrate_card_table(config, admin, former, changelogs[1], partitions)


def _admin(config: FeaturesSettings) -> AdminClient:
    return AdminClient({"bootstrap.servers": config.bootstrap_servers, **config.kafka_settings()})


def _check_compacted(admin: AdminClient, topic: str, setting: str) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        described = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise ConfigurationError(f"cannot read the configuration of {topic!r}: {exc}") from exc
    policy = described.get("cleanup.policy")
    if policy is None or "compact" not in str(policy.value).split(","):
        raise ConfigurationError(
            f"topic {topic!r} exists without cleanup.policy=compact, so its records would be "
            "lost after the retention time: alter it (kafka-configs.sh --alter "
            "--entity-type topics --entity-name "
            f"{topic} --add-config cleanup.policy=compact) or choose another {setting}"
        )
