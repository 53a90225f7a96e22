"""The service's configuration: one typed, frozen object, loaded once at start-up.

A setting is one declaration below: its name, type and bounds (`Annotated[…, Meta(…)]`), its
environment variable and its help (`_meta`), and its default. msgspec converts and checks
values from flags and the environment (`from_sources`); `__post_init__` keeps only the checks
that involve several settings. `fraud-scorer run --help` and the deploy checks read the same
declarations (`settings()`), so the help, the environment names and the code cannot drift apart.
Extra librdkafka settings (security, SASL, SSL, tuning) pass through unchanged in
`kafka_options` and the file `kafka_config_file`; see `contracts/kafka_settings.py`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from contracts.errors import ConfigurationError
from contracts.kafka_settings import (
    parse_kafka_options,
    read_kafka_config_file,
    redact,
    split_kafka_options,
)
from scorer.decide import DecisionPolicy, LatePolicy
from scorer.decisions import DEFAULT_DECLINE_THRESHOLD, DEFAULT_REVIEW_THRESHOLD, Thresholds
from scorer.runtime import Device
from stream.declarations import (
    Setting,
    check_path,
    declared_settings,
    decode_path,
    field_of,
    meta,
    readable_error,
    rules_of,
)

SHIPPED_MODEL_PATH = (
    Path(__file__).resolve().parent.parent / "scorer" / "models" / "fraud-gbdt.onnx"
)

ProcessingGuarantee = Literal["at-least-once", "exactly-once"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


_Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")]


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The declarations: name, type, bounds, environment variable, help, default."""

    bootstrap_servers: Annotated[
        str,
        meta(
            "KAFKA_BOOTSTRAP_SERVERS",
            "Kafka bootstrap servers, host:port[,host:port]",
            min_length=1,
        ),
    ] = "127.0.0.1:9092"
    input_topic: Annotated[_Topic, meta("FRAUD_INPUT_TOPIC", "topic to read transactions from")] = (
        "transactions"
    )
    output_topic: Annotated[_Topic, meta("FRAUD_OUTPUT_TOPIC", "topic to write decisions to")] = (
        "decisions"
    )
    dlq_topic: Annotated[
        _Topic,
        meta("FRAUD_DLQ_TOPIC", "dead-letter topic for records that cannot be decided"),
    ] = "transactions.dlq"
    group_id: Annotated[
        str, meta("FRAUD_GROUP_ID", "consumer group shared by all replicas", min_length=1)
    ] = "fraud-scorer"
    instance_id: Annotated[
        str,
        meta(
            "FRAUD_INSTANCE_ID",
            "name of this replica in logs and dead-letter headers (default: host-pid)",
            min_length=1,
        ),
    ] = msgspec.field(default_factory=_default_instance_id)
    max_batch_size: Annotated[
        int,
        meta(
            "FRAUD_MAX_BATCH_SIZE",
            "a micro-batch closes when it holds this many records",
            ge=1,
            le=65_536,
        ),
    ] = 256
    max_wait_ms: Annotated[
        float,
        meta(
            "FRAUD_MAX_WAIT_MS",
            "... or this many milliseconds after its first record arrived, whichever comes first",
            ge=0,
            le=60_000,
        ),
    ] = 10.0
    max_in_flight_records: Annotated[
        int,
        meta(
            "FRAUD_MAX_IN_FLIGHT_RECORDS",
            "bound on records consumed but not yet decided and acknowledged: the consumer pauses "
            "its partitions there and resumes at half of it, so memory stays flat under any "
            "backlog",
            ge=1,
            le=10_000_000,
        ),
    ] = 10_000
    max_in_flight_bytes: Annotated[
        int,
        meta(
            "FRAUD_MAX_IN_FLIGHT_BYTES",
            "the same bound on those records' key and value bytes (records may carry unknown "
            "fields up to the broker's size limit)",
            ge=1_048_576,
            le=1 << 40,
        ),
    ] = 64 * 1_048_576
    handoff_batches: Annotated[
        int,
        meta(
            "FRAUD_HANDOFF_BATCHES",
            "closed batches that may wait for the scoring thread; when full, fetching waits",
            ge=1,
            le=64,
        ),
    ] = 2
    slo_ms: Annotated[
        float,
        meta(
            "FRAUD_SLO_MS",
            "latency target (first record in batch → decisions produced, p99 of recent batches) "
            "for the adaptive batch cap; 0 turns adaptation off and max_batch_size is fixed",
            ge=0,
        ),
    ] = 0.0
    min_batch_size: Annotated[
        int,
        meta(
            "FRAUD_MIN_BATCH_SIZE",
            "lower bound of the adaptive batch cap (upper: max_batch_size)",
            ge=1,
        ),
    ] = 16
    decision_deadline_ms: Annotated[
        float,
        meta(
            "FRAUD_DECISION_DEADLINE_MS",
            "a transaction is late when its batch is decided after event_time + this; 0 disables",
            ge=0,
        ),
    ] = 1_000.0
    late_policy: Annotated[
        LatePolicy,
        meta(
            "FRAUD_LATE_POLICY",
            "late transactions: score (score anyway, count as late) or fallback (fast rules "
            "decision, degraded=true; a record decided again after a restart may then differ)",
        ),
    ] = "score"
    delivery_attempts: Annotated[
        int,
        meta(
            "FRAUD_DELIVERY_ATTEMPTS",
            "tries of an output the broker did not acknowledge before the replica reports "
            "unready and stops fetching (it keeps retrying at the longest backoff; nothing is "
            "dropped)",
            ge=1,
            le=1_000,
        ),
    ] = 5
    retry_backoff_ms: Annotated[
        float,
        meta("FRAUD_RETRY_BACKOFF_MS", "first retry wait; it doubles per try, with jitter", gt=0),
    ] = 100.0
    retry_backoff_max_ms: Annotated[
        float, meta("FRAUD_RETRY_BACKOFF_MAX_MS", "longest wait between retries", gt=0)
    ] = 5_000.0
    processing_guarantee: Annotated[
        ProcessingGuarantee,
        meta(
            "FRAUD_PROCESSING_GUARANTEE",
            "at-least-once (a crash may repeat decisions) or exactly-once (decisions, dead letters "
            "and input offsets commit in one Kafka transaction; read decisions with "
            "isolation.level=read_committed)",
        ),
    ] = "at-least-once"
    transaction_ms: Annotated[
        float,
        meta(
            "FRAUD_TRANSACTION_MS",
            "exactly-once: commit the open transaction this often (a read_committed consumer "
            "sees decisions up to this much later)",
            gt=0,
            le=60_000,
        ),
    ] = 100.0
    transaction_max_records: Annotated[
        int,
        meta(
            "FRAUD_TRANSACTION_MAX_RECORDS",
            "exactly-once: ... or once the open transaction answers this many records",
            ge=1,
            le=10_000_000,
        ),
    ] = 10_000
    transactional_id: Annotated[
        str,
        meta(
            "FRAUD_TRANSACTIONAL_ID",
            "exactly-once: the producer's transactional.id; keep it stable across restarts of "
            "one replica so a restart fences its previous incarnation at once (default: "
            "<group_id>-<instance_id>)",
        ),
    ] = ""
    model_path: Annotated[Path, meta("FRAUD_MODEL_PATH", "ONNX model file to score with")] = (
        SHIPPED_MODEL_PATH
    )
    device: Annotated[
        Device,
        meta(
            "FRAUD_DEVICE",
            "execution provider: auto (CUDA if it works, else CPU), cuda, cpu or tensorrt "
            "(TensorRT, else CUDA, else CPU); a GPU that cannot run falls back to CPU with one "
            "warning",
        ),
    ] = "auto"
    device_id: Annotated[
        int,
        meta("FRAUD_DEVICE_ID", "CUDA device ordinal the cuda and tensorrt devices run on", ge=0),
    ] = 0
    cpu_threads: Annotated[
        int,
        meta(
            "FRAUD_CPU_THREADS",
            "ONNX Runtime intra-op threads on the CPU; 1 leaves the other cores to Kafka's "
            "threads, 0 = ONNX Runtime's default (one per physical core)",
            ge=0,
            le=1_024,
        ),
    ] = 1
    review_threshold: Annotated[
        float,
        meta("FRAUD_REVIEW_THRESHOLD", "scores at or above this go to review", ge=0, le=1),
    ] = DEFAULT_REVIEW_THRESHOLD
    decline_threshold: Annotated[
        float,
        meta("FRAUD_DECLINE_THRESHOLD", "scores at or above this are declined", ge=0, le=1),
    ] = DEFAULT_DECLINE_THRESHOLD
    processes: Annotated[
        int,
        meta(
            "FRAUD_PROCESSES",
            "consumer processes of this replica, supervised; each scores on one core and "
            "serves its metrics on metrics_port + its index",
            ge=1,
            le=256,
        ),
    ] = 1
    metrics_host: Annotated[
        str,
        meta("FRAUD_METRICS_HOST", "address of the /metrics, /healthz and /readyz server"),
    ] = "0.0.0.0"
    metrics_port: Annotated[
        int,
        meta(
            "FRAUD_METRICS_PORT",
            "port of the /metrics, /healthz and /readyz server; 0 disables it",
            ge=0,
            le=65_535,
        ),
    ] = 9102
    shutdown_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_SHUTDOWN_TIMEOUT_S",
            "on SIGTERM, how long the whole drain may take (score what is held, wait for its "
            "outputs, commit) before the replica exits",
            gt=0,
        ),
    ] = 30.0
    log_level: Annotated[LogLevel, meta("FRAUD_LOG_LEVEL", "log level")] = "INFO"
    log_format: Annotated[LogFormat, meta("FRAUD_LOG_FORMAT", "log format: text or json lines")] = (
        "text"
    )
    kafka_options: Annotated[
        dict[str, str],
        meta(
            "FRAUD_KAFKA_OPTIONS",
            "extra librdkafka settings for every client, KEY=VALUE (repeat the flag; in the "
            "environment, comma-separated), e.g. security.protocol=SASL_SSL; put secrets in "
            "the config file instead: flags show in the process list",
        ),
    ] = msgspec.field(default_factory=dict)
    kafka_config_file: Annotated[
        Path | None,
        meta(
            "FRAUD_KAFKA_CONFIG_FILE",
            "librdkafka settings from a properties file (key=value lines, # comments), e.g. "
            "mounted from a secret; -X and FRAUD_KAFKA_OPTIONS override its keys",
        ),
    ] = None


class ServiceConfig(_Settings, frozen=True, kw_only=True):
    """All settings of `fraud-scorer run`. Construct it directly or with `from_sources()`.

    Direct construction checks every value too: a wrong type raises TypeError, a value out of
    its bounds or inconsistent with another raises ValueError, naming the setting.
    """

    def __post_init__(self) -> None:
        try:
            msgspec.convert(
                msgspec.structs.asdict(self), _Settings, strict=True, dec_hook=check_path
            )
        except msgspec.ValidationError as exc:
            raise readable_error(exc, msgspec.structs.asdict(self), _RULES) from None
        if len({self.input_topic, self.output_topic, self.dlq_topic}) != 3:
            raise ValueError(
                "input_topic, output_topic and dlq_topic must be three different topics, got "
                f"{self.input_topic!r}, {self.output_topic!r}, {self.dlq_topic!r}"
            )
        if self.review_threshold > self.decline_threshold:
            raise ValueError(
                "thresholds must satisfy review_threshold <= decline_threshold, got "
                f"review_threshold={self.review_threshold}, "
                f"decline_threshold={self.decline_threshold}"
            )
        if self.max_in_flight_records < self.max_batch_size:
            raise ValueError(
                f"max_in_flight_records must be >= max_batch_size ({self.max_batch_size}), "
                f"got {self.max_in_flight_records}"
            )
        if self.slo_ms and self.min_batch_size > self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be <= max_batch_size ({self.max_batch_size}) when the "
                f"adaptive cap is on (slo_ms > 0), got {self.min_batch_size}"
            )
        if self.retry_backoff_ms > self.retry_backoff_max_ms:
            raise ValueError(
                "retry backoffs must satisfy retry_backoff_ms <= retry_backoff_max_ms, got "
                f"{self.retry_backoff_ms} and {self.retry_backoff_max_ms}"
            )
        if not self.model_path.is_file():
            raise ValueError(f"model_path {str(self.model_path)!r} is not a file")
        for key in self.kafka_options:
            if key in ("bootstrap.servers", "group.id"):
                raise ValueError(f"set {key} with its own option, not in kafka_options")

    @classmethod
    def from_sources(
        cls, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> ServiceConfig:
        """Build the config: a flag wins over its environment variable, which wins over the default.

        Raises ConfigurationError naming the setting and its source when a value is malformed.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for setting in settings():
            if flags.get(setting.name) is not None:
                values[setting.name] = flags[setting.name]
                sources[setting.name] = "--" + setting.name.replace("_", "-")
            elif setting.env in environ:
                raw = environ[setting.env]
                if setting.name == "kafka_options":
                    values[setting.name] = _options_from_env(raw)
                elif setting.name == "kafka_config_file":
                    values[setting.name] = raw or None
                else:
                    values[setting.name] = raw
                sources[setting.name] = setting.env
        try:
            return msgspec.convert(values, cls, strict=False, dec_hook=decode_path)
        except msgspec.ValidationError as exc:
            error = readable_error(exc, values, _RULES)
            name = field_of(exc)
            prefix = f"{sources[name]}: " if name in sources else ""
            raise ConfigurationError(prefix + str(error)) from None

    def kafka_settings(self) -> dict[str, str]:
        """librdkafka settings beyond the service's own: the config file, then kafka_options.

        Raises ConfigurationError when the file cannot be read or parsed."""
        from_file = (
            {} if self.kafka_config_file is None else read_kafka_config_file(self.kafka_config_file)
        )
        merged = {**from_file, **self.kafka_options}
        for key in ("bootstrap.servers", "group.id"):
            if key in from_file:
                raise ConfigurationError(
                    f"kafka config file sets {key}: set it with its own option instead"
                )
        return merged

    def redacted_kafka_options(self) -> dict[str, object]:
        """The extra librdkafka settings as they may be logged (secrets masked)."""
        return redact(self.kafka_settings())

    @property
    def exactly_once(self) -> bool:
        """Whether outputs and offsets commit in Kafka transactions."""
        return self.processing_guarantee == "exactly-once"

    @property
    def producer_transactional_id(self) -> str:
        """The transactional.id of this replica's producer (exactly-once)."""
        return self.transactional_id or f"{self.group_id}-{self.instance_id}"

    @property
    def decision_policy(self) -> DecisionPolicy:
        """How scores become decisions, from the thresholds and the late policy."""
        return DecisionPolicy(
            Thresholds(self.review_threshold, self.decline_threshold),
            self.decision_deadline_ms,
            self.late_policy,
        )


def settings() -> tuple[Setting, ...]:
    """Every setting of `ServiceConfig`, in declaration order."""
    return _SETTINGS


def _options_from_env(raw: str) -> dict[str, str]:
    return parse_kafka_options(split_kafka_options(raw))


_SETTINGS = declared_settings(_Settings)
_RULES = rules_of(_Settings)
