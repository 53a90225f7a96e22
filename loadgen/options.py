"""`fraud-loadgen`'s command line: the settings it shares with the services (`LoadgenSettings`:
flags and environment variables), the flags of the run's shape, and their validation into the
run's schedule."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated

from contracts.field_mapping import FieldMapping
from loadgen.replay import ReplayRow, ReplaySchedule, plan, read_rows
from loadgen.shapes import (
    DEFAULT_BURST_EVERY_S,
    DEFAULT_BURST_FACTOR,
    DEFAULT_BURST_LENGTH_S,
    DEFAULT_RATES,
    SHAPES,
    Schedule,
    make_shape,
)
from plumbing.settings import KafkaSettings, Topic, meta
from simulator.transactions import DEFAULT_CARDS, MAX_FRAUD_SCALE

#: The simulator seed of a run that names none.
DEFAULT_SEED = 7


class LoadgenSettings(KafkaSettings, frozen=True, kw_only=True):
    """Where the load goes and its outcomes are read: the services' own variables, so one
    environment serves all (the run's shape is the command line's alone)."""

    input_topic: Annotated[Topic, meta("FRAUD_INPUT_TOPIC", "topic to produce transactions to")] = (
        "transactions"
    )
    output_topic: Annotated[Topic, meta("FRAUD_OUTPUT_TOPIC", "topic to read decisions from")] = (
        "decisions"
    )
    dlq_topic: Annotated[Topic, meta("FRAUD_DLQ_TOPIC", "dead-letter topic to read")] = (
        "transactions.dlq"
    )
    labels_topic: Annotated[
        Topic,
        meta(
            "FRAUD_LABELS_TOPIC",
            "topic to produce the simulator's confirmed outcomes (labels) to, each once it is "
            "known in simulated time; if the topic does not exist, no labels are sent",
        ),
    ] = "labels"
    input_mapping: Annotated[
        Path | None,
        meta(
            "FRAUD_INPUT_MAPPING",
            "--replay: the field mapping of the rows (docs/input-mapping.md), the scorer's "
            "FRAUD_INPUT_MAPPING",
            shown_default="the contract's names",
        ),
    ] = None


def build_parser() -> argparse.ArgumentParser:
    rates = ", ".join(f"{name} {rate:g}" for name, rate in DEFAULT_RATES.items())
    parser = argparse.ArgumentParser(
        prog="fraud-loadgen",
        description="Open-loop load generator for fraud-scorer: simulated transactions in, "
        "decisions and dead letters read back and matched by transaction.",
        epilog="The producer and the outcome reader take the Kafka settings given (-X, "
        "FRAUD_KAFKA_OPTIONS, FRAUD_KAFKA_CONFIG_FILE). Outcomes are read with "
        "isolation.level=read_committed whatever is given: with "
        "FRAUD_PROCESSING_GUARANTEE=exactly-once, only decisions of committed transactions count.",
    )
    LoadgenSettings.add_arguments(parser)
    parser.add_argument(
        "--no-labels", action="store_true", help="send no labels (only transactions)"
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="constant",
        help="traffic shape: constant (--rate throughout), ramp (0 to --rate), diurnal (a day "
        "compressed into --duration, starting at midnight: --rate at lunch, 1%% of it at 3 AM), "
        "burst (--rate with periodic bursts; see --burst-*) (default: %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"transactions per second: the rate of constant and burst, the end of ramp, the "
        f"peak of diurnal; it sets how compressed simulated time runs, which must be the "
        f"scorer's FRAUD_HISTORY_TIME_SCALE: a rate that does not fit the scale read from "
        f"--metrics-url is refused, naming the scale it needs (default: the rate of that scale; "
        f"without it, by shape: {rates})",
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds to send for (default: %(default)s)"
    )
    parser.add_argument(
        "--burst-every",
        type=float,
        default=DEFAULT_BURST_EVERY_S,
        help="burst shape: seconds from one burst to the next; each burst closes its period "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--burst-seconds",
        type=float,
        default=DEFAULT_BURST_LENGTH_S,
        help="burst shape: length of a burst in seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--burst-factor",
        type=float,
        default=DEFAULT_BURST_FACTOR,
        help="burst shape: rate during a burst as a multiple of --rate (default: %(default)s)",
    )
    parser.add_argument(
        "--bad-ratio",
        type=float,
        default=0.0,
        help="share of records sent malformed on purpose, 0..1 (default: %(default)s)",
    )
    parser.add_argument(
        "--fraud-scale",
        type=float,
        default=1.0,
        help="multiplies the simulator's compromised terminals and cards per day (the "
        "handbook's rates at 1; 0 for no fraud) (default: %(default)s)",
    )
    parser.add_argument(
        "--cards",
        type=int,
        default=DEFAULT_CARDS,
        help="customers (cards) of the simulated world, with twice as many terminals and the "
        "same shares of fraud (the handbook's world by default): a smaller world makes fewer "
        "transactions per simulated day, so at the same rate its days pass sooner (make demo: "
        "1,250 cards at 500 tx/s, two weeks in 70 s) (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="simulator seed (default: %(default)s)"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for outstanding outcomes after sending (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9102/metrics",
        help="scorer /metrics to read its FRAUD_HISTORY_TIME_SCALE from before sending (see "
        "--rate) and to scrape every second during the run (batch sizes, batch cap, consumer "
        "lag); empty to skip both, with a warning that says which scale the run assumes "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary as one JSON line last on stdout"
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write an HTML page with plots (viewable offline) and the summary JSON into DIR",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    replay = parser.add_argument_group(
        "replay", "send a recorded file of your own transactions instead of simulated ones"
    )
    replay.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="rows to send, one transaction each: JSON lines (.jsonl, .ndjson, .json), CSV "
        "(.csv) or Parquet (.parquet, needs pyarrow); sent in event-time order as JSON; "
        "--shape, --rate, --duration, --bad-ratio and the labels feed do not apply",
    )
    replay.add_argument(
        "--replay-speed",
        type=float,
        default=1.0,
        help="the rows' original pace times this (default: %(default)s, as recorded)",
    )
    replay.add_argument(
        "--replay-rate",
        type=float,
        default=None,
        help="send at this constant rate, rows per second, instead of their pace",
    )
    replay.add_argument(
        "--label-column",
        default="is_fraud",
        help="the rows' fraud label, true/false or 1/0; rows without it count in neither "
        "recall nor false positives; never sent (default: %(default)s)",
    )
    return parser


def validate_replay(
    args: argparse.Namespace, mapping_file: Path | None
) -> tuple[list[ReplayRow], ReplaySchedule]:
    """Read the replay file and build its schedule with the field mapping in `mapping_file`;
    ValueError (or ConfigurationError, for the mapping) naming the flag or the row."""
    if not args.replay_speed > 0:
        raise ValueError(f"--replay-speed must be > 0, got {args.replay_speed}")
    if args.replay_rate is not None and not args.replay_rate > 0:
        raise ValueError(f"--replay-rate must be > 0, got {args.replay_rate}")
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    mapping = None if mapping_file is None else FieldMapping.load(mapping_file)
    rows = plan(read_rows(args.replay), mapping, args.label_column)
    schedule = ReplaySchedule(
        [row.event_time for row in rows], speed=args.replay_speed, rate=args.replay_rate
    )
    return rows, schedule


def validate(args: argparse.Namespace) -> Schedule:
    """Check the arguments and build the run's schedule; ValueError naming the flag."""
    if args.rate is None:
        args.rate = DEFAULT_RATES[args.shape]
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if not args.duration > 0:
        raise ValueError(f"--duration must be > 0, got {args.duration}")
    if not 0.0 <= args.bad_ratio <= 1.0:
        raise ValueError(f"--bad-ratio must be within 0..1, got {args.bad_ratio}")
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.cards < 1:
        raise ValueError(f"--cards must be >= 1, got {args.cards}")
    if args.fraud_scale * args.cards / DEFAULT_CARDS > MAX_FRAUD_SCALE:
        raise ValueError(
            f"--fraud-scale x --cards / {DEFAULT_CARDS} must be <= {MAX_FRAUD_SCALE} (the "
            f"simulator's most fraud per day), got {args.fraud_scale} x {args.cards}"
        )
    if not 0.0 <= args.fraud_scale <= MAX_FRAUD_SCALE:
        raise ValueError(
            f"--fraud-scale must be within 0..{MAX_FRAUD_SCALE}, got {args.fraud_scale}"
        )
    if not 0 < args.burst_seconds <= args.burst_every:
        raise ValueError(
            f"--burst-seconds must be in (0, --burst-every={args.burst_every}], "
            f"got {args.burst_seconds}"
        )
    if not args.burst_factor > 0:
        raise ValueError(f"--burst-factor must be > 0, got {args.burst_factor}")
    shape = make_shape(
        args.shape,
        args.rate,
        args.duration,
        burst_every_s=args.burst_every,
        burst_length_s=args.burst_seconds,
        burst_factor=args.burst_factor,
    )
    schedule = Schedule(shape, args.duration)
    if schedule.total < 1:
        raise ValueError(
            f"--rate {args.rate} over --duration {args.duration} s schedules no record at all"
        )
    return schedule
