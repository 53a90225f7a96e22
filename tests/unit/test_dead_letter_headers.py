"""The dead-letter header contract: what the service adds, what it never trusts, and what a
replay restores."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.dead_letter import (
    HEADERS_DROPPED,
    ORIGINAL_HEADER_PREFIX,
    REASON,
    REPLAYED_FROM,
    UNREADABLE_HEADERS,
    VALUE_DROPPED,
    SourceRecord,
    dead_letter_headers,
    failed_at_ms,
    replay_headers,
)
from deadletter.inspect import inspect, printable, render_text
from plumbing.errors import ValidationError

SERVICE_HEADERS = {
    "dlq.reason",
    "dlq.error",
    "dlq.message",
    "dlq.original.topic",
    "dlq.original.partition",
    "dlq.original.offset",
    "dlq.original.timestamp",
    "dlq.attempts",
    "dlq.failed_at",
    "dlq.service",
}


def source(headers: list[tuple[str, bytes]] | None) -> SourceRecord:
    return SourceRecord("transactions", 2, 41, 1_000, b"card", b"{broken", headers)


def letter_headers(headers: list[tuple[str, bytes]] | None) -> list[tuple[str, bytes]]:
    return dead_letter_headers(
        source(headers),
        ValidationError("amount: expected a number"),
        reason="validate",
        attempts=1,
        service="fraud-scorer/a",
        failed_at_ms=2_000,
    )


def test_a_forged_dlq_header_is_kept_under_another_name_and_restored_on_replay() -> None:
    # Finding 9 of the review: a source header dlq.value.dropped made replay skip a dead
    # letter that still had its value.
    forged = [("trace", b"t-1"), (VALUE_DROPPED, b"5"), (REASON, b"fake")]
    headers = letter_headers(forged)
    names = [name for name, _ in headers]
    assert VALUE_DROPPED not in names
    assert (ORIGINAL_HEADER_PREFIX + VALUE_DROPPED, b"5") in headers
    assert dict(headers)[REASON] == b"validate", "the service's own reason, once"
    assert names.count(REASON) == 1
    assert replay_headers(headers, "tx.dlq", 0, 7) == [
        *forged,
        (REPLAYED_FROM, b"tx.dlq/0/7"),
    ]


dlq_like_names = st.sampled_from(
    [VALUE_DROPPED, REASON, "dlq.stacktrace", "dlq.x", "dlq.", "trace", "a", REPLAYED_FROM]
)


@given(st.lists(st.tuples(dlq_like_names | st.text(max_size=12), st.binary(max_size=8))))
def test_only_the_service_writes_service_headers_and_replay_gives_the_originals_back(
    original: list[tuple[str, bytes]],
) -> None:
    headers = letter_headers(original)
    service_written = [
        name
        for name, _ in headers
        if name.startswith("dlq.")
        and not name.startswith(ORIGINAL_HEADER_PREFIX)
        and name != REPLAYED_FROM
    ]
    assert sorted(service_written) == sorted(SERVICE_HEADERS)
    replayed = replay_headers(headers, "tx.dlq", 1, 2)
    # An earlier replay's mark would name the wrong dead letter: the new one replaces it.
    assert replayed[:-1] == [(k, v) for k, v in original if k != REPLAYED_FROM]
    assert replayed[-1] == (REPLAYED_FROM, b"tx.dlq/1/2")


def test_headers_the_client_cannot_read_are_reported_missing() -> None:
    headers = dict(letter_headers(None))
    assert headers[HEADERS_DROPPED] == UNREADABLE_HEADERS.encode()
    assert headers["dlq.original.offset"] == b"41"


def test_failed_at_beyond_any_calendar_is_not_a_time() -> None:
    assert failed_at_ms({"dlq.failed_at": "9" * 400}) is None
    assert failed_at_ms({"dlq.failed_at": "٣٣"}) is None, "digits, but not ASCII ones"
    assert failed_at_ms({"dlq.failed_at": "253402300799999"}) == 253_402_300_799_999


def test_inspect_text_escapes_terminal_control_sequences() -> None:
    # Finding 12 of the review: header values went to the terminal raw.
    assert printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert printable("a\u202eb") == "a\\u202eb", "no right-to-left override"
    assert printable("déjà vu €") == "déjà vu €"
    report = {
        "topic": "tx.dlq",
        "total": 1,
        "skipped_by_filter": 0,
        "first_failed_at": 10**20,
        "last_failed_at": 10**20,
        "by_reason": {"validate": 1},
        "by_error": {"X": 1},
        "by_original_topic": {"tx": 1},
        "records": [
            {
                "partition": 0,
                "offset": 1,
                "key": "k",
                "value": "\x1b]0;pwned\x07",
                "headers": {"dlq.message\x1b[2J": "\x1b[2Jgone"},
            }
        ],
    }
    text = render_text(report)
    assert "\x1b" not in text and "\x07" not in text
    assert "100000000000000000000 (epoch ms)" in text, "no OSError on a huge time"
    assert inspect is not None
