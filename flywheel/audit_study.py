"""`make flywheel-audit` (`python -m flywheel.audit_study`): what a random audit buys the
flywheel, and what it costs, over several seeds (docs/flywheel.md, selective labels).

Each arm is one `make flywheel` run per seed with its own label regime, audit share and weight,
drift day and held-out shares; every arm of a seed sees the same v1 decisions, so each arm is
compared with its group's baseline on the same seed (the paired change), and the spread is the
sample standard deviation over seeds. Runs are kept under `--out`/<arm>-s<seed>; a run whose
summary is there is not run again, so an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from flywheel.loop import run
from flywheel.settings import FlywheelSettings
from simulator.label_regimes import LabelRegime
from training.results import spread


class Arm(NamedTuple):
    name: str
    #: The arms of a group are compared with its first, on the same seed.
    group: str
    #: FlywheelSettings fields that differ from the defaults.
    settings: dict[str, Any]


_YOUNG = {"drift_day": 26, "validation_share": 0.1, "evaluation_share": 0.1}
_TODAY = {"regime": LabelRegime.TODAY}
ARMS = (
    Arm("cap-d20-a0", "drift on day 20", {}),
    Arm("cap-d20-a0.001-w1", "drift on day 20", {"audit_share": 0.001}),
    Arm("cap-d20-a0.01-w1", "drift on day 20", {"audit_share": 0.01}),
    Arm("cap-d20-a0.001-winv", "drift on day 20", {"audit_share": 0.001, "audit_weight": 1000.0}),
    Arm("cap-d20-a0.01-winv", "drift on day 20", {"audit_share": 0.01, "audit_weight": 100.0}),
    Arm("today-d20", "drift on day 20", _TODAY),
    Arm("B-cap-a0", "younger training rows", _YOUNG),
    Arm("B-cap-a0.01-w1", "younger training rows", {**_YOUNG, "audit_share": 0.01}),
    Arm(
        "B-cap-a0.01-winv",
        "younger training rows",
        {**_YOUNG, "audit_share": 0.01, "audit_weight": 100.0},
    ),
    Arm("B-today", "younger training rows", {**_YOUNG, **_TODAY}),
    Arm("cap-d33-a0", "drift on day 33", {"drift_day": 33}),
    Arm("today-d33", "drift on day 33", {"drift_day": 33, **_TODAY}),
)

_Summary = dict[str, Any]


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """The mean and the sample standard deviation (NaN with fewer than two), for results.json."""
    mean, std = spread(values)
    return {"mean": round(mean, 6), "std": round(std, 6)}


def _takeover_recall(summary: _Summary) -> float:
    return float(summary["late_window"]["v2"]["recall_new_pattern"])


def _all_recall(summary: _Summary) -> float:
    return float(summary["late_window"]["v2"]["recall_all"])


def _paired_change(
    runs: dict[int, _Summary], base: dict[int, _Summary], figure: Callable[[_Summary], float]
) -> dict[str, float]:
    """The change of `figure` against the baseline's run of the same seed, over the seeds."""
    return mean_std([figure(runs[s]) - figure(base[s]) for s in sorted(runs) if s in base])


def aggregate(summaries: dict[str, dict[int, _Summary]]) -> list[dict[str, Any]]:
    """One row per arm with runs: v2's recall (all frauds, takeovers) over the seeds, its paired
    change against its group's baseline (the group's first arm) on the same seeds, and what the
    labels cost."""
    baseline: dict[str, str] = {}
    for arm in ARMS:
        baseline.setdefault(arm.group, arm.name)
    rows = []
    for arm in ARMS:
        runs = summaries.get(arm.name, {})
        if not runs:
            continue
        base = summaries.get(baseline[arm.group], {})
        compared = arm.name != baseline[arm.group] and len(set(runs) & set(base)) > 1
        seeds = sorted(runs)
        labels = [runs[s].get("labels", {}) for s in seeds]
        rows.append(
            {
                "arm": arm.name,
                "group": arm.group,
                "settings": {k: str(v) for k, v in arm.settings.items()},
                "seeds": seeds,
                "v2_recall_takeovers": mean_std([_takeover_recall(runs[s]) for s in seeds]),
                "v2_recall_all": mean_std([_all_recall(runs[s]) for s in seeds]),
                "change_takeovers": _paired_change(runs, base, _takeover_recall)
                if compared
                else None,
                "change_all": _paired_change(runs, base, _all_recall) if compared else None,
                "per_seed_takeovers": [_takeover_recall(runs[s]) for s in seeds],
                "reviews_a_day": mean_std([float(x.get("reviews_a_day", 0.0)) for x in labels]),
                "takeovers_reported": mean_std(
                    [float(x.get("new_pattern_frauds_reported", 0)) for x in labels]
                ),
                "takeovers_audited": mean_std(
                    [float(x.get("new_pattern_by_audit", 0)) for x in labels]
                ),
                # Per seed: frauds found and transactions audited, before and after the drift.
                "audits_before_and_after_drift": [
                    [
                        x.get("audit_frauds_before_drift"),
                        x.get("audits_before_drift"),
                        x.get("audit_frauds_after_drift"),
                        x.get("audits_after_drift"),
                    ]
                    for x in labels
                ],
            }
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flywheel.audit_study",
        description="Runs the flywheel once per arm and seed (about 75 s each on 2 cores: "
        f"{len(ARMS)} arms x 3 seeds take about 45 minutes) and prints what a random audit "
        "buys v2 on the new pattern, and what it costs in reviews. Needs a running broker. An "
        "arm's name says its settings: cap or today, the label regime; d20 or d33, the drift "
        "day; B, the drift on day 26 with 10 % of the rows for validation and 10 % for "
        "evaluation; a, the audit share; w1 or winv, audited frauds weighing 1 or 1/share.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=FlywheelSettings._field_defaults["bootstrap"],
        help="Kafka brokers",
    )
    parser.add_argument(
        "--seeds", default="17,18,19", help="simulator seeds, comma-separated (at least 2)"
    )
    parser.add_argument(
        "--arms",
        default=",".join(a.name for a in ARMS),
        help="the arms to run, comma-separated: " + ", ".join(a.name for a in ARMS),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(".kafka/flywheel-audit"),
        help="the runs (<arm>-s<seed>, kept: a study resumes) and results.json",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=FlywheelSettings._field_defaults["metrics_port"],
        help="the scorer's metrics port",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be integers, comma-separated, got {args.seeds!r}")
    known = {a.name: a for a in ARMS}
    chosen = args.arms.split(",")
    if len(set(seeds)) < 2 or not set(chosen) <= set(known):
        parser.error(
            f"need at least 2 distinct --seeds and --arms among {', '.join(known)}, got "
            f"{args.seeds!r} and {args.arms!r}"
        )
    summaries: dict[str, dict[int, _Summary]] = {}
    todo = [(known[name], seed) for seed in seeds for name in chosen]
    began = time.monotonic()
    for done, (arm, seed) in enumerate(todo, 1):
        out = args.out / f"{arm.name}-s{seed}"
        summary_path = out / "summary.json"
        if not summary_path.is_file():
            settings = FlywheelSettings(
                bootstrap=args.bootstrap_servers,
                seed=seed,
                out=out,
                metrics_port=args.metrics_port,
                **arm.settings,
            )
            try:
                run(settings)
            except RuntimeError as exc:
                print(f"flywheel.audit_study: {arm.name} seed {seed}: {exc}", file=sys.stderr)
                return 1
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(
                f"flywheel.audit_study: cannot read {summary_path} ({exc}): delete {out} to run "
                "that arm again",
                file=sys.stderr,
            )
            return 1
        summaries.setdefault(arm.name, {})[seed] = summary
        print(
            f"flywheel.audit_study: {done}/{len(todo)} runs ({arm.name}, seed {seed}), "
            f"{time.monotonic() - began:.0f} s",
            flush=True,
        )
    rows = aggregate(summaries)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    _print_table(rows)
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    def cell(figure: dict[str, float] | None) -> str:
        return "" if figure is None else f"{figure['mean']:+.3f} ± {figure['std']:.3f}"

    print("\narm                      reviews/day  takeovers audited  v2 takeover recall  change")
    for row in rows:
        recall = row["v2_recall_takeovers"]
        print(
            f"{row['arm']:<24} {row['reviews_a_day']['mean']:>11.1f}  "
            f"{row['takeovers_audited']['mean']:>17.1f}  "
            f"{recall['mean']:>8.3f} ± {recall['std']:.3f}  {cell(row['change_takeovers'])}"
        )


if __name__ == "__main__":
    sys.exit(main())
