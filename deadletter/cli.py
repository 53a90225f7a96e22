"""`fraud-dlq`: look at the dead-letter topic (`inspect`) and re-inject its records (`replay`).

This module only parses and checks arguments, wires the pieces together and turns their
outcome into output and an exit status: 0 done, 1 the broker or a topic failed us (one line
naming the topic), 2 bad arguments (one line), 128 + N a replay stopped by signal N.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Annotated, Any, NoReturn

from deadletter.inspect import inspect, render_text
from deadletter.reader import DeadLetterFilter, DeadLetterReader, parse_time
from deadletter.replay import DEFAULT_GROUP, Replayer, ReplayOptions, create_producer
from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError, FraudScorerError
from plumbing.logs import TextFormatter
from plumbing.settings import KafkaSettings, Topic, meta

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: A run stopped by signal N exits 128 + N, as a shell reports a process killed by it.
EXIT_SIGNAL_BASE = 128

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DlqSettings(KafkaSettings, frozen=True, kw_only=True):
    """Where the dead letters are: the service's own variables, so one environment serves
    both."""

    dlq_topic: Annotated[Topic, meta("FRAUD_DLQ_TOPIC", "dead-letter topic")] = "transactions.dlq"


class _OncePerMessage(logging.Filter):
    """Lets each distinct log message through once: librdkafka repeats a complaint (broker
    unreachable) on every retry, and the command's own error message follows anyway."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self._seen:
            return False
        self._seen.add(message)
        return True


def _configure_logging() -> logging.Logger:
    """Warnings on stderr; librdkafka's own lines among them, each once. Returns its logger."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter("fraud-dlq: %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    librdkafka = logging.getLogger("librdkafka")
    librdkafka.addFilter(_OncePerMessage())
    return librdkafka


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports a bad argument in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_filters(parser: argparse.ArgumentParser) -> None:
    filters = parser.add_argument_group(
        "filters (a dead letter is selected when it passes every filter given)"
    )
    filters.add_argument(
        "--reason",
        action="append",
        metavar="R",
        help="only this dlq.reason: decode, validate, score or produce; repeat for several "
        "(default: every reason)",
    )
    filters.add_argument(
        "--error",
        action="append",
        metavar="CLASS",
        help="only this dlq.error exception class, e.g. DecodeError; repeat for several "
        "(default: every class)",
    )
    filters.add_argument(
        "--original-topic",
        metavar="T",
        help="only dead letters of this dlq.original.topic (default: every topic)",
    )
    filters.add_argument(
        "--since",
        type=_time,
        metavar="TIME",
        help="only dead letters with dlq.failed_at at or after TIME: epoch milliseconds or "
        "ISO-8601 such as 2026-11-30T10:00:00Z (UTC unless it has an offset) "
        "(default: no lower bound)",
    )
    filters.add_argument(
        "--until",
        type=_time,
        metavar="TIME",
        help="only dead letters with dlq.failed_at before TIME, same formats as --since "
        "(default: no upper bound)",
    )
    filters.add_argument(
        "--partition",
        type=_count(0),
        metavar="P",
        help="only this partition of the dead-letter topic (default: every partition)",
    )
    filters.add_argument(
        "--from-offset",
        type=_count(0),
        metavar="O",
        help="only offsets >= O in --partition, which it needs (default: its first offset)",
    )
    filters.add_argument(
        "--to-offset",
        type=_count(0),
        metavar="O",
        help="only offsets <= O in --partition, which it needs (default: its last offset)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `fraud-dlq` command line."""
    parser = _Parser(
        prog="fraud-dlq",
        description="Look at dead letters and replay them to their original topic.",
        epilog=f"exit status: {EXIT_OK} done, {EXIT_FAILURE} the broker or a topic failed "
        f"(one line naming the topic), {EXIT_USAGE} bad arguments, {EXIT_SIGNAL_BASE}+N a "
        "replay stopped by signal N (it resumes when run again)",
    )
    DlqSettings.add_arguments(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect_parser = commands.add_parser(
        "inspect",
        help="count dead letters by reason, error, original topic and time; show some",
        description="Read the dead-letter topic from its beginning to its current end and "
        "summarise the selected dead letters. Joins no group, commits nothing.",
    )
    _add_filters(inspect_parser)
    inspect_parser.add_argument(
        "--show",
        type=_count(0),
        default=0,
        metavar="N",
        help="also print the first N selected records with their decoded headers "
        "(default: %(default)s)",
    )
    inspect_parser.add_argument(
        "--json", action="store_true", help="print one JSON object (default: text)"
    )

    replay = commands.add_parser(
        "replay",
        help="re-produce selected dead letters to their original topic",
        description="Re-produce the selected dead letters: original key, value and headers, "
        "without the dlq.* headers, plus dlq.replayed_from=<dlq topic>/<partition>/<offset>. "
        "The replay reads as a consumer group from its committed position (the beginning for "
        "a new group) to the topic's end at the start of the run, and commits its position "
        "only past records the broker acknowledged: run it again after an interruption and it "
        "resumes without duplicating. Records the group has read are not replayed again, "
        "whatever the filters: use a new --group to start over or to replay another selection. "
        "Dead letters without a value (dlq.value.dropped) are skipped and counted.",
    )
    _add_filters(replay)
    replay.add_argument(
        "--to",
        metavar="TOPIC",
        help="replay every record to TOPIC (default: each one's dlq.original.topic)",
    )
    replay.add_argument(
        "--group",
        default=DEFAULT_GROUP,
        help="consumer group whose committed position in the dead-letter topic the replay "
        "resumes from and advances (default: %(default)s)",
    )
    replay.add_argument(
        "--dry-run",
        action="store_true",
        help="report what would be replayed; produce and commit nothing (default: off)",
    )
    replay.add_argument(
        "--max-records",
        type=_count(1),
        metavar="N",
        help="stop after N records replayed and commit; the next run continues (default: no limit)",
    )
    replay.add_argument(
        "--quiet", action="store_true", help="no progress line on stderr (default: off)"
    )
    replay.add_argument(
        "--json", action="store_true", help="print the summary as one JSON line (default: text)"
    )
    return parser


def _filter_of(args: argparse.Namespace) -> DeadLetterFilter:
    return DeadLetterFilter(
        reasons=frozenset(args.reason or ()),
        errors=frozenset(args.error or ()),
        original_topic=args.original_topic,
        since_ms=args.since,
        until_ms=args.until,
        partition=args.partition,
        from_offset=args.from_offset,
        to_offset=args.to_offset,
    )


def _kafka_settings(settings: DlqSettings) -> dict[str, Any]:
    """librdkafka settings every client of this run shares."""
    return {**settings.kafka_settings(), "bootstrap.servers": settings.bootstrap_servers}


@contextmanager
def _stopping_on_signals(stop: Callable[[str], None], received: list[int]) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM ask for a clean stop (recorded in `received`)."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _inspect(
    args: argparse.Namespace, topic: str, kafka: dict[str, Any], where: DeadLetterFilter
) -> int:
    with DeadLetterReader(kafka, topic) as reader:
        report = inspect(reader, where, args.show)
    print(json.dumps(report) if args.json else render_text(report))
    return EXIT_OK


def _replay(
    args: argparse.Namespace,
    topic: str,
    kafka: dict[str, Any],
    where: DeadLetterFilter,
    options: ReplayOptions,
) -> int:
    received: list[int] = []
    with DeadLetterReader(kafka, topic, options.group) as reader:
        producer = None if options.dry_run else create_producer(kafka)
        replayer = Replayer(reader, producer, where, options, progress=not args.quiet)
        with _stopping_on_signals(replayer.stop, received):
            summary = replayer.run()
    print(json.dumps(summary.as_dict()) if args.json else summary.render_text())
    if summary.error is not None:
        print(f"fraud-dlq: {summary.error}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_SIGNAL_BASE + received[0] if received else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run `fraud-dlq` with `argv` (default: the process's arguments); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for warning in check_environment("fraud-dlq"):
            print(f"fraud-dlq: {warning}", file=sys.stderr)
        settings = DlqSettings.from_args(args)
        kafka = _kafka_settings(settings)
        where = _filter_of(args)
        options = (
            ReplayOptions(args.group, args.to, args.dry_run, args.max_records)
            if args.command == "replay"
            else None
        )
    except (ValueError, ConfigurationError) as exc:
        parser.error(str(exc))
    kafka["logger"] = _configure_logging()
    try:
        if options is not None:
            return _replay(args, settings.dlq_topic, kafka, where, options)
        return _inspect(args, settings.dlq_topic, kafka, where)
    except FraudScorerError as exc:
        print(f"fraud-dlq: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:  # Ctrl-C before a replay runs, or during inspect: nothing to save
        return EXIT_SIGNAL_BASE + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
