"""The project's one exception tree, grouped by cause.

    FraudScorerError
    ├── ConfigurationError         bad settings; raised before any connection is made
    ├── RecordError                permanent, caused by one record: it is dead-lettered at once
    │   ├── DecodeError            not UTF-8 JSON                           dlq.reason = "decode"
    │   ├── ValidationError        JSON that breaks the transaction contract dlq.reason = "validate"
    │   ├── SchemaUnknownError     a schema id the registry does not know   "schema_unknown"
    │   ├── SchemaDecodeError      not in its schema (or not wire format)   "schema_decode"
    │   ├── ScoreError             the model fails on this record           dlq.reason = "score"
    │   └── RulesUpdateError       a rules-topic record that cannot be used  "rules_update"
    ├── ClientFailure              a Kafka client cannot go on (authentication refused): the
    │                              replica stops with one line, for its operator to fix
    ├── RegistryUnavailableError   a schema lookup failed in a way that may pass (registry down,
    │                              5xx, refused credentials): the partition waits, nothing is lost
    ├── DeliveryError              the broker did not acknowledge an output  dlq.reason = "produce"
    │   ├── RecordRejectedError    permanent for this record (too large, invalid): dead-lettered
    │   └── TransientDeliveryError infrastructure (broker down, timeouts, missing or forbidden
    │                              topic): retried with backoff, never dead-lettered
    ├── ModelUnavailableError      the model fails on every input: infrastructure, not the record
    └── ModelSourceUnavailableError  the model source (MLflow) cannot be read now: the model in
                                   service keeps serving

Errors of librdkafka and ONNX Runtime are translated into this tree where they are caught
(`raise ... from exc`; `plumbing.kafka_errors.translate_kafka_error`), so callers decide by cause.
"""

from __future__ import annotations


class FraudScorerError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigurationError(FraudScorerError):
    """A setting is missing, malformed or inconsistent."""


class RecordError(FraudScorerError):
    """A record that can never succeed as it is; it is dead-lettered, never retried."""

    #: The `dlq.reason` header value for this cause.
    reason: str = "record"


class DecodeError(RecordError):
    """The record value is not valid UTF-8 JSON."""

    reason = "decode"


class ValidationError(RecordError):
    """The record is JSON but breaks the transaction contract."""

    reason = "validate"


class SchemaUnknownError(RecordError):
    """A Schema Registry record whose schema id the registry does not know."""

    reason = "schema_unknown"


class SchemaDecodeError(RecordError):
    """A Schema Registry record that is not in the wire format, or does not decode with the
    schema its id names."""

    reason = "schema_decode"


class RegistryUnavailableError(FraudScorerError):
    """A schema lookup failed for a cause that may pass: the record is read again later."""


class ScoreError(RecordError):
    """The model raised, or returned a score that is not a probability, for this record."""

    reason = "score"


class RulesUpdateError(RecordError):
    """A record of the rules topic that cannot be used; the rules in force stay."""

    reason = "rules_update"


class ClientFailure(FraudScorerError):
    """A Kafka client cannot go on (e.g. the broker refuses the credentials)."""


class DeliveryError(FraudScorerError):
    """The broker did not acknowledge a produced decision or dead letter."""

    reason = "produce"

    def __init__(self, message: str, code: str = "unknown") -> None:
        super().__init__(message)
        #: librdkafka's error name (e.g. `_MSG_TIMED_OUT`), the retry metric's `cause` label.
        self.code = code


class RecordRejectedError(DeliveryError):
    """The broker will never accept this output as it is (too large, invalid)."""


class TransientDeliveryError(DeliveryError):
    """An infrastructure fault that may pass: retried with backoff."""


class ModelUnavailableError(FraudScorerError):
    """The model fails even on a known-good input: no record is to blame."""


class ModelSourceUnavailableError(FraudScorerError):
    """The model source cannot be asked now (an MLflow server down or refusing): the model in
    service keeps serving, and the source is asked again at the next poll."""
