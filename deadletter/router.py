"""Routing of failed records to the dead-letter topic: builds each dead letter's output."""

from __future__ import annotations

import time
from typing import cast

from confluent_kafka import Message

from deadletter.record import VALUE_DROPPED, Headers, SourceRecord, dead_letter_headers
from stream.errors import DeliveryError, RecordError, ScoreError
from stream.offsets import SourceOffset
from stream.outcomes import OutcomeGroup
from stream.sink import Output


def position_of(message: Message) -> SourceOffset:
    """Partition and offset of a consumed record (librdkafka always sets them on one)."""
    return (cast(str, message.topic()), cast(int, message.partition())), cast(int, message.offset())


def source_of(message: Message) -> SourceRecord:
    """The original record's coordinates and bytes, as a dead letter carries them."""
    (topic, partition), offset = position_of(message)
    return SourceRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=cast(Headers, list(message.headers() or [])),
    )


class DeadLetterRouter:
    """Turns a record that cannot be decided into its dead-letter output."""

    def __init__(self, topic: str, service: str) -> None:
        self.topic = topic
        self._service = service

    def dead_letter(
        self,
        message: Message,
        error: RecordError | DeliveryError,
        group: OutcomeGroup,
        *,
        attempts: int = 1,
        model_version: str | None = None,
    ) -> Output:
        """The dead letter of `message`: its original key, value and headers, plus why."""
        source = source_of(message)
        # A decode or validation message says all there is; a trace helps where code failed.
        headers = dead_letter_headers(
            source,
            error,
            reason=error.reason,
            attempts=attempts,
            service=self._service,
            failed_at_ms=time.time_ns() // 1_000_000,
            model_version=model_version,
            with_stacktrace=isinstance(error, ScoreError),
        )
        return Output(
            "dead_letter",
            self.topic,
            source.key,
            source.value,
            headers,
            message,
            group,
            error.reason,
        )

    @staticmethod
    def without_value(output: Output) -> Output:
        """The same dead letter without its value, for one the broker refuses as too large."""
        size = len(output.value or b"")
        headers = [*(output.headers or []), (VALUE_DROPPED, str(size).encode())]
        return Output(
            "dead_letter", output.topic, output.key, None, headers, output.source, output.group,
            output.label,
        )  # fmt: skip
