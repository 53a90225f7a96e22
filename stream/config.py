"""The service's configuration: one typed, frozen object, loaded once at start-up.

Every field has a default, a command-line flag and an environment variable, declared together
below; `fraud-scorer run --help` is generated from the same declarations, so the help, the
environment names and the code cannot drift apart. Extra librdkafka settings (security, SASL,
SSL, tuning) pass through unchanged in `kafka_options`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from scorer.decisions import DEFAULT_DECLINE_THRESHOLD, DEFAULT_REVIEW_THRESHOLD
from stream.errors import ConfigurationError

SHIPPED_MODEL_PATH = Path(__file__).resolve().parent.parent / "scorer" / "models" / "fraud-mlp.onnx"

Device = Literal["auto", "cuda", "cpu", "tensorrt"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LatePolicy = Literal["score", "fallback"]

#: librdkafka settings whose values must never be logged.
_SECRET_MARKERS = ("password", "secret", "jaas", "token", "key")


def _setting(default: Any, env: str, help: str) -> Any:
    return field(default=default, metadata={"env": env, "help": help})


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ServiceConfig:
    """All settings of `fraud-scorer run`. Construct it directly or with `from_sources()`."""

    bootstrap_servers: str = _setting(
        "127.0.0.1:9092",
        "KAFKA_BOOTSTRAP_SERVERS",
        "Kafka bootstrap servers, host:port[,host:port]",
    )
    input_topic: str = _setting(
        "transactions", "FRAUD_INPUT_TOPIC", "topic to read transactions from"
    )
    output_topic: str = _setting("decisions", "FRAUD_OUTPUT_TOPIC", "topic to write decisions to")
    dlq_topic: str = _setting(
        "transactions.dlq",
        "FRAUD_DLQ_TOPIC",
        "dead-letter topic for records that cannot be decided",
    )
    group_id: str = _setting(
        "fraud-scorer", "FRAUD_GROUP_ID", "consumer group shared by all replicas"
    )
    instance_id: str = field(
        default_factory=_default_instance_id,
        metadata={
            "env": "FRAUD_INSTANCE_ID",
            "help": "name of this replica in logs and dead-letter headers (default: host-pid)",
        },
    )
    max_batch_size: int = _setting(
        256, "FRAUD_MAX_BATCH_SIZE", "a micro-batch closes when it holds this many records"
    )
    max_wait_ms: float = _setting(
        10.0,
        "FRAUD_MAX_WAIT_MS",
        "... or this many milliseconds after its first record arrived, whichever comes first",
    )
    max_in_flight_records: int = _setting(
        10_000,
        "FRAUD_MAX_IN_FLIGHT_RECORDS",
        "bound on records consumed but not yet committed: the consumer pauses its partitions "
        "there and resumes at half of it, so memory stays flat under any backlog",
    )
    handoff_batches: int = _setting(
        2,
        "FRAUD_HANDOFF_BATCHES",
        "closed batches that may wait for the scoring thread; when full, fetching pauses",
    )
    slo_ms: float = _setting(
        0.0,
        "FRAUD_SLO_MS",
        "latency target (first record in batch → decisions produced, p99 of recent batches) "
        "for the adaptive batch cap; 0 turns adaptation off and max_batch_size is fixed",
    )
    min_batch_size: int = _setting(
        16, "FRAUD_MIN_BATCH_SIZE", "lower bound of the adaptive batch cap (upper: max_batch_size)"
    )
    decision_deadline_ms: float = _setting(
        1_000.0,
        "FRAUD_DECISION_DEADLINE_MS",
        "a transaction is late when its batch forms after event_time + this; 0 disables",
    )
    late_policy: LatePolicy = _setting(
        "score",
        "FRAUD_LATE_POLICY",
        "late transactions: score (score anyway, count as late) or fallback (fast rules "
        "decision, degraded=true)",
    )
    delivery_attempts: int = _setting(
        5,
        "FRAUD_DELIVERY_ATTEMPTS",
        "tries of an output the broker did not acknowledge before the replica reports unready "
        "and stops fetching (it keeps retrying at the longest backoff; nothing is dropped)",
    )
    retry_backoff_ms: float = _setting(
        100.0, "FRAUD_RETRY_BACKOFF_MS", "first retry wait; it doubles per try, with jitter"
    )
    retry_backoff_max_ms: float = _setting(
        5_000.0, "FRAUD_RETRY_BACKOFF_MAX_MS", "longest wait between retries"
    )
    model_path: Path = _setting(
        SHIPPED_MODEL_PATH, "FRAUD_MODEL_PATH", "ONNX model file to score with"
    )
    device: Device = _setting(
        "auto",
        "FRAUD_DEVICE",
        "execution provider: auto (CUDA if it works, else CPU), cuda, cpu or tensorrt (TensorRT, "
        "else CUDA, else CPU); a GPU that cannot run falls back to CPU with one warning",
    )
    device_id: int = _setting(
        0, "FRAUD_DEVICE_ID", "CUDA device ordinal the cuda and tensorrt devices run on"
    )
    cpu_threads: int = _setting(
        1,
        "FRAUD_CPU_THREADS",
        "ONNX Runtime intra-op threads on the CPU; 1 leaves the other cores to Kafka's threads, "
        "0 = ONNX Runtime's default (one per physical core)",
    )
    review_threshold: float = _setting(
        DEFAULT_REVIEW_THRESHOLD, "FRAUD_REVIEW_THRESHOLD", "scores at or above this go to review"
    )
    decline_threshold: float = _setting(
        DEFAULT_DECLINE_THRESHOLD, "FRAUD_DECLINE_THRESHOLD", "scores at or above this are declined"
    )
    metrics_host: str = _setting(
        "0.0.0.0", "FRAUD_METRICS_HOST", "address of the /metrics, /healthz and /readyz server"
    )
    metrics_port: int = _setting(
        9102,
        "FRAUD_METRICS_PORT",
        "port of the /metrics, /healthz and /readyz server; 0 disables it",
    )
    shutdown_timeout_s: float = _setting(
        30.0,
        "FRAUD_SHUTDOWN_TIMEOUT_S",
        "on SIGTERM, how long to wait for in-flight outputs to be acknowledged before exiting",
    )
    log_level: LogLevel = _setting("INFO", "FRAUD_LOG_LEVEL", "log level")
    log_format: LogFormat = _setting("text", "FRAUD_LOG_FORMAT", "log format: text or json lines")
    kafka_options: Mapping[str, str] = field(
        default_factory=dict,
        metadata={
            "env": "FRAUD_KAFKA_OPTIONS",
            "help": "extra librdkafka settings for every client, KEY=VALUE (repeat the flag; "
            "in the environment, comma-separated), e.g. security.protocol=SASL_SSL",
        },
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        for name in ("input_topic", "output_topic", "dlq_topic", "group_id", "bootstrap_servers"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} must not be empty")
        if len({self.input_topic, self.output_topic, self.dlq_topic}) != 3:
            raise ValueError(
                "input_topic, output_topic and dlq_topic must be three different topics, got "
                f"{self.input_topic!r}, {self.output_topic!r}, {self.dlq_topic!r}"
            )
        if not 1 <= self.max_batch_size <= 65_536:
            raise ValueError(f"max_batch_size must be in 1..65536, got {self.max_batch_size}")
        if not 0 <= self.max_wait_ms <= 60_000:
            raise ValueError(f"max_wait_ms must be in 0..60000, got {self.max_wait_ms}")
        if not 0.0 <= self.review_threshold <= self.decline_threshold <= 1.0:
            raise ValueError(
                "thresholds must satisfy 0 <= review_threshold <= decline_threshold <= 1, got "
                f"review_threshold={self.review_threshold}, "
                f"decline_threshold={self.decline_threshold}"
            )
        if not self.max_batch_size <= self.max_in_flight_records <= 10_000_000:
            raise ValueError(
                "max_in_flight_records must be in max_batch_size..10000000, got "
                f"{self.max_in_flight_records} (max_batch_size={self.max_batch_size})"
            )
        if not 1 <= self.handoff_batches <= 64:
            raise ValueError(f"handoff_batches must be in 1..64, got {self.handoff_batches}")
        if self.slo_ms < 0:
            raise ValueError(f"slo_ms must be >= 0 (0 = off), got {self.slo_ms}")
        if not 1 <= self.min_batch_size <= self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be in 1..max_batch_size ({self.max_batch_size}), "
                f"got {self.min_batch_size}"
            )
        if self.decision_deadline_ms < 0:
            raise ValueError(f"decision_deadline_ms must be >= 0, got {self.decision_deadline_ms}")
        if not 1 <= self.delivery_attempts <= 1_000:
            raise ValueError(f"delivery_attempts must be in 1..1000, got {self.delivery_attempts}")
        if not 0 < self.retry_backoff_ms <= self.retry_backoff_max_ms:
            raise ValueError(
                "retry backoffs must satisfy 0 < retry_backoff_ms <= retry_backoff_max_ms, got "
                f"{self.retry_backoff_ms} and {self.retry_backoff_max_ms}"
            )
        if self.device_id < 0:
            raise ValueError(f"device_id must be >= 0, got {self.device_id}")
        if self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0 (0 = default), got {self.cpu_threads}")
        if not 0 <= self.metrics_port <= 65_535:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        if self.shutdown_timeout_s <= 0:
            raise ValueError(f"shutdown_timeout_s must be > 0, got {self.shutdown_timeout_s}")
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
        for f in fields(cls):
            env = f.metadata["env"]
            if flags.get(f.name) is not None:
                raw, source = flags[f.name], f"--{f.name.replace('_', '-')}"
            elif env in environ:
                raw, source = environ[env], env
            else:
                continue
            try:
                values[f.name] = parse_value(f.name, raw, f.type)
            except ValueError as exc:
                raise ConfigurationError(f"{source}: {exc}") from exc
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc

    def redacted_kafka_options(self) -> dict[str, str]:
        """kafka_options with secret values masked, for logging."""
        return {
            k: ("***" if any(m in k.lower() for m in _SECRET_MARKERS) else v)
            for k, v in self.kafka_options.items()
        }


def default_of(name: str) -> Any:
    """The documented default of a setting (for --help)."""
    f = next(f for f in fields(ServiceConfig) if f.name == name)
    if f.default is not MISSING:
        return f.default
    return "(derived)" if name == "instance_id" else "(none)"


def parse_value(name: str, raw: Any, annotation: Any) -> Any:
    """Turn a flag or environment string into the setting's type; ValueError if it cannot."""
    if not isinstance(raw, str):
        return raw
    kind = _kind(annotation)
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if kind == "path":
        return Path(raw)
    if kind == "mapping":
        return parse_kafka_options(raw.split(",") if raw else [])
    if isinstance(kind, tuple) and raw not in kind:
        raise ValueError(f"{name} must be one of {', '.join(kind)}, got {raw!r}")
    return raw


def parse_kafka_options(items: list[str]) -> dict[str, str]:
    """Parse KEY=VALUE items into a dict of librdkafka settings."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"kafka option must look like KEY=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    return options


def _kind(annotation: Any) -> Any:
    text = str(annotation)
    if text in ("int", "float"):
        return text
    if text == "Path":
        return "path"
    if text.startswith("Mapping"):
        return "mapping"
    literal = {
        "Device": Device,
        "LogFormat": LogFormat,
        "LogLevel": LogLevel,
        "LatePolicy": LatePolicy,
    }.get(text)
    return get_args(literal) if literal is not None else "str"


def _check_type(name: str, value: Any, annotation: Any) -> None:
    kind = _kind(annotation)
    expected: tuple[type, ...] = (
        {
            "int": (int,),
            "float": (int, float),
            "path": (Path,),
            "mapping": (Mapping,),
        }.get(kind, (str,))
        if not isinstance(kind, tuple)
        else (str,)
    )
    if isinstance(value, bool) or not isinstance(value, expected):
        raise TypeError(
            f"{name} must be {' or '.join(t.__name__ for t in expected)}, got {value!r}"
        )
    if isinstance(kind, tuple) and value not in kind:
        raise ValueError(f"{name} must be one of {', '.join(kind)}, got {value!r}")
