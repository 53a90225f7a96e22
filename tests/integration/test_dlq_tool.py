"""`fraud-dlq inspect` and `fraud-dlq replay` against the real broker.

Dead letters are produced straight to each test's dead-letter topic, with headers built by the
service's own `dead_letter_headers`, so every case is exact and fast; one test lets the service
dead-letter records, replays them and sees them fail again, recognisably.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID
from confluent_kafka.admin import NewTopic

from contracts.dead_letter import (
    HEADER_PREFIX,
    REPLAYED_FROM,
    VALUE_DROPPED,
    SourceRecord,
    dead_letter_headers,
)
from plumbing.errors import DecodeError, RecordError, ScoreError, ValidationError
from tests.integration.conftest import (
    BOOTSTRAP,
    REPO,
    RecordWithHeaders,
    committed_offsets,
    end_offsets,
    produce,
    produce_to_partition,
    read_topic,
    run_tool,
)
from tests.integration.raw_produce import produce_raw
from tests.support.network import free_port
from tests.support.records import raw_headers

ERRORS: dict[str, type[RecordError]] = {
    "decode": DecodeError,
    "validate": ValidationError,
    "score": ScoreError,
}
#: A topic's record size limit that a dead letter with a larger value exceeds.
TOO_SMALL_BYTES = 2_000
#: Headers of the original records, which a replay must keep.
ORIGINAL_HEADERS = [("trace-id", b"t-42"), ("source", b"pos-gateway")]


def dead_letter(
    original_topic: str,
    n: int,
    *,
    reason: str = "decode",
    failed_at_ms: int = 1_000,
    value: bytes | None = None,
) -> RecordWithHeaders:
    """The dead letter of the n-th record of `original_topic`, as the service would write it."""
    key = f"card-{n}".encode()
    value = f'{{"broken": {n}'.encode() if value is None else value
    source = SourceRecord(original_topic, 0, n, 500, key, value, list(ORIGINAL_HEADERS))
    headers = dead_letter_headers(
        source,
        ERRORS[reason](f"record {n} is bad"),
        reason=reason,
        attempts=1,
        service="fraud-scorer/test",
        failed_at_ms=failed_at_ms,
    )
    return key, value, headers


def dlq(topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run fraud-dlq on the dead-letter topic `topic`."""
    return run_tool("deadletter.cli", "--bootstrap-servers", BOOTSTRAP, "--dlq-topic", topic, *args)


def dlq_json(topic: str, *args: str) -> dict[str, Any]:
    """Run fraud-dlq with --json, expect success, and return its JSON output."""
    result = dlq(topic, *args, "--json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def replayed_from(messages: list[Any]) -> Counter[str]:
    """How many times each dead letter (by its dlq.replayed_from) arrived."""
    return Counter(dict(raw_headers(m))[REPLAYED_FROM].decode() for m in messages)


def test_inspect_filters_by_reason_error_time_topic_and_offsets(topics_factory):
    topics = topics_factory(partitions=2)
    produce_to_partition(
        topics.dlq,
        0,
        [
            dead_letter(topics.input, 0, reason="decode", failed_at_ms=1_000),
            dead_letter(topics.input, 1, reason="decode", failed_at_ms=2_000),
            dead_letter(topics.input, 2, reason="decode", failed_at_ms=3_000),
            dead_letter(topics.input, 3, reason="validate", failed_at_ms=4_000),
            dead_letter(topics.input, 4, reason="validate", failed_at_ms=5_000),
        ],
    )
    produce_to_partition(
        topics.dlq,
        1,
        [
            dead_letter(topics.input, 5, reason="score", failed_at_ms=6_000),
            dead_letter("other-topic", 6, reason="score", failed_at_ms=7_000),
        ],
    )
    cases: list[tuple[list[str], dict[str, int]]] = [
        ([], {"decode": 3, "validate": 2, "score": 2}),
        (["--reason", "validate", "--reason", "score"], {"validate": 2, "score": 2}),
        (["--error", "ScoreError"], {"score": 2}),
        (["--original-topic", "other-topic"], {"score": 1}),
        (["--since", "2000", "--until", "5000"], {"decode": 2, "validate": 1}),
        (["--since", "1970-01-01T00:00:06Z"], {"score": 2}),
        (["--until", "1970-01-01T01:00:02+01:00"], {"decode": 1}),
        (
            ["--partition", "0", "--from-offset", "2", "--to-offset", "3"],
            {"decode": 1, "validate": 1},
        ),
        (["--partition", "1", "--reason", "decode"], {}),
    ]
    for filters, by_reason in cases:
        report = dlq_json(topics.dlq, "inspect", "--show", "10", *filters)
        total = sum(by_reason.values())
        assert (report["total"], report["by_reason"]) == (total, by_reason), filters
        assert len(report["records"]) == total

    window = dlq_json(topics.dlq, "inspect", "--since", "2000", "--until", "5000")
    assert (window["first_failed_at"], window["last_failed_at"]) == (2_000, 4_000)
    assert window["skipped_by_filter"] == 4
    offsets = dlq_json(
        topics.dlq,
        "inspect",
        "--show",
        "10",
        "--partition",
        "0",
        "--from-offset",
        "2",
        "--to-offset",
        "3",
    )
    assert [(r["partition"], r["offset"]) for r in offsets["records"]] == [(0, 2), (0, 3)]
    assert offsets["records"][0]["headers"]["dlq.original.offset"] == "2"


@pytest.mark.parametrize("destination", ["original", "other"])
def test_replay_reproduces_bytes_key_and_headers_with_replayed_from(topics_factory, destination):
    topics = topics_factory(partitions=2)
    binary = bytes(range(256))
    letters = [dead_letter(topics.input, n) for n in range(3)]
    letters.append(dead_letter(topics.input, 3, value=binary))
    # A dead letter of a record that was itself replayed once: the old marker must go.
    _, replayed_value, replayed_headers = dead_letter(topics.input, 4)
    letters.append((None, replayed_value, [(REPLAYED_FROM, b"old.dlq/0/9"), *replayed_headers]))
    produce_to_partition(topics.dlq, 1, letters)
    target = topics.input if destination == "original" else topics.output
    to = ["--to", target] if destination == "other" else []

    summary = dlq_json(topics.dlq, "replay", "--group", f"g-{topics.dlq}", "--quiet", *to)

    assert summary["replayed"] == summary["selected"] == 5
    assert summary["to_topics"] == {target: 5} and summary["failed"] == 0
    replayed = {dict(raw_headers(m))[REPLAYED_FROM].decode(): m for m in read_topic(target, 5)}
    assert len(replayed) == 5
    for offset, (key, value, _) in enumerate(letters):
        message = replayed[f"{topics.dlq}/1/{offset}"]
        assert (message.key(), message.value()) == (key, value)
        kept = [(k, v) for k, v in raw_headers(message) if k != REPLAYED_FROM]
        assert kept == ORIGINAL_HEADERS
        assert not any(k.startswith(HEADER_PREFIX) for k, _ in kept)
        assert [k for k, _ in raw_headers(message)].count(REPLAYED_FROM) == 1


def test_dry_run_produces_and_commits_nothing(topics_factory):
    topics = topics_factory(partitions=2)
    produce_to_partition(topics.dlq, 0, [dead_letter(topics.input, n) for n in range(4)])
    produce_to_partition(topics.dlq, 1, [dead_letter(topics.input, n) for n in range(4, 6)])
    group = f"g-{topics.dlq}"

    summary = dlq_json(topics.dlq, "replay", "--group", group, "--dry-run")

    assert summary["dry_run"] is True
    assert (summary["selected"], summary["replayed"], summary["to_topics"]) == (
        6,
        0,
        {topics.input: 6},
    )
    assert end_offsets(topics.input, 2) == {0: 0, 1: 0}
    assert all(offset < 0 for offset in committed_offsets(group, topics.dlq, 2).values())
    # The real run after it still finds everything to do.
    assert dlq_json(topics.dlq, "replay", "--group", group, "--quiet")["replayed"] == 6


def test_replay_with_max_records_resumes_and_replays_each_record_once(topics_factory):
    topics = topics_factory(partitions=2)
    reasons = ["decode", "validate", "decode", "decode", "score", "decode"]
    produce_to_partition(
        topics.dlq, 0, [dead_letter(topics.input, n, reason=r) for n, r in enumerate(reasons)]
    )
    produce_to_partition(
        topics.dlq, 1, [dead_letter(topics.input, n, reason="decode") for n in range(6, 10)]
    )
    group = f"g-{topics.dlq}"
    replay = ("replay", "--group", group, "--reason", "decode", "--quiet")

    runs = [dlq_json(topics.dlq, *replay, "--max-records", "3") for _ in range(2)]
    last = dlq_json(topics.dlq, *replay)
    again = dlq_json(topics.dlq, *replay)

    assert [r["replayed"] for r in runs] == [3, 3]
    assert [r["stopped_by"] for r in runs] == ["max-records", "max-records"]
    assert (last["replayed"], last["stopped_by"]) == (2, None)
    assert (again["read"], again["replayed"]) == (0, 0)
    counts = replayed_from(read_topic(topics.input, 8))
    assert set(counts.values()) == {1}
    expected = {f"{topics.dlq}/0/{n}" for n, r in enumerate(reasons) if r == "decode"}
    expected |= {f"{topics.dlq}/1/{n}" for n in range(4)}
    assert set(counts) == expected
    assert committed_offsets(group, topics.dlq, 2) == {0: 6, 1: 4}


def test_replay_interrupted_by_sigterm_resumes_without_duplicates(topics_factory):
    topics = topics_factory(partitions=1)
    total = 3_000
    produce_to_partition(topics.dlq, 0, [dead_letter(topics.input, n) for n in range(total)])
    group = f"g-{topics.dlq}"
    replay = ["replay", "--group", group]
    command = [sys.executable, "-m", "deadletter.cli", "--bootstrap-servers", BOOTSTRAP]
    process = subprocess.Popen(
        [*command, "--dlq-topic", topics.dlq, *replay],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    first_progress = process.stderr.readline()  # the replay has started
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=120)

    # Wherever the signal landed, it is a clean stop or a finished run, never a traceback.
    assert process.returncode in (0, 128 + signal.SIGTERM), first_progress + rest
    assert "Traceback" not in rest
    assert dlq(topics.dlq, *replay, "--quiet").returncode == 0
    counts = replayed_from(read_topic(topics.input, total))
    assert len(counts) == total and set(counts.values()) == {1}


def test_value_dropped_dead_letter_is_skipped_and_counted(topics_factory):
    topics = topics_factory(partitions=1)
    key, _, headers = dead_letter(topics.input, 1)
    dropped = (key, None, [*headers, (VALUE_DROPPED, b"2000000")])
    produce_to_partition(
        topics.dlq, 0, [dead_letter(topics.input, 0), dropped, dead_letter(topics.input, 2)]
    )
    group = f"g-{topics.dlq}"

    summary = dlq_json(topics.dlq, "replay", "--group", group, "--quiet")

    assert summary["selected"] == 3
    assert (summary["replayed"], summary["skipped_incomplete"]) == (2, 1)
    assert set(replayed_from(read_topic(topics.input, 2))) == {
        f"{topics.dlq}/0/0",
        f"{topics.dlq}/0/2",
    }
    assert committed_offsets(group, topics.dlq, 1) == {0: 3}


def test_missing_topics_and_a_down_broker_are_reported_in_one_line(topics_factory):
    topics = topics_factory(partitions=1)
    produce_to_partition(topics.dlq, 0, [dead_letter(topics.input, 0)])
    group = f"g-{topics.dlq}"
    nowhere = f"127.0.0.1:{free_port()}"

    missing_dlq = dlq(f"{topics.dlq}-missing", "inspect")
    missing_target = dlq(topics.dlq, "replay", "--group", group, "--to", "no-such-topic")
    broker_down = run_tool(
        "deadletter.cli", "--bootstrap-servers", nowhere, "--dlq-topic", topics.dlq, "replay"
    )

    for result, topic in (
        (missing_dlq, f"{topics.dlq}-missing"),
        (missing_target, "no-such-topic"),
        (broker_down, topics.dlq),
    ):
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert topic in result.stderr.strip().splitlines()[-1]
    assert committed_offsets(group, topics.dlq, 1) == {0: OFFSET_INVALID}


def test_a_replayed_record_that_fails_again_is_recognisable(topics_factory, service_factory):
    topics = topics_factory(partitions=1)
    produce(topics.input, [(b"a", b"{oops"), (b"b", b"[")])
    service = service_factory(topics)
    service.wait_for_metric('fraud_dead_letters_total{reason="decode"}', 2)

    first = dlq_json(topics.dlq, "inspect", "--show", "2")
    summary = dlq_json(topics.dlq, "replay", "--group", f"g-{topics.dlq}", "--quiet")
    assert summary["replayed"] == 2
    service.wait_for_metric('fraud_dead_letters_total{reason="decode"}', 4)

    second = dlq_json(
        topics.dlq, "inspect", "--show", "2", "--partition", "0", "--from-offset", "2"
    )
    assert second["total"] == 2
    marks = {r["key"]: r["headers"].get(REPLAYED_FROM) for r in second["records"]}
    assert marks == {r["key"]: f"{topics.dlq}/0/{r['offset']}" for r in first["records"]}
    assert all(r["headers"]["dlq.reason"] == "decode" for r in second["records"])


def test_a_refused_delivery_stops_the_replay_before_that_record(topics_factory, admin):
    topics = topics_factory(partitions=1)
    small = f"small-{topics.dlq}"
    new = NewTopic(small, 1, 1, config={"max.message.bytes": str(TOO_SMALL_BYTES)})
    admin.create_topics([new])[small].result(timeout=30)
    try:
        letters = [
            dead_letter(topics.input, 0),
            dead_letter(topics.input, 1, value=b"x" * (TOO_SMALL_BYTES * 4)),
            dead_letter(topics.input, 2),
        ]
        produce_to_partition(topics.dlq, 0, letters)
        group = f"g-{topics.dlq}"

        result = dlq(topics.dlq, "replay", "--group", group, "--to", small, "--json", "--quiet")

        assert result.returncode == 1
        summary = json.loads(result.stdout)
        # The records around the big one may share its refused batch, and fail with it.
        assert summary["failed"] >= 1 and summary["stopped_by"] == "error"
        assert small in result.stderr.strip().splitlines()[-1]
        assert committed_offsets(group, topics.dlq, 1)[0] <= 1  # never past the refused one
    finally:
        admin.delete_topics([small])[small].result(timeout=30)


def test_a_forged_dlq_header_neither_fools_replay_nor_is_lost(topics_factory, service_factory):
    # Finding 9 of the review: a source header dlq.value.dropped made replay skip (and commit
    # past) a dead letter that still had its value.
    topics = topics_factory(partitions=1)
    forged = [("trace-id", b"t-9"), (VALUE_DROPPED, b"1"), ("dlq.reason", b"none")]
    produce_to_partition(topics.input, 0, [(b"card", b"{oops", forged)])
    service = service_factory(topics)
    service.wait_for_metric('fraud_dead_letters_total{reason="decode"}', 1)
    service.signal(signal.SIGTERM)
    assert service.wait() == 0

    (letter,) = read_topic(topics.dlq, 1)
    names = [k for k, _ in raw_headers(letter)]
    assert VALUE_DROPPED not in names and names.count("dlq.reason") == 1
    assert "dlq.original.header.dlq.value.dropped" in names
    summary = dlq_json(topics.dlq, "replay", "--group", f"g-{topics.dlq}", "--quiet")

    assert (summary["replayed"], summary["skipped_incomplete"]) == (1, 0)
    replayed = [m for m in read_topic(topics.input, 2) if m.offset() == 1]
    assert replayed[0].headers() == [*forged, (REPLAYED_FROM, f"{topics.dlq}/0/0".encode())]


def test_inspect_survives_hostile_dead_letters_and_shows_them_safely(topics_factory):
    # Finding 12 of the review: header values reached the terminal raw, a huge dlq.failed_at
    # raised OSError, and a header key that is not UTF-8 could not be read at all.
    topics = topics_factory(partitions=1)
    key, value, headers = dead_letter(topics.input, 0)
    escapes = [(k, b"\x1b]0;owned\x07" if k == "dlq.message" else v) for k, v in headers]
    huge_time = [(k, b"9" * 40 if k == "dlq.failed_at" else v) for k, v in headers]
    produce_to_partition(topics.dlq, 0, [(key, value, escapes), (key, value, huge_time)])
    unreadable = [(k.encode(), v) for k, v in headers] + [(b"\xff\xfe", b"x")]
    produce_raw(BOOTSTRAP, topics.dlq, 0, [(key, value, unreadable)])

    result = dlq(topics.dlq, "inspect", "--show", "3")
    as_json = dlq_json(topics.dlq, "inspect", "--show", "3")

    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert as_json["total"] == 3
    assert as_json["records"][2]["headers"]["dlq.headers.dropped"].startswith("unreadable")
    summary = dlq_json(topics.dlq, "replay", "--group", f"g-{topics.dlq}", "--quiet")
    assert summary["skipped_incomplete"] == 1, "a dead letter without its headers is not replayed"
