"""The pure logic of `fraud-dlq`: time parsing, filters, replay headers, options, output."""

from __future__ import annotations

import argparse
import io
import tracemalloc
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.dead_letter import (
    ERROR,
    FAILED_AT,
    HEADER_PREFIX,
    ORIGINAL_TOPIC,
    REASON,
    REPLAYED_FROM,
    failed_at_ms,
    replay_headers,
)
from deadletter import cli
from deadletter.inspect import inspect
from deadletter.reader import DeadLetter, DeadLetterFilter, PartitionRange, parse_time
from deadletter.replay import Progress, ReplayOptions, ReplaySummary


def letter(
    partition: int = 0,
    offset: int = 0,
    *,
    reason: str = "decode",
    error: str = "DecodeError",
    topic: str = "transactions",
    failed_at: str | None = "1000",
) -> DeadLetter:
    decoded = {REASON: reason, ERROR: error, ORIGINAL_TOPIC: topic}
    if failed_at is not None:
        decoded[FAILED_AT] = failed_at
    headers = [(k, v.encode()) for k, v in decoded.items()]
    return DeadLetter(partition, offset, b"k", b"v", headers, decoded)


@pytest.mark.parametrize(
    ("text", "epoch_ms"),
    [
        ("1767571200000", 1_767_571_200_000),
        ("0", 0),
        ("2026-11-30T10:00:00Z", 1_796_032_800_000),
        ("2026-11-30T10:00:00.250Z", 1_796_032_800_250),
        ("2026-11-30T12:00:00+02:00", 1_796_032_800_000),
        ("2026-11-30T10:00:00", 1_796_032_800_000),  # no offset: UTC
        ("2026-11-30", 1_795_996_800_000),
        (" 2026-11-30T10:00:00Z ", 1_796_032_800_000),
    ],
)
def test_parse_time_accepts_epoch_ms_and_iso_8601(text, epoch_ms):
    assert parse_time(text) == epoch_ms


@pytest.mark.parametrize("text", ["", "yesterday", "-5", "1.5", "2026-13-01", "30/11/2026"])
def test_parse_time_rejects_anything_else_naming_the_value(text):
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_time(text)


def test_failed_at_is_none_when_missing_or_malformed():
    assert failed_at_ms({FAILED_AT: "1234"}) == 1234
    assert failed_at_ms({}) is None
    assert failed_at_ms({FAILED_AT: "soon"}) is None
    assert failed_at_ms({FAILED_AT: "-1"}) is None


def test_an_empty_filter_selects_everything():
    assert DeadLetterFilter().matches(letter(failed_at=None))


@pytest.mark.parametrize(
    ("where", "selected", "rejected"),
    [
        (
            DeadLetterFilter(reasons=frozenset({"decode", "score"})),
            letter(reason="score"),
            letter(reason="validate"),
        ),
        (
            DeadLetterFilter(errors=frozenset({"ScoreError"})),
            letter(error="ScoreError"),
            letter(error="DecodeError"),
        ),
        (DeadLetterFilter(original_topic="a"), letter(topic="a"), letter(topic="b")),
        (DeadLetterFilter(since_ms=1000), letter(failed_at="1000"), letter(failed_at="999")),
        (DeadLetterFilter(until_ms=1000), letter(failed_at="999"), letter(failed_at="1000")),
        (DeadLetterFilter(since_ms=1), letter(failed_at="5"), letter(failed_at=None)),
        (DeadLetterFilter(until_ms=9), letter(failed_at="5"), letter(failed_at="x")),
        (DeadLetterFilter(partition=1), letter(partition=1), letter(partition=0)),
        (
            DeadLetterFilter(partition=1, from_offset=5, to_offset=7),
            letter(partition=1, offset=7),
            letter(partition=1, offset=8),
        ),
        (
            DeadLetterFilter(partition=1, from_offset=5),
            letter(partition=1, offset=5),
            letter(partition=1, offset=4),
        ),
        (
            DeadLetterFilter(reasons=frozenset({"decode"}), since_ms=10),
            letter(reason="decode", failed_at="10"),
            letter(reason="decode", failed_at="9"),
        ),
    ],
)
def test_filter_selects_by_every_criterion(where, selected, rejected):
    assert where.matches(selected)
    assert not where.matches(rejected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"since_ms": 5, "until_ms": 5}, "since must be before until"),
        ({"partition": 0, "from_offset": 3, "to_offset": 2}, "from-offset must be <= to-offset"),
        ({"from_offset": 3}, "needs a partition"),
        ({"to_offset": 3}, "needs a partition"),
        ({"partition": -1}, "partition must be >= 0, got -1"),
    ],
)
def test_filter_rejects_inconsistent_bounds(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeadLetterFilter(**kwargs)


def test_clip_narrows_a_partition_to_the_filtered_offsets():
    where = DeadLetterFilter(partition=2, from_offset=10, to_offset=19)
    assert where.clip(2, 0, 100) == PartitionRange(2, 10, 20)
    assert where.clip(2, 15, 17) == PartitionRange(2, 15, 17)
    assert where.clip(1, 0, 100) is None
    assert where.clip(2, 20, 30) is None
    assert DeadLetterFilter().clip(0, 4, 4) is None
    assert DeadLetterFilter().clip(0, 4, 9) == PartitionRange(0, 4, 9)


def test_replay_headers_drop_dlq_headers_keep_the_rest_and_name_the_dead_letter():
    headers = [
        ("trace-id", b"t-1"),
        (REASON, b"decode"),
        (REPLAYED_FROM, b"older.dlq/0/1"),
        ("source", b"pos"),
        ("dlq.stacktrace", b"..."),
    ]
    assert replay_headers(headers, "transactions.dlq", 2, 41) == [
        ("trace-id", b"t-1"),
        ("source", b"pos"),
        (REPLAYED_FROM, b"transactions.dlq/2/41"),
    ]
    assert replay_headers(None, "d", 0, 0) == [(REPLAYED_FROM, b"d/0/0")]


@given(
    st.lists(st.tuples(st.sampled_from(["dlq.reason", "dlq.x", "a", "b", "dlq"]), st.binary())),
    st.integers(min_value=0, max_value=1_000),
    st.integers(min_value=0, max_value=10**12),
)
def test_replay_headers_carry_exactly_one_dlq_header(headers, partition, offset):
    replayed = replay_headers(headers, "t.dlq", partition, offset)
    dlq_headers = [(k, v) for k, v in replayed if k.startswith(HEADER_PREFIX)]
    assert dlq_headers == [(REPLAYED_FROM, f"t.dlq/{partition}/{offset}".encode())]
    assert replayed[:-1] == [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group": " "}, "group must not be empty"),
        ({"to_topic": ""}, "to_topic must not be empty"),
        ({"max_records": 0}, "max_records must be >= 1, got 0"),
    ],
)
def test_replay_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplayOptions(**kwargs)


def test_replay_summary_reports_counts_as_json_and_text():
    summary = ReplaySummary(
        "t.dlq",
        "g",
        dry_run=False,
        read=10,
        selected=6,
        skipped_by_filter=4,
        skipped_incomplete=1,
        to_topics=Counter({"transactions": 5}),
    )
    assert summary.as_dict() == {
        "topic": "t.dlq",
        "group": "g",
        "dry_run": False,
        "read": 10,
        "selected": 6,
        "replayed": 5,
        "skipped_by_filter": 4,
        "skipped_incomplete": 1,
        "failed": 0,
        "to_topics": {"transactions": 5},
        "stopped_by": None,
        "error": None,
    }
    text = summary.render_text()
    assert "replayed 5 (transactions=5)" in text and "1 incomplete" in text
    assert "dry run" not in text and "stopped early" not in text


def test_a_dry_run_summary_says_what_would_be_replayed():
    summary = ReplaySummary("t.dlq", "g", dry_run=True, selected=3)
    summary.to_topics["transactions"] += 3
    summary.stopped_by = "max-records"
    text = summary.render_text()
    assert "would replay 3 (transactions=3)" in text
    assert "nothing produced, no position committed" in text
    assert "stopped early (max-records)" in text


def test_progress_writes_records_done_of_total_and_a_rate():
    stream = io.StringIO()
    progress = Progress(200, enabled=True, stream=stream, interval_s=3600)
    progress.update(50, 40)
    progress.update(60, 50)  # within the redraw interval: not drawn
    progress.update(200, 190, final=True)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "50/200 read  25%" in lines[0] and "replayed 40" in lines[0]
    assert "200/200 read 100%" in lines[1] and "records/s" in lines[1]


def test_progress_of_a_run_that_reached_the_end_finishes_at_100_percent():
    stream = io.StringIO()
    # Four offsets, of which one is a transaction marker: three records to read.
    Progress(4, enabled=True, stream=stream).finish(3, 3, reached_end=True)
    assert "3/3 read 100%" in stream.getvalue()


def test_a_disabled_progress_writes_nothing():
    stream = io.StringIO()
    Progress(10, enabled=False, stream=stream).update(10, 10, final=True)
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "--since", "yesterday"], "argument --since: expected epoch milliseconds"),
        (["inspect", "--show", "-1"], "argument --show: must be >= 0, got -1"),
        (["replay", "--max-records", "0"], "argument --max-records: must be >= 1, got 0"),
        (["replay", "--partition", "x"], "argument --partition: expected an integer, got 'x'"),
        (["replay", "--to-offset", "4"], "an offset range needs a partition"),
        (["inspect", "--since", "2026-12-01", "--until", "2026-11-30"], "since must be before"),
        (["-X", "acks", "inspect"], "kafka option #1 must look like KEY=VALUE"),
        (["replay", "--group", ""], "group must not be empty"),
        (["purge"], "invalid choice: 'purge'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert message in err and "--help" in err


def test_every_option_documents_its_default():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in [parser, *commands.choices.values()]:
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert "default" in (action.help or ""), (command.prog, action.option_strings)


class ManyLetters:
    """A dead-letter reader over `count` generated letters (none held at once)."""

    topic = "transactions.dlq"

    def __init__(self, count: int) -> None:
        self._count = count

    def plan(self, where: DeadLetterFilter, *, resume: bool) -> list[PartitionRange]:
        return []

    def records(self, ranges: list[PartitionRange]) -> Iterator[DeadLetter]:
        for offset in range(self._count):
            yield letter(0, offset, failed_at=str(1_796_000_000_000 + offset))


def test_inspect_keeps_the_range_of_failed_at_not_every_value() -> None:
    # Finding 10 of the state review: every dlq.failed_at was kept in a list, so inspecting a
    # topic of millions of dead letters held them all.
    peaks = []
    for count in (1_000, 100_000):
        tracemalloc.start()
        report = inspect(ManyLetters(count), DeadLetterFilter(), show=0)  # type: ignore[arg-type]
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert report["total"] == count
        assert (report["first_failed_at"], report["last_failed_at"]) == (
            1_796_000_000_000,
            1_796_000_000_000 + count - 1,
        )
    assert peaks[1] < peaks[0] + 200_000, f"memory grew with the letters: {peaks}"
