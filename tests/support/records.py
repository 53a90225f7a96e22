"""A consumed record's key, value and headers, which confluent-kafka types as optional: a test
reads them here, and fails naming the record where one is missing."""

from __future__ import annotations

from typing import Any, cast

from confluent_kafka import Message


def key_of(message: Message) -> bytes:
    """The record's key (AssertionError for a record without one)."""
    key = message.key()
    assert key is not None, f"no key at {_place(message)}"
    return key


def value_of(message: Message) -> bytes:
    """The record's value (AssertionError for a tombstone)."""
    value = message.value()
    assert value is not None, f"no value at {_place(message)}"
    return value


def offset_of(message: Message) -> int:
    """The record's offset (AssertionError for a message that has none, like a produce error)."""
    offset = message.offset()
    assert offset is not None, f"no offset at {message.topic()}/{message.partition()}"
    return offset


def raw_headers(message: Message) -> list[tuple[str, bytes]]:
    """The record's headers in order (empty when it has none). A consumed record's headers are
    always a list of (name, bytes) pairs; the client's type also covers what it accepts to send."""
    return cast(list[tuple[str, bytes]], message.headers() or [])


def headers_of(message: Message) -> dict[str, str]:
    """The record's headers as UTF-8 text (the last value wins when a name repeats)."""
    return {name: value.decode() for name, value in raw_headers(message)}


def _place(message: Message) -> str:
    return f"{message.topic()}/{message.partition()}/{message.offset()}"


class UnreadableHeaders:
    """A consumed record whose header key is not UTF-8, as the real client behaves (seen
    against the broker): `headers()` raises, and asked again it hands back the list it was
    building with a NULL key, whose first use crashes the interpreter, unless `set_headers`
    replaced it. This fake fails the test instead of crashing. Wraps `message`, if given, for
    everything else."""

    def __init__(self, message: Message | None = None) -> None:
        self._message = message
        self.asked = 0
        self._replaced: list[tuple[str, bytes]] | None = None

    def headers(self) -> list[tuple[str, bytes]] | None:
        self.asked += 1
        if self._replaced is not None:
            return self._replaced
        assert self.asked == 1, "headers() asked again after it raised: a NULL key, a crash"
        raise SystemError("<built-in method headers> returned a result with an exception set")

    def set_headers(self, headers: list[tuple[str, bytes]]) -> None:
        self._replaced = headers

    def __getattr__(self, name: str) -> Any:
        if self._message is None:
            raise AttributeError(name)
        return getattr(self._message, name)
