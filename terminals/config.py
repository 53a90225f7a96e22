"""The worker's configuration: one typed, frozen object, loaded once at start-up.

Every setting is a flag and an environment variable (a flag wins), declared once in `OPTIONS`
with its help; the defaults and bounds live on `WorkerConfig`, and msgspec converts and checks
the text of flags and variables against them. Names shared with the scorer (bootstrap servers,
topics, time scale, log settings, the Kafka client settings) read the same variables, so one
environment configures both.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import msgspec

from contracts.errors import ConfigurationError
from contracts.event_time import DEFAULT_MAX_CLOCK_SKEW_MS, EventClock
from contracts.kafka_settings import redact, tool_kafka_settings
from scorer.terminal_risk import day_length_ms
from terminals.state import TerminalClock

_Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")]
#: An app id names the consumer group and prefixes the worker's internal topics.
_AppId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _default_data_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "fraud-features")


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every setting of `fraud-features`, with its default and bounds (help: `OPTIONS`)."""

    bootstrap_servers: Annotated[str, msgspec.Meta(min_length=1)] = "127.0.0.1:9092"
    input_topic: _Topic = "transactions"
    labels_topic: _Topic = "labels"
    terminal_risk_topic: _Topic = "terminal-risk"
    dlq_topic: _Topic = "transactions.dlq"
    app_id: _AppId = "fraud-features"
    instance_id: Annotated[str, msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=_default_instance_id
    )
    table_partitions: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 6
    internal_replication_factor: Annotated[int, msgspec.Meta(ge=1, le=32)] = 1
    history_time_scale: Annotated[float, msgspec.Meta(gt=0, le=1e9)] = 1.0
    max_clock_skew_ms: Annotated[int, msgspec.Meta(ge=0, le=31_536_000_000)] = (
        DEFAULT_MAX_CLOCK_SKEW_MS
    )
    evict_interval_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    session_timeout_s: Annotated[float, msgspec.Meta(ge=6, le=300)] = 30.0
    store: Annotated[str, msgspec.Meta(pattern=r"^[a-z]+://")] = "memory://"
    data_dir: Annotated[str, msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=_default_data_dir
    )
    metrics_host: str = "0.0.0.0"
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65_535)] = 9103
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    #: The extra librdkafka-style settings (`-X`, FRAUD_KAFKA_OPTIONS, FRAUD_KAFKA_CONFIG_FILE),
    #: already read; terminals/kafka_auth.py maps them onto faust's client.
    kafka_settings: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def day_ms(self) -> int:
        """Length of a terminal-risk day in event-time ms (shorter in a compressed-time demo)."""
        return day_length_ms(self.history_time_scale)

    @property
    def clock(self) -> TerminalClock:
        """The worker's event-time clock: days of `day_ms`, bounded by the wall clock plus
        the allowed skew (history time, like the days)."""
        return TerminalClock(
            self.day_ms, EventClock(self.max_clock_skew_ms, self.history_time_scale)
        )

    @property
    def service(self) -> str:
        """The `dlq.service` header: consumer group and instance, as the scorer writes it."""
        return f"{self.app_id}/{self.instance_id}"

    def redacted_kafka_settings(self) -> dict[str, object]:
        """The extra Kafka settings as they may be logged (secrets masked)."""
        return redact(self.kafka_settings)


class Option(NamedTuple):
    """One setting as the command line and the environment show it."""

    name: str
    env: str
    help: str


OPTIONS: tuple[Option, ...] = (
    Option(
        "bootstrap_servers", "KAFKA_BOOTSTRAP_SERVERS", "Kafka bootstrap servers, host:port[,…]"
    ),
    Option("input_topic", "FRAUD_INPUT_TOPIC", "topic of the transactions (key card_id)"),
    Option("labels_topic", "FRAUD_LABELS_TOPIC", "topic of the confirmed outcomes (key card_id)"),
    Option(
        "terminal_risk_topic",
        "FRAUD_TERMINAL_RISK_TOPIC",
        "compacted topic the per-terminal risk is published to (key terminal_id)",
    ),
    Option("dlq_topic", "FRAUD_DLQ_TOPIC", "dead-letter topic for labels that break the contract"),
    Option(
        "app_id",
        "FRAUD_FEATURES_APP_ID",
        "faust app id: the consumer group of all replicas and the prefix of the internal topics "
        "(<app-id>-terminal-events, <app-id>-terminal-state-changelog); a new id starts empty",
    ),
    Option(
        "instance_id",
        "FRAUD_INSTANCE_ID",
        "name of this replica in logs and dead-letter headers",
    ),
    Option(
        "table_partitions",
        "FRAUD_FEATURES_TABLE_PARTITIONS",
        "partitions of the table, its changelog and the re-keyed events topic (the most "
        "replicas that share the work), fixed when faust first creates them; also those of "
        "labels and terminal-risk if `run` creates them",
    ),
    Option(
        "internal_replication_factor",
        "FRAUD_FEATURES_REPLICATION_FACTOR",
        "replicas of each partition of the topics the worker creates (3 on a production cluster)",
    ),
    Option(
        "history_time_scale",
        "FRAUD_HISTORY_TIME_SCALE",
        "event time runs this many times faster than real time (a compressed-time demo): a "
        "terminal-risk day lasts 86,400,000 / this ms of event time; 1 in production",
    ),
    Option(
        "max_clock_skew_ms",
        "FRAUD_MAX_CLOCK_SKEW_MS",
        "how far past this host's clock an event time or report time may move the worker's "
        "clock and a terminal's day; a later one never moves them and counts on the worker's "
        "newest trusted day (history time: divided by FRAUD_HISTORY_TIME_SCALE). The "
        "scorer's setting of the same name",
    ),
    Option(
        "evict_interval_s",
        "FRAUD_FEATURES_EVICT_INTERVAL_S",
        "how often, in seconds of wall-clock time, each table partition forgets the terminals "
        "no window reads any more (a tombstone in the table and in terminal-risk each)",
    ),
    Option(
        "auto_offset_reset",
        "FRAUD_FEATURES_AUTO_OFFSET_RESET",
        "where a new app id starts reading transactions and labels: earliest (rebuild the "
        "risk from what the topics retain) or latest",
    ),
    Option(
        "session_timeout_s",
        "FRAUD_FEATURES_SESSION_TIMEOUT_S",
        "a replica that dies without leaving the group (kill -9, a lost host) keeps its "
        "partitions this many seconds before the group hands them on; a restarted replica "
        "waits as long. At least the broker's group.min.session.timeout.ms (6 s by default)",
    ),
    Option(
        "store",
        "FRAUD_FEATURES_STORE",
        "faust table store: memory:// (rebuilt from the changelog topic at every start) or "
        "rocksdb:// (needs faust-streaming[rocksdict])",
    ),
    Option("data_dir", "FRAUD_FEATURES_DATA_DIR", "faust's data directory"),
    Option(
        "metrics_host",
        "FRAUD_FEATURES_METRICS_HOST",
        "address of the /metrics, /healthz and /readyz server",
    ),
    Option(
        "metrics_port",
        "FRAUD_FEATURES_METRICS_PORT",
        "port of the /metrics, /healthz and /readyz server; 0 disables it",
    ),
    Option("log_level", "FRAUD_LOG_LEVEL", "log level: DEBUG, INFO, WARNING or ERROR"),
    Option("log_format", "FRAUD_LOG_FORMAT", "log format: text or json lines"),
)


def from_sources(
    flags: Mapping[str, str | None],
    kafka_items: list[str] | None,
    environ: Mapping[str, str] | None = None,
) -> WorkerConfig:
    """The configuration from flags (None: not given), then the environment, then defaults.

    `kafka_items` are the `-X KEY=VALUE` flags (None: read FRAUD_KAFKA_OPTIONS instead); the
    file named by FRAUD_KAFKA_CONFIG_FILE comes under them.

    Raises ConfigurationError naming the setting, its variable and the rule it breaks.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, object] = {}
    for option in OPTIONS:
        value = flags.get(option.name)
        if value is None:
            value = environ.get(option.env)
        if value is not None and value != "":
            raw[option.name] = value
    raw["kafka_settings"] = tool_kafka_settings(kafka_items, environ)
    try:
        return msgspec.convert(raw, WorkerConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(_readable(str(exc))) from exc


def _readable(message: str) -> str:
    """msgspec's `… - at `$.name`` as `--name (ENV): …`."""
    text, _, where = message.rpartition(" - at `$.")
    name = where.rstrip("`").split(".")[0].split("[")[0]
    env = {o.name: o.env for o in OPTIONS}.get(name)
    if not text or env is None:
        return message
    return f"--{name.replace('_', '-')} ({env}): {text}"
