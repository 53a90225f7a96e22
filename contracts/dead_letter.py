"""The dead-letter record: the original key, value and headers, plus `dlq.*` headers that say why.

Header contract (docs/contracts.md), values are UTF-8 strings:
  dlq.reason                 decode | validate | score | produce
  dlq.error                  exception class
  dlq.message                human-readable cause, at most MAX_MESSAGE_CHARS
  dlq.original.topic / .partition / .offset / .timestamp
  dlq.attempts               how many times the record was tried
  dlq.failed_at              epoch ms
  dlq.service                consumer group and instance
  dlq.model_version          where a model was involved
  dlq.stacktrace             where code failed (scoring), at most MAX_STACKTRACE_CHARS
  dlq.value.dropped          the broker refused the dead letter as too large: the original
                             value's size in bytes (the dead letter then has no value)
  dlq.key.dropped            the same for the key, when the key alone made it too large
  dlq.headers.dropped        the original headers are missing: why ("N headers, B bytes" when
                             they made it too large, "unreadable" when a header key is not UTF-8)
  dlq.original.header.<name> an original header named `dlq.*`, kept under this prefix: incoming
                             `dlq.*` headers are never trusted as the service's own

A replayed record carries the original key, value and headers (`dlq.original.header.<name>`
back under `<name>`), without any other `dlq.*` header, plus
  dlq.replayed_from          "<dead-letter topic>/<partition>/<offset>" of the dead letter
so that a record that fails again is recognisable in its new dead letter (informational only:
it is the one incoming `dlq.*` header kept as it is).
"""

from __future__ import annotations

import traceback
from typing import NamedTuple, cast

from confluent_kafka import Message

from contracts.transaction import MAX_EVENT_TIME_MS
from plumbing.kafka_settings import redacted_prefix

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
KEY_DROPPED = "dlq.key.dropped"
HEADERS_DROPPED = "dlq.headers.dropped"
ORIGINAL_HEADER_PREFIX = "dlq.original.header."
#: The value of HEADERS_DROPPED when the client could not read the headers at all.
UNREADABLE_HEADERS = "unreadable: a header key is not UTF-8"
#: Dead letters carrying one of these lack part of the original record: replay skips them.
INCOMPLETE_MARKERS = (VALUE_DROPPED, KEY_DROPPED, HEADERS_DROPPED)

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
    #: None when the client could not read them (a header key that is not UTF-8).
    headers: Headers | None


def _redacted(text: str) -> str:
    """`text` redacted (plumbing.kafka_settings.redact_urls), read only as far as a bounded
    header keeps, plus a character to tell that it was cut."""
    return redacted_prefix(text, MAX_STACKTRACE_CHARS + 1)


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

    The source's headers come first, in order; one named `dlq.*` is renamed
    `dlq.original.header.<name>` (only `dlq.replayed_from` keeps its name), so no producer can
    forge the service's metadata.
    """
    added: dict[str, str] = {
        REASON: reason,
        ERROR: type(error).__name__,
        MESSAGE: _bounded(_redacted(str(error)) or type(error).__name__, MAX_MESSAGE_CHARS),
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
        trace = _redacted("".join(traceback.format_exception(error)))
        added[STACKTRACE] = _bounded(trace, MAX_STACKTRACE_CHARS)
    if source.headers is None:
        added[HEADERS_DROPPED] = UNREADABLE_HEADERS
    kept = [(_quarantined(k), v) for k, v in source.headers or []]
    return kept + [(k, v.encode("utf-8")) for k, v in added.items()]


def _quarantined(name: str) -> str:
    if name.startswith(HEADER_PREFIX) and name != REPLAYED_FROM:
        return ORIGINAL_HEADER_PREFIX + name
    return name


#: What a record whose headers could not be read carries from then on (`forget_unreadable`).
_UNREADABLE_MARKER: list[tuple[str, str | bytes | None]] = [("dlq.headers.unreadable", b"")]


def read_headers(message: Message) -> Headers | None:
    """The record's headers, or None when the client cannot decode them.

    librdkafka hands header keys to Python as text; a key that is not UTF-8 makes
    `Message.headers()` raise (a SystemError wrapping the UnicodeDecodeError), and the raw bytes
    cannot be had any other way.
    """
    try:
        headers = message.headers()
    except (SystemError, UnicodeDecodeError):
        forget_unreadable(message)
        return None
    if headers is _UNREADABLE_MARKER:
        return None
    return cast(Headers, list(headers or []))


def forget_unreadable(message: Message) -> None:
    """Call once `message.headers()` raised. The client keeps the list it was building, with a
    NULL where the key failed, and hands it to the next caller, whose first look at that key
    crashes the interpreter (a service died on SIGSEGV). Replaced by a marker, the record's
    headers can be asked again by every reader (trace context, dead letters): `read_headers`
    gives None for it, as the first time."""
    message.set_headers(_UNREADABLE_MARKER)


def decode_headers(headers: Headers | None) -> dict[str, str]:
    """Headers as text, for display (the last value wins when a key repeats)."""
    return {k: (v or b"").decode("utf-8", "replace") for k, v in headers or []}


def replay_headers(headers: Headers | None, dlq_topic: str, partition: int, offset: int) -> Headers:
    """The headers of the replay of the dead letter at `dlq_topic`/`partition`/`offset`.

    The original headers come back in order, a quarantined `dlq.original.header.<name>` under
    its own name again; every other `dlq.*` header is removed (a replayed record is an original
    record again, and an earlier `dlq.replayed_from` would name the wrong dead letter).
    """
    kept: Headers = []
    for name, value in headers or []:
        if name.startswith(ORIGINAL_HEADER_PREFIX):
            kept.append((name[len(ORIGINAL_HEADER_PREFIX) :], value))
        elif not name.startswith(HEADER_PREFIX):
            kept.append((name, value))
    return [*kept, (REPLAYED_FROM, f"{dlq_topic}/{partition}/{offset}".encode())]


def headers_size(headers: Headers | None) -> int:
    """Bytes that headers add to a record, as librdkafka counts them against message.max.bytes."""
    return sum(len(name.encode()) + len(value or b"") for name, value in headers or [])


def failed_at_ms(headers: dict[str, str]) -> int | None:
    """The `dlq.failed_at` of decoded headers, or None when it is missing or not epoch ms."""
    text = headers.get(FAILED_AT, "")
    if not (text.isascii() and text.isdecimal()) or len(text) > len(str(MAX_EVENT_TIME_MS)):
        return None
    when = int(text)
    return when if when <= MAX_EVENT_TIME_MS else None
