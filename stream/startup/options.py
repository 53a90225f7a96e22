"""Every setting of `fraud-scorer run`, declared once: name, type and bounds, environment
variable and help, default (`plumbing/settings.py` makes flags, `--help` and errors of them).

`ScorerSettings` (`stream/startup/config.py`) adds the checks that involve several settings and the
values derived from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from contracts.event_time import DEFAULT_MAX_CLOCK_SKEW_MS
from contracts.input_formats import DEFAULT_MAX_RECORD_BYTES
from plumbing.settings import ServiceSettings, Topic, meta
from scorer.decide import LatePolicy
from scorer.drift import DEFAULT_WINDOW as DEFAULT_DRIFT_WINDOW
from scorer.runtime import Device
from stream.package_check import DEFAULT_TIMEOUT_S as DEFAULT_CHECK_TIMEOUT_S

SHIPPED_MODEL_PATH = Path(__file__).resolve().parents[2] / "scorer" / "models" / "fraud-gbdt"

ProcessingGuarantee = Literal["at-least-once", "exactly-once"]
OnOff = Literal["on", "off"]
Scoring = Literal["inline", "thread"]
InputFormat = Literal["json", "avro", "json-schema", "protobuf"]
OutputFormat = Literal["json", "avro", "protobuf", "json-schema"]


class ScorerOptions(ServiceSettings, frozen=True, kw_only=True):
    """The declarations: name, type, bounds, environment variable, help, default (the
    settings every service shares come first, from `ServiceSettings`)."""

    input_topic: Annotated[Topic, meta("FRAUD_INPUT_TOPIC", "topic to read transactions from")] = (
        "transactions"
    )
    input_format: Annotated[
        InputFormat,
        meta(
            "FRAUD_INPUT_FORMAT",
            "format of the input records: json (the contract's JSON), or avro, json-schema or "
            "protobuf in the Schema Registry wire format (needs FRAUD_SCHEMA_REGISTRY_URL; "
            "protobuf also FRAUD_INPUT_PROTOBUF_MESSAGE)",
        ),
    ] = "json"
    input_protobuf_message: Annotated[
        str | None,
        meta(
            "FRAUD_INPUT_PROTOBUF_MESSAGE",
            "protobuf input: the message class generated from your .proto (protoc "
            "--python_out), as module:Class, importable on PYTHONPATH, e.g. payments_pb2:Payment",
        ),
    ] = None
    schema_registry_url: Annotated[
        str | None,
        meta(
            "FRAUD_SCHEMA_REGISTRY_URL",
            "Schema Registry base URL (Confluent API), e.g. http://registry:8081; its "
            "credentials and TLS go in FRAUD_KAFKA_CONFIG_FILE as schema.registry.* keys",
        ),
    ] = None
    input_mapping: Annotated[
        Path | None,
        meta(
            "FRAUD_INPUT_MAPPING",
            "TOML file mapping the input's own field names, nested paths, time format and "
            "codes onto the transaction contract (docs/input-mapping.md; examples/)",
        ),
    ] = None
    schema_registry_subjects: Annotated[
        str | None,
        meta(
            "FRAUD_SCHEMA_REGISTRY_SUBJECTS",
            "registry formats: the subjects, separated by commas, a record's writer schema must "
            "be registered under to be decoded (default: <input topic>-value); a record naming "
            "any other schema is dead-lettered (schema_decode; docs/threat-model.md)",
        ),
    ] = None
    max_record_bytes: Annotated[
        int,
        meta(
            "FRAUD_MAX_RECORD_BYTES",
            "registry formats and FRAUD_INPUT_MAPPING: a longer record is dead-lettered "
            "undecoded (schema_decode, or decode for mapped JSON), which bounds what one record "
            "decodes into; the contract's own JSON needs no bound",
            ge=1_024,
            le=16 * 1_048_576,
        ),
    ] = DEFAULT_MAX_RECORD_BYTES
    output_format: Annotated[
        OutputFormat,
        meta(
            "FRAUD_OUTPUT_FORMAT",
            "format of the decisions: json, or avro, protobuf or json-schema in the Schema "
            "Registry wire format (the schema registered under <output topic>-value, BACKWARD "
            "compatible; needs FRAUD_SCHEMA_REGISTRY_URL; docs/contracts.md)",
        ),
    ] = "json"
    output_topic: Annotated[Topic, meta("FRAUD_OUTPUT_TOPIC", "topic to write decisions to")] = (
        "decisions"
    )
    dlq_topic: Annotated[
        Topic,
        meta("FRAUD_DLQ_TOPIC", "dead-letter topic for records that cannot be decided"),
    ] = "transactions.dlq"
    group_id: Annotated[
        str, meta("FRAUD_GROUP_ID", "consumer group shared by all replicas", min_length=1)
    ] = "fraud-scorer"
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
    scoring: Annotated[
        Scoring,
        meta(
            "FRAUD_SCORING",
            "where batches are scored: inline (on the consuming thread, the faster on CPU) or "
            "thread (a scoring thread beside it, which overlaps consuming with model calls)",
        ),
    ] = "inline"
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
    card_history: Annotated[
        OnOff,
        meta(
            "FRAUD_CARD_HISTORY",
            "on: keep each card's recent history per partition (event-time windows) for the "
            "model, durable in a compacted changelog topic; off: history features are neutral",
        ),
    ] = "on"
    state_changelog_topic: Annotated[
        str,
        meta(
            "FRAUD_STATE_CHANGELOG_TOPIC",
            "compacted topic of the card histories, as many partitions as the input topic "
            "(default: <group_id>-card-state-changelog)",
        ),
    ] = ""
    history_time_scale: Annotated[
        float,
        meta(
            "FRAUD_HISTORY_TIME_SCALE",
            "event time runs this many times faster than real time (a compressed-time demo): "
            "every history window shrinks by it; 1 in production",
            gt=0,
            le=1e9,
        ),
    ] = 1.0
    state_evict_interval_s: Annotated[
        float,
        meta(
            "FRAUD_STATE_EVICT_INTERVAL_S",
            "how often, in seconds of wall-clock time, each partition forgets the cards idle "
            "past the longest window (as of its event-time watermark), with a tombstone each",
            gt=0,
            le=86_400,
        ),
    ] = 60.0
    state_retain_s: Annotated[
        float,
        meta(
            "FRAUD_STATE_RETAIN_S",
            "how long, in seconds, a replica keeps the cards of a partition it gave up with every "
            "change in the changelog, so that if the partition comes back only the changelog's "
            "records since are read; 0 forgets them at once. Memory: those cards stay counted "
            "in fraud_card_state_cards; keep it below the changelog's delete.retention.ms",
            ge=0,
            le=86_400,
        ),
    ] = 600.0
    state_warm_up: Annotated[
        OnOff,
        meta(
            "FRAUD_STATE_WARM_UP",
            "on: before joining the group, read every partition's changelog and keep the cards "
            "as for a partition given up (FRAUD_STATE_RETAIN_S), so the partitions this replica "
            "is then given read only the changelog written since instead of all of it, and the "
            "replicas they come from are not left waiting for a whole restore. Memory: every "
            "partition's cards until FRAUD_STATE_RETAIN_S passes; start-up: the reading",
        ),
    ] = "off"
    max_clock_skew_ms: Annotated[
        int,
        meta(
            "FRAUD_MAX_CLOCK_SKEW_MS",
            "how far past this host's clock an event time may move the state's clocks (card "
            "windows, eviction, terminal days); a later one never moves them and counts as of "
            "the clock's newest trusted time. History time: divided by FRAUD_HISTORY_TIME_SCALE",
            ge=0,
            le=31_536_000_000,
        ),
    ] = DEFAULT_MAX_CLOCK_SKEW_MS
    terminal_risk_topic: Annotated[
        Topic,
        meta(
            "FRAUD_TERMINAL_RISK_TOPIC",
            "compacted topic of per-terminal risk that fraud-features publishes; every replica "
            "reads all of it (a terminal not there yet gets neutral risk), and <this>-progress, "
            "how far the worker's state reaches (fraud_terminal_risk_state_age_seconds)",
        ),
    ] = "terminal-risk"
    card_frauds_topic: Annotated[
        Topic,
        meta(
            "FRAUD_CARD_FRAUDS_TOPIC",
            "compacted topic of each card's confirmed frauds that fraud-features publishes; "
            "every replica reads all of it (a card not there has none)",
        ),
    ] = "card-frauds"
    rules: Annotated[
        Path | None,
        meta(
            "FRAUD_RULES",
            "rules file, TOML (or YAML: .yaml/.yml, with the yaml extra): deny and allow lists, "
            "threshold overrides per segment and expression rules that overrule the model "
            "(docs/rules.md); a bad file stops the start",
        ),
    ] = None
    rules_topic: Annotated[
        Topic | None,
        meta(
            "FRAUD_RULES_TOPIC",
            "compacted topic of live rule updates on top of the rules file, read whole by "
            "every replica (docs/rules.md); a bad update is dead-lettered and the rules in "
            "force stay",
        ),
    ] = None
    rules_guard_share: Annotated[
        float,
        meta(
            "FRAUD_RULES_GUARD_SHARE",
            "a rules-topic update that would flag (review or decline) more of the last "
            "minute's traffic than this share, and more than the rules in force do, is held: "
            "not applied until it is sent again with the header fraud.rules.confirm=yes "
            "(docs/rules.md); 0: no guard",
            ge=0,
            le=1,
        ),
    ] = 0.5
    reasons: Annotated[
        OnOff,
        meta(
            "FRAUD_REASONS",
            "on: every review and decline the model scores carries its top 3 reasons (one "
            "extra model call over the flagged rows; needs the package's reference row)",
        ),
    ] = "on"
    drift_window: Annotated[
        int,
        meta(
            "FRAUD_DRIFT_WINDOW",
            "scored records per drift measurement: every this many, the population stability "
            "index of the score and of the package's drift features against its [drift] "
            "reference is set (fraud_score_psi, fraud_feature_psi; docs/models.md, Drift)",
            ge=100,
            le=100_000_000,
        ),
    ] = DEFAULT_DRIFT_WINDOW
    observed_precision: Annotated[
        OnOff,
        meta(
            "FRAUD_OBSERVED_PRECISION",
            "on: follow the labels topic (FRAUD_LABELS_TOPIC) and count, for each flagged "
            "transaction once its labels have had their time, whether it turned out fraud "
            "(fraud_flagged_outcomes_total; docs/models.md, Drift)",
        ),
    ] = "off"
    labels_topic: Annotated[
        Topic,
        meta(
            "FRAUD_LABELS_TOPIC",
            "topic of confirmed outcomes (contracts: labels) read for the observed precision, "
            "from its end",
        ),
    ] = "labels"
    observed_precision_maturity_days: Annotated[
        float,
        meta(
            "FRAUD_OBSERVED_PRECISION_MATURITY_DAYS",
            "how long after its event time (history time, like the card windows) a flagged "
            "transaction's label may arrive; one not labelled fraud by then counts as not "
            "fraud: set it past most label delays (fraud_features_label_delay_seconds)",
            gt=0,
            le=365,
        ),
    ] = 7.0
    observed_precision_max_pending: Annotated[
        int,
        meta(
            "FRAUD_OBSERVED_PRECISION_MAX_PENDING",
            "flagged transactions followed at once (about 250 bytes each with its id); more "
            "are not followed (fraud_flagged_outcomes_untracked_total)",
            ge=1,
            le=100_000_000,
        ),
    ] = 200_000
    decision_features: Annotated[
        OnOff,
        meta(
            "FRAUD_DECISION_FEATURES",
            "on: every decision carries the feature row it was scored with (`features`, base64 "
            "float32, 232 characters), what `fraud-train from-topics` trains on: "
            "training sees exactly what serving saw (docs/contracts.md)",
        ),
    ] = "off"
    terminal_risk_load_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_TERMINAL_RISK_LOAD_TIMEOUT_S",
            "at start, the replica reads its control topics (the rules topic, terminal-risk, "
            "card-frauds) up to their end before it consumes a transaction, and is not ready "
            "meanwhile, however long that takes: it never consumes without them. Past this "
            "long it logs an error naming the topic it waits for and why (docs/state.md)",
            ge=0,
            le=3_600,
        ),
    ] = 120.0
    model_path: Annotated[
        str,
        meta(
            "FRAUD_MODEL_PATH",
            "model package to score with: a directory holding model.onnx and its manifest "
            "model.toml, or a link to one (docs/models.md; `fraud-model import` makes one, "
            "`fraud-model promote` repoints a link); or an MLflow registered model, "
            "models:/<name>@<alias> or models:/<name>/<version>, read from MLFLOW_TRACKING_URI "
            "(the mlflow extra; `fraud-model promote` moves the alias)",
        ),
    ] = str(SHIPPED_MODEL_PATH)
    model_poll_s: Annotated[
        float,
        meta(
            "FRAUD_MODEL_POLL_S",
            "how often, in seconds, FRAUD_MODEL_PATH is looked at for a new package, which then "
            "serves from the next batch without a restart (docs/models.md, Hot reload); 0: "
            "never, the package read at start serves until the replica stops",
            ge=0,
            le=86_400,
        ),
    ] = 5.0
    model_max_memory_mb: Annotated[
        int,
        meta(
            "FRAUD_MODEL_MAX_MEMORY_MB",
            "most memory, in MiB, a model package's graph may take for its working tensors "
            "(weights apart) when it is checked, in a child process, before the replica opens "
            "it; on a GPU also each session's CUDA arena while it serves: a package whose graph "
            "needs more is refused at start-up or reload (docs/models.md, Limits of a package)",
            ge=16,
            le=1_048_576,
        ),
    ] = 1024
    model_check_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_MODEL_CHECK_TIMEOUT_S",
            "most seconds the check of a model package (served or shadow; loaded, warmed up "
            "and sanity-scored in a child process before the replica opens it) may take: a "
            "package whose check runs longer is refused at start-up or reload "
            "(docs/models.md, Limits of a package)",
            ge=1,
            le=3_600,
        ),
    ] = DEFAULT_CHECK_TIMEOUT_S
    shadow_model: Annotated[
        str | None,
        meta(
            "FRAUD_SHADOW_MODEL",
            "challenger model package (a directory, a link to one, or an MLflow models:/ URI) "
            "scored in shadow on every decided record: its scores go to FRAUD_SHADOW_TOPIC and "
            "the metrics, never into a decision (docs/models.md, Shadow scoring); reloaded like "
            "FRAUD_MODEL_PATH",
        ),
    ] = None
    shadow_topic: Annotated[
        Topic | None,
        meta(
            "FRAUD_SHADOW_TOPIC",
            "topic of the challenger's shadow decisions (default: <output_topic>.shadow)",
        ),
    ] = None
    shadow_timeout_ms: Annotated[
        float,
        meta(
            "FRAUD_SHADOW_TIMEOUT_MS",
            "the challenger scores each batch on its own thread once the batch's decisions are "
            "sent, never delaying one; a batch it has not scored within this many milliseconds "
            'gets no shadow records (fraud_shadow_records_dropped_total{reason="late"})',
            gt=0,
            le=600_000,
        ),
    ] = 5_000.0
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
        float | None,
        meta(
            "FRAUD_REVIEW_THRESHOLD",
            "scores at or above this go to review, in [0, 1]; default: the model package's "
            "(model.toml [thresholds])",
        ),
    ] = None
    decline_threshold: Annotated[
        float | None,
        meta(
            "FRAUD_DECLINE_THRESHOLD",
            "scores at or above this are declined, in [0, 1]; default: the model package's "
            "(model.toml [thresholds])",
        ),
    ] = None
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
