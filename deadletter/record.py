"""The dead-letter record: the original key, value and headers, plus `dlq.*` headers that say why.

Header contract (DESIGN.md), values are UTF-8 strings:
  dlq.reason                 decode | validate | score | produce
  dlq.error                  exception class
  dlq.message                human-readable cause, at most MAX_MESSAGE_CHARS
  dlq.original.topic / .partition / .offset / .timestamp
  dlq.attempts               how many times the record was tried
  dlq.failed_at              epoch ms
  dlq.service                consumer group and instance
  dlq.model_version          where a model was involved
  dlq.stacktrace             where code failed (scoring), at most MAX_STACKTRACE_CHARS
  dlq.value.dropped          only when the broker refused the dead letter as too large: the
                             original value's size in bytes (the dead letter then has no value)

A replayed record carries the original key, value and headers without any `dlq.*` header, plus
  dlq.replayed_from          "<dead-letter topic>/<partition>/<offset>" of the dead letter
so that a record that fails again is recognisable in its new dead letter.
"""

from __future__ import annotations

import traceback
from typing import NamedTuple

HEADER_PREFIX = "dlq."
REASON = "dlq.reason"
ERROR = "dlq.error"
MESSAGE = "dlq.message"
ORIGINAL_TOPIC = "dlq.original.topic"
ORIGINAL_PARTITION = "dlq.original.partition"
ORIGINAL_OFFSET = "dlq.original.offset"
ORIGINAL_TIMESTAMP = "dlq.original.timestamp"
ATTEMPTS = "dlq.attempts"
FAILED_AT = "dlq.failed_at"
SERVICE = "dlq.service"
MODEL_VERSION = "dlq.model_version"
STACKTRACE = "dlq.stacktrace"
REPLAYED_FROM = "dlq.replayed_from"
VALUE_DROPPED = "dlq.value.dropped"

#: Bounds keep one hostile record from producing a dead letter larger than the record itself.
MAX_MESSAGE_CHARS = 1_000
MAX_STACKTRACE_CHARS = 4_000

Headers = list[tuple[str, bytes]]


class SourceRecord(NamedTuple):
    """Where a failed record came from, and its original bytes."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "… [truncated]"


def dead_letter_headers(
    source: SourceRecord,
    error: BaseException,
    *,
    reason: str,
    attempts: int,
    service: str,
    failed_at_ms: int,
    model_version: str | None = None,
    with_stacktrace: bool = False,
) -> Headers:
    """The headers of the dead letter for `source`: its own headers, then the `dlq.*` ones.

    Headers of the source that collide with a `dlq.*` name set here are dropped, so a dead
    letter never carries two different reasons.
    """
    added: dict[str, str] = {
        REASON: reason,
        ERROR: type(error).__name__,
        MESSAGE: _bounded(str(error) or type(error).__name__, MAX_MESSAGE_CHARS),
        ORIGINAL_TOPIC: source.topic,
        ORIGINAL_PARTITION: str(source.partition),
        ORIGINAL_OFFSET: str(source.offset),
        ORIGINAL_TIMESTAMP: str(source.timestamp_ms),
        ATTEMPTS: str(attempts),
        FAILED_AT: str(failed_at_ms),
        SERVICE: service,
    }
    if model_version is not None:
        added[MODEL_VERSION] = model_version
    if with_stacktrace and error.__traceback__ is not None:
        trace = "".join(traceback.format_exception(error))
        added[STACKTRACE] = _bounded(trace, MAX_STACKTRACE_CHARS)
    kept = [(k, v) for k, v in source.headers if k not in added]
    return kept + [(k, v.encode("utf-8")) for k, v in added.items()]


def decode_headers(headers: Headers | None) -> dict[str, str]:
    """Headers as text, for display (the last value wins when a key repeats)."""
    return {k: (v or b"").decode("utf-8", "replace") for k, v in headers or []}


def replay_headers(headers: Headers | None, dlq_topic: str, partition: int, offset: int) -> Headers:
    """The headers of the replay of the dead letter at `dlq_topic`/`partition`/`offset`.

    Every `dlq.*` header is removed (a replayed record is an original record again, and an
    earlier `dlq.replayed_from` would name the wrong dead letter); the others are kept in order.
    """
    kept = [(k, v) for k, v in headers or [] if not k.startswith(HEADER_PREFIX)]
    return [*kept, (REPLAYED_FROM, f"{dlq_topic}/{partition}/{offset}".encode())]


def failed_at_ms(headers: dict[str, str]) -> int | None:
    """The `dlq.failed_at` of decoded headers, or None when it is missing or not epoch ms."""
    text = headers.get(FAILED_AT, "")
    return int(text) if text.isdecimal() else None
