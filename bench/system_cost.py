"""What the whole system costs, and what the features worker does to the scorer's latency:
the scorer alone, then the scorer with `fraud-features` beside it on the same input (publishing
the terminal risk the scorer reads), under fraud-loadgen's open-loop load (issue 44, item 4).

    python -m bench.system_cost [--rate 5000] [--partitions 12] [--duration 60] [--runs 3]

Each run is `bench.contenders.latency` on fresh topics: event→decision p50, p99 and max, and the
CPU-seconds each process spent per 1,000 decisions (from /proc): the scorer's over the load run,
the worker's until it has read and counted every transaction sent (how long after the load that
took is reported too: on a machine too small for both, the worker catches up after the load,
and its CPU is then what the load needed, not what it was given while it ran). The two
setups alternate, run after run, so a slow spell of the machine falls on both alike. The runs,
each figure's median and range, and the worker's share of the scorer's CPU go to
bench/results/system-cost.json; the table is printed.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.contenders import Run, latency
from bench.harness import REPO, connect, tool_parser

RESULTS = REPO / "bench" / "results" / "system-cost.json"
SETUPS = {"scorer alone": False, "scorer + fraud-features": True}
LATENCY_FIGURES = ("p50_ms", "p99_ms", "max_ms")


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per setup: runs, lost and duplicates summed, and each figure's median and [min, max]
    (latency in ms; CPU-seconds per 1,000 decisions of the scorer, the worker and both)."""
    summary: dict[str, dict[str, Any]] = {}
    for setup in SETUPS:
        ok = [r for r in runs if r["setup"] == setup and "error" not in r]
        row: dict[str, Any] = {
            "runs": len(ok),
            "failed": sum(1 for r in runs if r["setup"] == setup and "error" in r),
            "lost": sum(r.get("lost") or 0 for r in ok),
            "duplicates": sum(r.get("duplicates") or 0 for r in ok),
        }
        figures = {f: [r[f] for r in ok if r.get(f) is not None] for f in LATENCY_FIGURES}
        for process in ("scorer", "features_worker"):
            figures[f"{process}_cpu_s_per_1k"] = [
                r["cpu_s_per_1k"][process] for r in ok if process in r["cpu_s_per_1k"]
            ]
        figures["total_cpu_s_per_1k"] = [sum(r["cpu_s_per_1k"].values()) for r in ok]
        figures["worker_counted_after_s"] = [
            r["worker_counted_after_s"] for r in ok if r.get("worker_counted_after_s") is not None
        ]
        figures["worker_to_scorer"] = [
            r["cpu_s_per_1k"]["features_worker"] / r["cpu_s_per_1k"]["scorer"]
            for r in ok
            if "features_worker" in r["cpu_s_per_1k"] and r["cpu_s_per_1k"]["scorer"] > 0
        ]
        for name, values in figures.items():
            row[name] = (
                {"median": round(statistics.median(values), 4), "range": [min(values), max(values)]}
                if values
                else None
            )
        summary[setup] = row
    return summary


def render(summary: dict[str, dict[str, Any]]) -> str:
    """The summary as a Markdown table: median (min-max) per figure."""
    lines = [
        "| setup | runs | p50 ms | p99 ms | max ms | scorer CPU-s/1k | worker CPU-s/1k "
        "| both CPU-s/1k | worker / scorer | worker counted all, s after | lost |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for setup, row in summary.items():
        shown = [_shown(row[f], "{:.0f}") for f in LATENCY_FIGURES]
        shown += [
            _shown(row[f], "{:.3f}")
            for f in ("scorer_cpu_s_per_1k", "features_worker_cpu_s_per_1k", "total_cpu_s_per_1k")
        ]
        shown.append(_shown(row["worker_to_scorer"], "{:.2f}"))
        shown.append(_shown(row["worker_counted_after_s"], "{:.1f}"))
        runs = f"{row['runs']}" + (f" ({row['failed']} failed)" if row["failed"] else "")
        lines.append(f"| {setup} | {runs} | " + " | ".join(shown) + f" | {row['lost']} |")
    return "\n".join(lines)


def _shown(figure: dict[str, Any] | None, form: str) -> str:
    if figure is None:
        return "-"
    low, high = figure["range"]
    return f"{form.format(figure['median'])} ({form.format(low)}-{form.format(high)})"


def main() -> int:
    parser = tool_parser("python -m bench.system_cost", __doc__)
    parser.add_argument("--rate", type=float, default=5_000.0, help="tx/s (%(default)s)")
    parser.add_argument("--partitions", type=int, default=12, help="input partitions (%(default)s)")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of load a run (%(default)s)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each setup (%(default)s)")
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help="results file, JSON (%(default)s)"
    )
    args = parser.parse_args()
    if min(args.runs, args.partitions) < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--runs, --partitions, --rate and --duration must be positive")
    broker = connect(parser.prog, args.bootstrap_servers)
    if broker is None:
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="system-cost-"))
    run = Run(
        bootstrap=args.bootstrap_servers,
        records=0,
        partitions=args.partitions,
        rounds=0,
        warmup_s=0.0,
        window_s=0.0,
        latency_duration_s=args.duration,
        price_per_hour=0.0,
        kafka_options=(),
        service_flags=(),
        logs=scratch / "logs",
        scratch=scratch,
    )
    run.logs.mkdir()
    runs: list[dict[str, Any]] = []
    try:
        for turn in range(args.runs):
            for setup, worker in SETUPS.items():
                print(f"{setup}, run {turn + 1} of {args.runs}", flush=True)
                slug = "with-worker" if worker else "alone"
                try:
                    measured = latency(
                        run,
                        broker,
                        scratch / f"report-{slug}-{turn}",
                        role=f"system-{slug}-{turn}",
                        rate=args.rate,
                        features_worker=worker,
                    )
                except RuntimeError as exc:
                    print(f"  failed: {exc} (logs: {run.logs})", flush=True)
                    measured = {"error": str(exc)}
                runs.append({"setup": setup, "turn": turn, **measured})
                broker.delete_topics()
    finally:
        broker.delete_topics()
    summary = summarize(runs)
    settings = {k: v for k, v in vars(args).items() if k != "output"}
    result = {"settings": settings, "runs": runs, "summary": summary}
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(render(summary))
    if not any("error" in r for r in runs):
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
