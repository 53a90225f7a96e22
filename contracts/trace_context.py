"""W3C trace context on records: which headers a transaction's outputs carry, and what a
`traceparent` says.

Header contract (docs/contracts.md, "Trace context"):
  traceparent   copied from a transaction to its decision, byte for byte
  tracestate    the same, when present
A dead letter keeps every original header (contracts/dead_letter.py), these two included.

Key design decisions:
- A value travels unchanged, valid or not: the service is one hop of someone else's trace, and
  W3C leaves a value that does not parse to its reader (who starts a new trace). Checking it
  would cost a parse per record on the hot path, for nothing the service itself needs; only the
  batch span (stream/tracing.py), when it is on, parses them.
- A value longer than MAX_HEADER_BYTES does not travel: no valid one is that long, and a hostile
  one must not make a decision too large for the broker (it would be dead-lettered instead).
- When a name repeats, the last value counts (Kafka's `lastHeader`, as OpenTelemetry's Kafka
  instrumentations read it), and only that one travels.
- Names match exactly, in lower case, as W3C propagators write them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, cast

from confluent_kafka import Message

from contracts.dead_letter import Headers, forget_unreadable, read_headers

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: A version-00 traceparent has 55 characters; W3C asks that at least 512 of a tracestate be
#: kept. Twice that bounds what one decision can gain.
MAX_HEADER_BYTES = 1_024

#: version "-" trace-id "-" parent-id "-" trace-flags, then, from a later version on, more
#: fields after a "-" (W3C Trace Context, section 3.2). Lower-case hex only.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_INVALID_VERSION = b"ff"


class TraceParent(NamedTuple):
    """What a valid `traceparent` names: the caller's trace, its span, and the trace flags."""

    trace_id: int
    span_id: int
    flags: int


def trace_headers(message: Message) -> Headers | None:
    """The trace-context headers the outputs of `message` carry; None when it has none.

    A header key that is not UTF-8 makes the client raise (see `read_headers`): such a record
    carries nothing."""
    headers = read_headers(message)
    return None if headers is None else trace_context(headers)


def batch_trace_headers(messages: Sequence[Message]) -> list[Headers | None] | None:
    """`trace_headers` of each of `messages`, in order; None when none carries trace context.

    On the hot path: when no record has headers (the common case) this costs one call into the
    client per record, and no Python call. A record whose header key is not UTF-8 makes the
    client raise: it carries nothing, its headers are made safe for every later reader
    (`forget_unreadable`), and the records after it are read one by one."""
    every: list[Headers | None] = []
    append = every.append
    try:
        for message in messages:
            append(cast(Headers | None, message.headers()))
    except (SystemError, UnicodeDecodeError):
        failed = len(every)
        forget_unreadable(messages[failed])
        contexts = [None if headers is None else trace_context(headers) for headers in every]
        contexts.append(None)
        contexts.extend(trace_headers(message) for message in messages[failed + 1 :])
        return contexts if any(contexts) else None
    if not any(every):
        return None
    contexts = [None if headers is None else trace_context(headers) for headers in every]
    return contexts if any(contexts) else None


def trace_context(headers: Headers) -> Headers | None:
    """The `traceparent` and `tracestate` of `headers` that travel (see the module docstring),
    in that order; None when neither does."""
    parent: bytes | None = None
    state: bytes | None = None
    for name, value in headers:
        if name == TRACEPARENT:
            parent = value
        elif name == TRACESTATE:
            state = value
    carried = []
    if parent is not None and len(parent) <= MAX_HEADER_BYTES:
        carried.append((TRACEPARENT, parent))
    if state is not None and len(state) <= MAX_HEADER_BYTES:
        carried.append((TRACESTATE, state))
    return carried or None


def parse_traceparent(value: bytes) -> TraceParent | None:
    """`value` as W3C Trace Context defines a traceparent, or None when it is not one: a
    version that is not two lower-case hex digits or is "ff", a version 00 with anything after
    its flags, an all-zero trace or span id."""
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == _INVALID_VERSION or (version == b"00" and rest is not None):
        return None
    parsed = TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))
    return parsed if parsed.trace_id and parsed.span_id else None
