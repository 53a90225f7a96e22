"""The failure policy: every librdkafka verdict is translated, and only transient ones retry."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Producer

from contracts.offsets import OffsetTracker
from deadletter.policy import RetryPolicy
from plumbing.errors import (
    DeliveryError,
    RecordRejectedError,
    TransientDeliveryError,
    ValidationError,
)
from plumbing.kafka_errors import RECORD_REJECTIONS, UNCONFIRMED, translate_kafka_error
from stream.outcomes import OutcomeGroup
from stream.sink import KafkaSink, Output
from tests.unit.fakes import message


def _codes() -> list[int]:
    return [
        v for k, v in vars(KafkaError).items() if isinstance(v, int) and k.lstrip("_").isupper()
    ]


@pytest.mark.parametrize("code", _codes())
def test_no_librdkafka_error_slips_through_untranslated(code: int) -> None:
    error = translate_kafka_error(KafkaError(code), "decisions")
    assert isinstance(error, DeliveryError)
    assert isinstance(error, RecordRejectedError) == (code in RECORD_REJECTIONS)
    assert error.code == KafkaError(code).name()
    assert str(error).startswith("decisions: ")


def test_infrastructure_faults_are_transient() -> None:
    for code in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._QUEUE_FULL,
        KafkaError.REQUEST_TIMED_OUT,
    ):
        assert isinstance(translate_kafka_error(KafkaError(code), "t"), TransientDeliveryError)


def test_a_locally_refused_record_is_translated_at_the_sink() -> None:
    # A real producer, no broker needed: librdkafka refuses the size before sending.
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": 1_000})
    failures: list[DeliveryError] = []
    sink = KafkaSink(producer, lambda _output, error: failures.append(error))
    group = OutcomeGroup(OffsetTracker(), [], Counter({("decision", "approve"): 1}), lambda _: None)
    sink.send(Output("decision", "d", b"k", b"x" * 5_000, None, message(0), group, "approve"))
    assert len(failures) == 1 and isinstance(failures[0], RecordRejectedError)


class ReportingProducer:
    """Stands in for librdkafka's side of one produce: the delivery report it would serve."""

    def __init__(self, error: KafkaError | None, offset: int) -> None:
        self._error, self._offset = error, offset

    def produce(self, topic: str, value: bytes, key: bytes, **kwargs: Any) -> None:
        reported = message(self._offset, value, topic=topic, key=key)
        kwargs["on_delivery"](self._error, reported)


@pytest.mark.parametrize("batch", [False, True], ids=["send", "send_batch"])
@pytest.mark.parametrize(
    ("error", "offset", "outcome"),
    [
        (None, 0, "delivered"),
        (None, 41, "delivered"),
        # librdkafka's implicit ack (no offset, OFFSET_INVALID): not trusted, sent again.
        (None, -1001, UNCONFIRMED),
        (KafkaError(KafkaError._MSG_TIMED_OUT), -1001, "_MSG_TIMED_OUT"),
    ],
)
def test_the_sink_counts_an_output_delivered_only_with_an_offset(
    batch: bool, error: KafkaError | None, offset: int, outcome: str
) -> None:
    failures: list[DeliveryError] = []
    delivered: list[object] = []
    sink = KafkaSink(
        cast(Producer, ReportingProducer(error, offset)),
        lambda _output, failure: failures.append(failure),
    )
    group = OutcomeGroup(
        OffsetTracker(), [], Counter({("decision", "approve"): 1}), delivered.append
    )
    output = Output("decision", "d", b"k", b"v", None, message(0), group, "approve")
    if batch:
        sink.send_batch("d", [b"k"], [b"v"], group, lambda _index: output)
    else:
        sink.send(output)
    if outcome == "delivered":
        assert len(delivered) == 1 and failures == []
    else:
        assert delivered == [] and len(failures) == 1
        assert isinstance(failures[0], TransientDeliveryError)
        assert failures[0].code == outcome


def test_retry_policy_retries_transient_errors_then_gives_up() -> None:
    retried: list[BaseException] = []
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        raise TransientDeliveryError("broker down", code="_TRANSPORT")

    policy = RetryPolicy(attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
    with pytest.raises(TransientDeliveryError):
        for attempt in policy.retrying(retried.append):
            with attempt:
                flaky()
    assert calls == 3 and len(retried) == 2


def test_the_backoff_doubles_with_jitter_up_to_its_bound_and_the_loop_waits_it() -> None:
    policy = RetryPolicy(attempts=30, initial_backoff_s=0.5, max_backoff_s=10.0)
    for failures, floor in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0)):
        waits = [policy.backoff_s(failures) for _ in range(200)]
        assert floor <= min(waits) and max(waits) <= floor + 0.5 and len(set(waits)) > 1
    assert {policy.backoff_s(n) for n in (6, 30, 10_000)} == {10.0}
    slept: list[float] = []
    retrying = RetryPolicy(attempts=4, initial_backoff_s=0.5, max_backoff_s=10.0).retrying(
        lambda _e: None
    )
    retrying.sleep = slept.append
    with pytest.raises(TransientDeliveryError):
        for attempt in retrying:
            with attempt:
                raise TransientDeliveryError("down", code="_TRANSPORT")
    assert len(slept) == 3, "4 attempts, 3 waits between them"
    for wait, floor in zip(slept, (0.5, 1.0, 2.0), strict=True):
        assert floor <= wait <= floor + 0.5


def test_retry_policy_never_retries_permanent_errors() -> None:
    calls = 0
    policy = RetryPolicy(attempts=5, initial_backoff_s=0.001, max_backoff_s=0.002)
    with pytest.raises(ValidationError):
        for attempt in policy.retrying(lambda _e: None):
            with attempt:
                calls += 1
                raise ValidationError("amount must be > 0")
    assert calls == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attempts": 0}, "attempts"),
        ({"initial_backoff_s": 0.0}, "backoffs"),
        ({"initial_backoff_s": 2.0, "max_backoff_s": 1.0}, "backoffs"),
    ],
)
def test_retry_policy_validates_its_bounds(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
