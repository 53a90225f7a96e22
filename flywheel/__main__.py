"""`python -m flywheel` (`make flywheel`): the data flywheel on the simulator (flywheel/loop.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flywheel.loop import run
from flywheel.settings import FlywheelSettings
from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError
from simulator.label_regimes import LabelRegime
from training.options import check_shares, parse_share

#: Each option's default is the settings' own.
DEFAULTS = FlywheelSettings._field_defaults


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flywheel",
        description="v1 serves, the world drifts, labels arrive, v2 is trained from the topics, "
        "runs in shadow and is promoted; prints recall at a 1 % false-positive rate of both on "
        "the same late window. Needs a running broker (make kafka-up).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--bootstrap-servers", default=DEFAULTS["bootstrap"], help="Kafka brokers")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="simulator seed")
    parser.add_argument("--cards", type=int, default=DEFAULTS["cards"], help="simulated cards")
    parser.add_argument(
        "--train-days",
        type=int,
        default=DEFAULTS["train_days"],
        help="simulated days v1 serves before v2 is trained",
    )
    parser.add_argument(
        "--drift-day",
        type=int,
        default=DEFAULTS["drift_day"],
        help="the day the new fraud pattern switches on",
    )
    parser.add_argument(
        "--late-days",
        type=int,
        default=DEFAULTS["late_days"],
        help="days scored by both, v2 in shadow",
    )
    parser.add_argument(
        "--served-days", type=int, default=DEFAULTS["served_days"], help="days v2 serves after"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=DEFAULTS["rate"],
        help="event-time transactions a second (how compressed simulated time is)",
    )
    parser.add_argument(
        "--label-regime",
        type=LabelRegime,
        choices=list(LabelRegime),
        default=DEFAULTS["regime"],
        help="how outcomes are reported (simulator/label_regimes.py). capacity: analysts "
        "review what v1 flags, --reviews-per-day a day, highest expected loss first, and "
        "audit --audit-share of what it approves; the rest by chargeback (median 7 days). "
        "chargebacks: every fraud by chargeback. today: the simulator's optimistic outcomes",
    )
    parser.add_argument(
        "--audit-share",
        type=parse_share,
        default=DEFAULTS["audit_share"],
        help="capacity regime: the share of v1's approved transactions audited (by a hash of "
        "the transaction id); v2 is trained with the same `fraud-train from-topics "
        "--audit-share`",
    )
    parser.add_argument(
        "--audit-weight",
        type=float,
        default=DEFAULTS["audit_weight"],
        help="what each audited fraud weighs in v2's training (`fraud-train from-topics "
        "--audit-weight`; 1/--audit-share is the inverse-propensity weight)",
    )
    parser.add_argument(
        "--validation-share",
        type=float,
        default=DEFAULTS["validation_share"],
        help="v2's rows for calibration and thresholds (`fraud-train from-topics`); v2 does "
        "not train on them",
    )
    parser.add_argument(
        "--evaluation-share",
        type=float,
        default=DEFAULTS["evaluation_share"],
        help="the most recent of v2's rows, where `fraud-train from-topics` compares it with "
        "v1; v2 does not train on them",
    )
    parser.add_argument(
        "--reviews-per-day",
        type=int,
        default=DEFAULTS["reviews_per_day"],
        help="capacity regime: flagged cases the analysts review a simulated day",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULTS["metrics_port"],
        help="the scorer's metrics port",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULTS["out"], help="packages, logs, summary.json"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Its scorer replica inherits the environment: the scorer's variables are read there.
        for warning in check_environment("python -m flywheel", passes_on=("fraud-scorer",)):
            print(f"python -m flywheel: {warning}", file=sys.stderr)
    except ConfigurationError as exc:
        print(f"python -m flywheel: configuration error: {exc}", file=sys.stderr)
        return 2
    if (
        not 0 < args.drift_day < args.train_days
        or min(args.late_days, args.served_days) < 1
        or args.reviews_per_day < 0
        or not args.audit_weight > 0
    ):
        print(
            "python -m flywheel: need 0 < --drift-day < --train-days, --late-days and "
            "--served-days >= 1, --reviews-per-day >= 0 and --audit-weight > 0",
            file=sys.stderr,
        )
        return 2
    problem = check_shares(args.validation_share, args.evaluation_share)
    if args.audit_share and args.label_regime is not LabelRegime.CAPACITY:
        # Only the capacity regime's analysts audit: elsewhere the trainer would weigh and count
        # as audited a sample that nobody reviewed.
        problem = f"--audit-share needs --label-regime capacity, got {args.label_regime}"
    if problem:
        print(f"python -m flywheel: {problem}", file=sys.stderr)
        return 2
    settings = FlywheelSettings(
        bootstrap=args.bootstrap_servers,
        seed=args.seed,
        cards=args.cards,
        train_days=args.train_days,
        drift_day=args.drift_day,
        late_days=args.late_days,
        served_days=args.served_days,
        rate=args.rate,
        out=args.out,
        metrics_port=args.metrics_port,
        regime=args.label_regime,
        audit_share=args.audit_share,
        audit_weight=args.audit_weight,
        reviews_per_day=args.reviews_per_day,
        validation_share=args.validation_share,
        evaluation_share=args.evaluation_share,
    )
    try:
        run(settings)
    except RuntimeError as exc:
        print(f"python -m flywheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
