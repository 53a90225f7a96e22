"""The project's one exception tree.

    FraudScorerError
    ├── ConfigurationError        bad settings; raised before any connection is made
    ├── RecordError               permanent, caused by one record: it goes to the dead-letter topic
    │   ├── DecodeError           not UTF-8 JSON                         dlq.reason = "decode"
    │   ├── ValidationError       JSON that breaks the transaction contract dlq.reason = "validate"
    │   └── ScoreError            the model failed on it                  dlq.reason = "score"
    └── DeliveryError             the broker did not acknowledge an output record
                                                                          dlq.reason = "produce"

Errors of librdkafka and ONNX Runtime are translated into this tree where they are caught
(`raise ... from exc`), so callers handle causes, not libraries.
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


class ScoreError(RecordError):
    """The model raised, or returned a score that is not a probability, for this record."""

    reason = "score"


class DeliveryError(FraudScorerError):
    """The broker did not acknowledge a produced decision or dead letter."""

    reason = "produce"
