"""librdkafka's verdicts translated into the project's errors, at the boundary, by cause.

A delivery failure is either about the record itself (too large, invalid: retrying cannot
help, so it is dead-lettered) or about the infrastructure (broker down, time-outs, a missing or
forbidden topic: retried with backoff). Callers decide by the class of the translated error.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from contracts.errors import DeliveryError, RecordRejectedError, TransientDeliveryError

#: Broker or client verdicts that are about the record itself: retrying cannot help.
#: (librdkafka uses MSG_SIZE_TOO_LARGE both for the broker's refusal and for its own check
#: against `message.max.bytes` before sending.)
RECORD_REJECTIONS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
    }
)

#: Consume errors that mean an ACL is missing: a replica reports unready until records flow.
ACCESS_DENIED = frozenset(
    {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED}
)


#: Answers of a partition whose leader is not elected or known yet (a topic just created, a
#: leader election): asking again shortly succeeds. The two local codes are the client's own
#: metadata not knowing the topic or partition yet: a restore that starts right after the
#: replica created its changelog once stopped the replica on `_UNKNOWN_PARTITION`.
LEADER_UNKNOWN = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)


def leader_unknown(exc: BaseException) -> bool:
    """Whether a client call failed only because its partition's leader is not known yet."""
    return isinstance(exc, KafkaException) and exc.args[0].code() in LEADER_UNKNOWN


def translate_kafka_error(error: KafkaError, topic: str) -> DeliveryError:
    """librdkafka's verdict on one output → the project's error, by cause."""
    cls = RecordRejectedError if error.code() in RECORD_REJECTIONS else TransientDeliveryError
    return cls(f"{topic}: {error.str()}", code=error.name())
