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
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

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

SHIPPED_MODEL_PATH = (
    Path(__file__).resolve().parent.parent / "scorer" / "models" / "fraud-gbdt.onnx"
)

LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _meta(env: str, help: str, **bounds: Any) -> msgspec.Meta:
    return msgspec.Meta(description=help, extra={"env": env}, **bounds)


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


_Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")]


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The declarations: name, type, bounds, environment variable, help, default."""

    bootstrap_servers: Annotated[
        str,
        _meta(
            "KAFKA_BOOTSTRAP_SERVERS",
            "Kafka bootstrap servers, host:port[,host:port]",
            min_length=1,
        ),
    ] = "127.0.0.1:9092"
    input_topic: Annotated[
        _Topic, _meta("FRAUD_INPUT_TOPIC", "topic to read transactions from")
    ] = "transactions"
    output_topic: Annotated[_Topic, _meta("FRAUD_OUTPUT_TOPIC", "topic to write decisions to")] = (
        "decisions"
    )
    dlq_topic: Annotated[
        _Topic,
        _meta("FRAUD_DLQ_TOPIC", "dead-letter topic for records that cannot be decided"),
    ] = "transactions.dlq"
    group_id: Annotated[
        str, _meta("FRAUD_GROUP_ID", "consumer group shared by all replicas", min_length=1)
    ] = "fraud-scorer"
    instance_id: Annotated[
        str,
        _meta(
            "FRAUD_INSTANCE_ID",
            "name of this replica in logs and dead-letter headers (default: host-pid)",
            min_length=1,
        ),
    ] = msgspec.field(default_factory=_default_instance_id)
    max_batch_size: Annotated[
        int,
        _meta(
            "FRAUD_MAX_BATCH_SIZE",
            "a micro-batch closes when it holds this many records",
            ge=1,
            le=65_536,
        ),
    ] = 256
    max_wait_ms: Annotated[
        float,
        _meta(
            "FRAUD_MAX_WAIT_MS",
            "... or this many milliseconds after its first record arrived, whichever comes first",
            ge=0,
            le=60_000,
        ),
    ] = 10.0
    max_in_flight_records: Annotated[
        int,
        _meta(
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
        _meta(
            "FRAUD_MAX_IN_FLIGHT_BYTES",
            "the same bound on those records' key and value bytes (records may carry unknown "
            "fields up to the broker's size limit)",
            ge=1_048_576,
            le=1 << 40,
        ),
    ] = 64 * 1_048_576
    handoff_batches: Annotated[
        int,
        _meta(
            "FRAUD_HANDOFF_BATCHES",
            "closed batches that may wait for the scoring thread; when full, fetching waits",
            ge=1,
            le=64,
        ),
    ] = 2
    slo_ms: Annotated[
        float,
        _meta(
            "FRAUD_SLO_MS",
            "latency target (first record in batch → decisions produced, p99 of recent batches) "
            "for the adaptive batch cap; 0 turns adaptation off and max_batch_size is fixed",
            ge=0,
        ),
    ] = 0.0
    min_batch_size: Annotated[
        int,
        _meta(
            "FRAUD_MIN_BATCH_SIZE",
            "lower bound of the adaptive batch cap (upper: max_batch_size)",
            ge=1,
        ),
    ] = 16
    decision_deadline_ms: Annotated[
        float,
        _meta(
            "FRAUD_DECISION_DEADLINE_MS",
            "a transaction is late when its batch is decided after event_time + this; 0 disables",
            ge=0,
        ),
    ] = 1_000.0
    late_policy: Annotated[
        LatePolicy,
        _meta(
            "FRAUD_LATE_POLICY",
            "late transactions: score (score anyway, count as late) or fallback (fast rules "
            "decision, degraded=true; a record decided again after a restart may then differ)",
        ),
    ] = "score"
    delivery_attempts: Annotated[
        int,
        _meta(
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
        _meta("FRAUD_RETRY_BACKOFF_MS", "first retry wait; it doubles per try, with jitter", gt=0),
    ] = 100.0
    retry_backoff_max_ms: Annotated[
        float, _meta("FRAUD_RETRY_BACKOFF_MAX_MS", "longest wait between retries", gt=0)
    ] = 5_000.0
    model_path: Annotated[Path, _meta("FRAUD_MODEL_PATH", "ONNX model file to score with")] = (
        SHIPPED_MODEL_PATH
    )
    device: Annotated[
        Device,
        _meta(
            "FRAUD_DEVICE",
            "execution provider: auto (CUDA if it works, else CPU), cuda, cpu or tensorrt "
            "(TensorRT, else CUDA, else CPU); a GPU that cannot run falls back to CPU with one "
            "warning",
        ),
    ] = "auto"
    device_id: Annotated[
        int,
        _meta("FRAUD_DEVICE_ID", "CUDA device ordinal the cuda and tensorrt devices run on", ge=0),
    ] = 0
    cpu_threads: Annotated[
        int,
        _meta(
            "FRAUD_CPU_THREADS",
            "ONNX Runtime intra-op threads on the CPU; 1 leaves the other cores to Kafka's "
            "threads, 0 = ONNX Runtime's default (one per physical core)",
            ge=0,
            le=1_024,
        ),
    ] = 1
    review_threshold: Annotated[
        float,
        _meta("FRAUD_REVIEW_THRESHOLD", "scores at or above this go to review", ge=0, le=1),
    ] = DEFAULT_REVIEW_THRESHOLD
    decline_threshold: Annotated[
        float,
        _meta("FRAUD_DECLINE_THRESHOLD", "scores at or above this are declined", ge=0, le=1),
    ] = DEFAULT_DECLINE_THRESHOLD
    metrics_host: Annotated[
        str,
        _meta("FRAUD_METRICS_HOST", "address of the /metrics, /healthz and /readyz server"),
    ] = "0.0.0.0"
    metrics_port: Annotated[
        int,
        _meta(
            "FRAUD_METRICS_PORT",
            "port of the /metrics, /healthz and /readyz server; 0 disables it",
            ge=0,
            le=65_535,
        ),
    ] = 9102
    shutdown_timeout_s: Annotated[
        float,
        _meta(
            "FRAUD_SHUTDOWN_TIMEOUT_S",
            "on SIGTERM, how long the whole drain may take (score what is held, wait for its "
            "outputs, commit) before the replica exits",
            gt=0,
        ),
    ] = 30.0
    log_level: Annotated[LogLevel, _meta("FRAUD_LOG_LEVEL", "log level")] = "INFO"
    log_format: Annotated[
        LogFormat, _meta("FRAUD_LOG_FORMAT", "log format: text or json lines")
    ] = "text"
    kafka_options: Annotated[
        dict[str, str],
        _meta(
            "FRAUD_KAFKA_OPTIONS",
            "extra librdkafka settings for every client, KEY=VALUE (repeat the flag; in the "
            "environment, comma-separated), e.g. security.protocol=SASL_SSL; put secrets in "
            "the config file instead: flags show in the process list",
        ),
    ] = msgspec.field(default_factory=dict)
    kafka_config_file: Annotated[
        Path | None,
        _meta(
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
                msgspec.structs.asdict(self), _Settings, strict=True, dec_hook=_check_path
            )
        except msgspec.ValidationError as exc:
            raise _readable(exc, msgspec.structs.asdict(self)) from None
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
        if self.min_batch_size > self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be <= max_batch_size ({self.max_batch_size}), "
                f"got {self.min_batch_size}"
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
            return msgspec.convert(values, cls, strict=False, dec_hook=_decode_path)
        except msgspec.ValidationError as exc:
            error = _readable(exc, values)
            name = _field_of(exc)
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
    def decision_policy(self) -> DecisionPolicy:
        """How scores become decisions, from the thresholds and the late policy."""
        return DecisionPolicy(
            Thresholds(self.review_threshold, self.decline_threshold),
            self.decision_deadline_ms,
            self.late_policy,
        )


class Setting(NamedTuple):
    """One declared setting, as `--help` and the deploy checks read it."""

    name: str
    env: str
    help: str
    #: The documented default, as text.
    default: str


def settings() -> tuple[Setting, ...]:
    """Every setting of `ServiceConfig`, in declaration order."""
    return _SETTINGS


def _describe_default(field: msgspec.inspect.Field) -> str:
    if field.name == "instance_id":
        return "(host-pid)"
    if field.default_factory is not msgspec.NODEFAULT or field.default is None:
        return "(none)"
    return str(field.default)


def _declared() -> tuple[Setting, ...]:
    info = msgspec.inspect.type_info(_Settings)
    assert isinstance(info, msgspec.inspect.StructType)
    declared = []
    for field in info.fields:
        meta = field.type
        assert isinstance(meta, msgspec.inspect.Metadata) and meta.extra is not None
        declared.append(
            Setting(
                field.name,
                meta.extra["env"],
                (meta.extra_json_schema or {})["description"],
                _describe_default(field),
            )
        )
    return tuple(declared)


_SETTINGS = _declared()


def _options_from_env(raw: str) -> dict[str, str]:
    return parse_kafka_options(split_kafka_options(raw))


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise NotImplementedError(f"{kind} is not a setting type")


def _check_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, Path):
        return value
    raise TypeError(f"Expected `Path`, got `{type(value).__name__}`")


_PATH = re.compile(r" - at `\$\.([a-z_]+)`")


def _field_of(exc: msgspec.ValidationError) -> str | None:
    match = _PATH.search(str(exc))
    return match.group(1) if match else None


def _readable(exc: msgspec.ValidationError, values: Mapping[str, Any]) -> TypeError | ValueError:
    """msgspec's message ("Expected `int` >= 1 - at `$.max_batch_size`") as one naming the
    setting, what it accepts and the value, typed as TypeError (wrong type) or ValueError."""
    text = str(exc)
    name = _field_of(exc)
    if name is None:
        return ValueError(text)
    shown = "(not shown)" if name == "kafka_options" else repr(values.get(name))
    message = f"{name} must be {_RULES[name]}, got {shown}"
    return TypeError(message) if ", got `" in text else ValueError(message)


def _rule_of(kind: msgspec.inspect.Type) -> str:
    """What a declared type accepts, in words: "an integer in 1..65536"."""
    if isinstance(kind, msgspec.inspect.Metadata):
        return _rule_of(kind.type)
    if isinstance(kind, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(str(v) for v in kind.values)
    if isinstance(kind, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        noun = "an integer" if isinstance(kind, msgspec.inspect.IntType) else "a number"
        low = kind.ge if kind.ge is not None else kind.gt
        high = kind.le if kind.le is not None else kind.lt
        if kind.ge is not None and kind.le is not None:
            return f"{noun} in {kind.ge}..{kind.le}"
        if low is not None:
            return f"{noun} {'>=' if kind.ge is not None else '>'} {low}"
        return noun if high is None else f"{noun} <= {high}"
    if isinstance(kind, msgspec.inspect.StrType):
        if kind.pattern:
            return "a topic name (letters, digits, . _ -)"
        return "a non-empty string" if kind.min_length else "a string"
    if isinstance(kind, msgspec.inspect.DictType):
        return "KEY=VALUE settings"
    if isinstance(kind, msgspec.inspect.UnionType):
        return " or ".join(_rule_of(t) for t in kind.types)
    if isinstance(kind, msgspec.inspect.NoneType):
        return "unset"
    return "a file path"


def _rules() -> dict[str, str]:
    info = msgspec.inspect.type_info(_Settings)
    assert isinstance(info, msgspec.inspect.StructType)
    return {field.name: _rule_of(field.type) for field in info.fields}


_RULES = _rules()
