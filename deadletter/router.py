"""Routing of failed records to the dead-letter topic: what each dead letter holds.

The router turns a consumed record and the error that failed it into a `DeadLetterRecord` (the
topic, key, value and headers to produce); the stream delivers it like any other output. When
the broker refuses a dead letter as too large, `shrink` gives the smaller form to send instead:
without the value first, then without the key and the original headers as well. A form that
cannot shrink further is never altered again, so a refusal that cannot change is not retried in
a loop of ever-growing headers.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from confluent_kafka import Message

from contracts.dead_letter import (
    HEADER_PREFIX,
    HEADERS_DROPPED,
    KEY_DROPPED,
    ORIGINAL_HEADER_PREFIX,
    VALUE_DROPPED,
    Headers,
    SourceRecord,
    dead_letter_headers,
    headers_size,
    read_headers,
)
from contracts.offsets import position_of
from plumbing.errors import DeliveryError, RecordError, ScoreError

#: What the broker and librdkafka count beyond key, value and headers (record framing, batch
#: header): a shrunk dead letter stays this far under the size limit.
RECORD_OVERHEAD_BYTES = 1_024


class DeadLetterRecord(NamedTuple):
    """One dead letter to produce, and the reason it is counted under."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    reason: str


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
        headers=read_headers(message),
    )


class DeadLetterRouter:
    """Turns a record that cannot be decided into its dead letter."""

    def __init__(self, topic: str, service: str) -> None:
        self.topic = topic
        self._service = service

    def dead_letter(
        self,
        message: Message,
        error: RecordError | DeliveryError,
        *,
        attempts: int = 1,
        model_version: str | None = None,
    ) -> DeadLetterRecord:
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
        return DeadLetterRecord(self.topic, source.key, source.value, headers, error.reason)


def shrink(letter: DeadLetterRecord, max_bytes: int) -> DeadLetterRecord | None:
    """A smaller form of a dead letter the broker refused as too large, or None when it has
    nothing left to drop.

    The first refusal drops the value, and also the key and then the original headers if they
    alone reach `max_bytes`; a second refusal drops all three. Each drop is recorded in a
    header with what was dropped, so the dead letter still says where the record was and why.
    """
    own = [(k, v) for k, v in letter.headers if _is_service_header(k)]
    original = [(k, v) for k, v in letter.headers if not _is_service_header(k)]
    dropped_before = any(k == VALUE_DROPPED for k, _ in own)
    if dropped_before and letter.key is None and not original:
        return None
    budget = max_bytes - RECORD_OVERHEAD_BYTES
    key = letter.key
    added: Headers = []
    if not dropped_before:
        added.append((VALUE_DROPPED, str(len(letter.value or b"")).encode()))
    if key is not None and (dropped_before or len(key) + headers_size(letter.headers) > budget):
        added.append((KEY_DROPPED, str(len(key)).encode()))
        key = None
    if original and (dropped_before or headers_size(letter.headers) > budget):
        summary = f"{len(original)} headers, {headers_size(original)} bytes"
        added.append((HEADERS_DROPPED, summary.encode()))
        original = []
    return letter._replace(key=key, value=None, headers=[*original, *own, *added])


def _is_service_header(name: str) -> bool:
    return name.startswith(HEADER_PREFIX) and not name.startswith(ORIGINAL_HEADER_PREFIX)
