"""`fraud-train`'s command line: one parser, a subcommand per way of training, each with its own
`--help`, and no import of the training libraries (the help works without the `train` extra).

    fraud-train simulator     the shipped model, on the project's simulator (`make model`)
    fraud-train from-topics   a challenger, from the decisions and labels topics (`make flywheel`)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from simulator.label_regimes import AUDIT_SHARE, SHIPPED_REGIMES, LabelRegime
from training.protocol import days_needed, fold_schedule

PROG = "fraud-train"
DEFAULT_SEEDS = (7, 8, 9)
#: Days before the first training week: every window (30 days, + the 7-day delay for terminal
#: risk) is full, and compromised terminals (28 days) and cards (14) are in steady state.
WARMUP_DAYS = 45
FOLDS = 4
DEFAULT_DAYS = WARMUP_DAYS + days_needed(FOLDS)
#: The mode flag of releases before the subcommands; still read, with a warning, where no
#: command comes first.
LEGACY_FROM_TOPICS = "--from-topics"
COMMANDS = ("simulator", "from-topics")


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds takes comma-separated integers such as 7,8,9, got {text!r}"
        ) from None
    if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds must be distinct and >= 0, got {text!r}")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train a fraud model and write its package (model.onnx, model.toml and a "
        "model card). `fraud-train COMMAND --help` gives each command's options.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_simulator(
        commands.add_parser(
            "simulator",
            help="train the shipped model on the project's simulator (make model)",
            description="Train the fraud model on the simulated stream: every candidate and "
            "choice on validation weeks, the test weeks scored once; write the package and its "
            "model card.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    _add_from_topics(
        commands.add_parser(
            "from-topics",
            help="train a challenger from the decisions and labels topics (make flywheel)",
            description="Train a challenger from the decisions topic (with logged features) "
            "and the labels topic, compare it with the served model on the most recent rows, "
            "and write its package. It promotes nothing: run it in shadow, then `fraud-model "
            "promote`.",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    return parser


def parse_regimes(text: str) -> tuple[LabelRegime, ...]:
    names = [part.strip() for part in text.split(",")]
    known = ", ".join(regime.value for regime in LabelRegime)
    try:
        regimes = tuple(LabelRegime(name) for name in names)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--regimes takes comma-separated names among {known}, got {text!r}"
        ) from None
    if len(set(regimes)) != len(regimes):
        raise argparse.ArgumentTypeError(f"--regimes names a regime twice: {text!r}")
    return regimes


def parse_share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return share


def add_stream_options(parser: argparse.ArgumentParser) -> None:
    """--seeds, --days and --folds: the simulated streams a study trains and evaluates on."""
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=DEFAULT_SEEDS,
        help="simulator and training seeds, comma-separated (`simulator` ships the first one's "
        "model and evaluates every one)",
    )
    parser.add_argument(
        "--days", type=int, default=DEFAULT_DAYS, help="simulated days (warm-up + the folds)"
    )
    parser.add_argument(
        "--folds", type=int, default=FOLDS, help="validation folds, and as many test folds"
    )


def _add_simulator(parser: argparse.ArgumentParser) -> None:
    add_stream_options(parser)
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="seeds trained at once, each in a process of its own (default: one per CPU, at "
        "most one per seed)",
    )
    parser.add_argument(
        "--regimes",
        type=parse_regimes,
        default=",".join(SHIPPED_REGIMES),
        help="label regimes (how outcomes are reported, simulator/label_regimes.py), "
        "comma-separated; the first trains the shipped model and heads the card, each other "
        "one is trained the same way for the card's regime table. today: the simulator's "
        "optimistic outcomes; chargebacks: every fraud by chargeback, median 7 days; "
        "capacity: analysts review what the rules flag, 100 a day, highest expected loss "
        "first, plus random audits, the rest by chargeback",
    )
    parser.add_argument(
        "--audit-share",
        type=parse_share,
        default=AUDIT_SHARE,
        help="capacity regime: the share of unflagged transactions reviewed at random",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the model package directory to write (default: the shipped package)",
    )


def _add_from_topics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092", help="Kafka brokers")
    parser.add_argument("--decisions-topic", default="decisions", help="decisions to learn from")
    parser.add_argument("--labels-topic", default="labels", help="confirmed outcomes")
    parser.add_argument(
        "--until",
        type=int,
        default=None,
        help="cut-off, epoch ms: only decisions made and labels reported by then count "
        "(default: now)",
    )
    parser.add_argument(
        "--delay",
        type=int,
        default=0,
        help="ms of event time before the cut-off left out of every split (their frauds are "
        "mostly not reported yet)",
    )
    parser.add_argument(
        "--audit-share",
        type=parse_share,
        default=0.0,
        help="the share of approved transactions your analysts audit at random, the sample "
        "chosen by a hash of the transaction id (simulator/label_regimes.audit_sample): the "
        "card states the share of approved transactions that were frauds, from the audited "
        "ones, with its interval. 0: no audit (docs/flywheel.md, selective labels)",
    )
    parser.add_argument(
        "--audit-weight",
        type=float,
        default=1.0,
        help="what each audited fraud weighs in training. 1/share (the inverse of the chance "
        "to be audited) stands it for the approved frauds not reported yet; measured, it made "
        "the retrained model worse (docs/flywheel.md)",
    )
    parser.add_argument(
        "--validation-share", type=float, default=0.2, help="share of rows for calibration"
    )
    parser.add_argument(
        "--evaluation-share",
        type=float,
        default=0.2,
        help="share of rows, the most recent, the two models are compared on",
    )
    parser.add_argument("--name", default="fraud-gbdt", help="the package's model name")
    parser.add_argument(
        "--version", default=None, help="its version (default: from a hash of its trees)"
    )
    parser.add_argument("--seed", type=int, default=7, help="LightGBM's seed")
    parser.add_argument("--out", type=Path, required=True, help="package directory to write")


def check_shares(validation_share: float, evaluation_share: float) -> str | None:
    """What is wrong with these `from-topics` shares of the rows, or None."""
    shares = (validation_share, evaluation_share)
    if not all(0.0 < share < 1.0 for share in shares) or sum(shares) >= 0.9:
        return (
            "--validation-share and --evaluation-share must each be in (0, 1) and leave at "
            f"least 10 % of the rows for training, got {shares}"
        )
    return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command and its options, checked; exits 2 with the problem on bad ones. The old
    `fraud-train --from-topics ...` still works, with a warning."""
    argv = list(argv)
    if argv and argv[0] not in COMMANDS and LEGACY_FROM_TOPICS in argv:
        print(
            f"{PROG}: {LEGACY_FROM_TOPICS} is deprecated: use `{PROG} from-topics`",
            file=sys.stderr,
        )
        argv = ["from-topics", *(a for a in argv if a != LEGACY_FROM_TOPICS)]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "simulator":
        if args.jobs is not None and args.jobs < 1:
            parser.error(f"--jobs must be >= 1, got {args.jobs}")
        try:
            fold_schedule(args.days, args.folds)
        except ValueError as exc:
            parser.error(f"--days {args.days} --folds {args.folds}: {exc}")
        return args
    if args.until is None:
        args.until = time.time_ns() // 1_000_000
    problem = check_shares(args.validation_share, args.evaluation_share)
    if problem:
        parser.error(problem)
    if args.delay < 0:
        parser.error(f"--delay must be >= 0, got {args.delay}")
    if not (math.isfinite(args.audit_weight) and args.audit_weight > 0):
        parser.error(f"--audit-weight must be a positive number, got {args.audit_weight}")
    return args
