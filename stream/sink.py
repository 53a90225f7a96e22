"""Where decisions and dead letters go: the `Output` record, the `OutputSink` interface and its
Kafka producer.

The scoring and routing logic talks to an `OutputSink`, so unit tests can use an in-memory one;
integration tests use `KafkaSink` against the real broker. A sink reports every output exactly
once: `output.delivered()` on success, or its failure handler with the translated error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from deadletter.router import DeadLetterRecord
from plumbing.errors import DeliveryError
from plumbing.kafka_errors import delivery_error, stored, translate_kafka_error
from stream.outcomes import OutcomeGroup

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
OutputKind = Literal["decision", "dead_letter", "changelog"]

#: librdkafka's "no partition chosen": its partitioner picks one by key.
ANY_PARTITION = -1
#: When librdkafka's local queue is full, serve delivery reports this long before trying again.
QUEUE_FULL_BACKOFF_S = 0.05


@dataclass(slots=True)
class Output:
    """One record to produce, the consumed record it answers, and the group it completes."""

    kind: OutputKind
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    #: The consumed record this output is the outcome of.
    source: Message
    group: OutcomeGroup
    #: Counted when the group completes: the decision, or the dead letter's reason.
    label: str
    #: The partition to write to; None lets the producer's partitioner choose by key.
    partition: int | None = None

    @classmethod
    def dead_letter(cls, letter: DeadLetterRecord, source: Message, group: OutcomeGroup) -> Output:
        """The output that delivers `letter`, the dead letter of `source`."""
        return cls(
            kind="dead_letter",
            topic=letter.topic,
            key=letter.key,
            value=letter.value,
            headers=letter.headers,
            source=source,
            group=group,
            label=letter.reason,
        )

    def as_dead_letter(self) -> DeadLetterRecord:
        """This dead-letter output as the router knows it."""
        return DeadLetterRecord(self.topic, self.key, self.value, self.headers or [], self.label)

    def delivered(self) -> None:
        self.group.delivered()


FailureHandler = Callable[[Output, DeliveryError], None]


class OutputSink(Protocol):
    """Accepts outputs and reports each one's delivery exactly once."""

    def send(self, output: Output) -> None: ...

    def send_batch(
        self,
        topic: str,
        keys: list[bytes],
        values: Sequence[bytes | None],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
        partition: int | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
    ) -> None:
        """Send many outputs of one kind (a batch's decisions, or its card states for one
        partition), all completing `group`; `output_of(i)` rebuilds the i-th as an `Output`
        should it fail. `headers`: the i-th output's headers; None: none has any."""

    def poll(self) -> None:
        """Serve pending delivery reports without blocking."""

    def flush(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every output to be reported; return how many are left."""
        ...


class KafkaSink:
    """An `OutputSink` over one idempotent confluent-kafka producer."""

    def __init__(self, producer: Producer, on_failure: FailureHandler) -> None:
        self._producer = producer
        self._on_failure = on_failure

    def send(self, output: Output) -> None:
        on_failure = self._on_failure

        def report(error: KafkaError | None, message: Message) -> None:
            if stored(error, message):
                output.delivered()
            else:
                on_failure(output, delivery_error(error, output.topic))

        refused = self._produce(
            output.topic, output.key, output.value, output.headers, report, output.partition
        )
        if refused is not None:
            on_failure(output, translate_kafka_error(refused, output.topic))

    def send_batch(
        self,
        topic: str,
        keys: list[bytes],
        values: Sequence[bytes | None],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
        partition: int | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
    ) -> None:
        # The hot path: one delivery callback shared by the whole batch, no object per record.
        # A failure (rare) finds its output again by key and value.
        on_failure = self._on_failure
        delivered = group.delivered

        def report(error: KafkaError | None, message: Message) -> None:
            if stored(error, message):
                delivered()
            else:
                failed = output_of(index_of(keys, values, message))
                on_failure(failed, delivery_error(error, topic))

        produce = self._produce
        for index, (key, value) in enumerate(zip(keys, values, strict=True)):
            refused = produce(
                topic, key, value, None if headers is None else headers[index], report, partition
            )
            if refused is not None:
                on_failure(output_of(index), translate_kafka_error(refused, topic))

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        report: Callable[[KafkaError | None, Message], None],
        partition: int | None = None,
    ) -> KafkaError | None:
        return produce(self._producer, topic, key, value, headers, report, partition)

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))


def index_of(keys: Sequence[bytes], values: Sequence[bytes | None], message: Message) -> int:
    """Where a reported message stands in the batch it was sent with (failure path only)."""
    key, value = message.key(), message.value()
    return next(i for i, pair in enumerate(zip(keys, values, strict=True)) if pair == (key, value))


def produce(
    producer: Producer,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
    report: Callable[[KafkaError | None, Message], None],
    partition: int | None = None,
) -> KafkaError | None:
    """Hand one record to librdkafka; return its error if librdkafka refuses it at once.

    A full local queue means the broker is slower than we are: serving delivery reports frees
    room, and the record is tried again, never dropped."""
    while True:
        try:
            producer.produce(
                topic,
                value,
                key,
                headers=cast(Any, headers),
                on_delivery=report,
                partition=ANY_PARTITION if partition is None else partition,
            )
            return None
        except BufferError:
            producer.poll(QUEUE_FULL_BACKOFF_S)
        except KafkaException as exc:
            return cast(KafkaError, exc.args[0])
