"""The settings of `fraud-scorer run` that say how records flow: the topics and their formats,
batching and its deadline, backpressure, delivery, and the processing guarantee.

Declared once each: name, type and bounds, environment variable and help, default
(`plumbing/settings.py` makes flags, `--help` and errors of them). `ScorerOptions`
(`stream/startup/options.py`) is this class and the ones above it, in this order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from contracts.input_formats import DEFAULT_MAX_RECORD_BYTES
from plumbing.settings import ServiceSettings, Topic, meta
from scorer.decide import LatePolicy

ProcessingGuarantee = Literal["at-least-once", "exactly-once"]
Scoring = Literal["inline", "thread"]
InputFormat = Literal["json", "avro", "json-schema", "protobuf"]
OutputFormat = Literal["json", "avro", "protobuf", "json-schema"]


class FlowOptions(ServiceSettings, frozen=True, kw_only=True):
    """How records flow: topics, formats, batching, backpressure, delivery, the guarantee."""

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
