"""librdkafka's verdicts translated into the project's errors, at the boundary, by cause.

A delivery failure is either about the record itself (too large, invalid: retrying cannot
help, so it is dead-lettered) or about the infrastructure (broker down, time-outs, a missing or
forbidden topic: retried with backoff). Callers decide by the class of the translated error.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Message

from plumbing.errors import DeliveryError, RecordRejectedError, TransientDeliveryError

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


#: The code of a success report that names no offset (`delivery_error`).
UNCONFIRMED = "_UNCONFIRMED"


def translate_kafka_error(error: KafkaError, topic: str) -> DeliveryError:
    """librdkafka's verdict on one output → the project's error, by cause."""
    cls = RecordRejectedError if error.code() in RECORD_REJECTIONS else TransientDeliveryError
    return cls(f"{topic}: {error.str()}", code=error.name())


def stored(error: KafkaError | None, message: Message) -> bool:
    """Whether a delivery report says the broker stored the message: no error, and an offset.

    librdkafka reports the messages of a failed produce request as delivered, without an offset
    ("implicitly acked"), when a later request to the same partition succeeds: it assumes the
    broker enforces the producer's sequence order. A broker that holds no state for the producer
    on that partition (a topic just created, a new producer id, one idle past
    producer.id.expiration.ms) accepts any sequence, so the earlier request may have failed for
    good: fault scenario 5 lost a dead letter that way (a NOT_LEADER answer, then the next
    request accepted). Such a report is not trusted. (confluent-kafka gives None for any
    negative offset, librdkafka's OFFSET_INVALID included.)"""
    return error is None and message.offset() is not None


def delivery_error(error: KafkaError | None, topic: str) -> DeliveryError:
    """The error of a report that `stored` did not accept: librdkafka's, translated, or a
    transient one for a success without an offset (the sink sends it again: at worst a
    duplicate, which at-least-once allows)."""
    if error is not None:
        return translate_kafka_error(error, topic)
    return TransientDeliveryError(
        f"{topic}: reported delivered without an offset (librdkafka's implicit ack): not "
        "confirmed stored",
        code=UNCONFIRMED,
    )
