"""`make bench`: the service against other ways of doing its job, on the local broker, over one
pre-produced backlog of transactions, plus its latency under open-loop load.

Every contender (bench/contenders.py) runs once per round, for `--rounds` rounds; each is
measured over a steady window of `--window` seconds after a `--warmup` (bench/harness.py), and
the figures are the medians over the rounds with their spread (bench/summary.py). Before them,
on a broker with no backlog yet, the event→decision latency at an open-loop 5,000 tx/s
(fraud-loadgen) of the service (at-least-once, exactly-once, reasons off) and of the Quix Streams
contender; after them, optionally (`--profile`), a py-spy
profile of the service working through the backlog; and the cost per million decisions at a
given machine price. A broker just started answers slowly for about a minute (its JIT warming
up: p99 266, 94, then 30 ms in three latency runs in a row after a start), so the latency runs
follow `--broker-warmup` seconds of the same load, not measured. Figures are compared
with the budgets in bench/bounds.json; the results go to bench/results/latest.json and, last on
stdout, one JSON line. A benchmark, not a test: it exits 0 on a missed bound unless `--strict`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import onnxruntime

from bench import profiling
from bench.contenders import CONTENDERS, LABELS, Run, contender, latency
from bench.harness import Broker, load_average, produce_backlog, shown
from bench.latency_table import (
    DEFAULT_GUARANTEES,
    Cell,
    cells_of,
    measure_table,
    render_stages,
    summarize,
)
from bench.latency_table import DEFAULT_PARTITIONS as DEFAULT_TABLE_PARTITIONS
from bench.latency_table import DEFAULT_RATES as DEFAULT_TABLE_RATES
from bench.latency_table import DEFAULT_RUNS as DEFAULT_TABLE_RUNS
from bench.latency_table import render as render_latency_table
from bench.summary import (
    LATENCY_FIGURES,
    Round,
    check_bounds,
    figures,
    render_bounds,
    render_table,
)

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_BOUNDS = BENCH_DIR / "bounds.json"
DEFAULT_RESULTS = BENCH_DIR / "results" / "latest.json"

#: Enough for the fastest contender (the pass-through, ~500,000 records/s on 2 cores) to stay
#: busy through its warm-up and window.
DEFAULT_RECORDS = 7_000_000
DEFAULT_PARTITIONS = 3
DEFAULT_ROUNDS = 3
DEFAULT_WARMUP_S = 3.0
DEFAULT_WINDOW_S = 10.0
DEFAULT_LATENCY_DURATION_S = 20.0
DEFAULT_BROKER_WARMUP_S = 60.0
#: --quick: a check of the set-up, not a measurement.
QUICK = {
    "records": 300_000,
    "rounds": 1,
    "warmup_s": 1.0,
    "window_s": 3.0,
    "latency": 5.0,
    "broker_warmup": 5.0,
}
#: A 2-vCPU cloud machine, on demand, in USD.
DEFAULT_PRICE_PER_HOUR = 0.10


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers [env KAFKA_BOOTSTRAP_SERVERS; default: %(default)s]",
    )
    parser.add_argument("--records", type=int, help=f"backlog size (default: {DEFAULT_RECORDS:,})")
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="partitions of every benchmark topic (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, help=f"rounds of every contender (default: {DEFAULT_ROUNDS})"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help=f"seconds after a contender's first output before its "
        f"window opens (default: {DEFAULT_WARMUP_S:g})",
    )
    parser.add_argument(
        "--window",
        type=float,
        help=f"seconds of steady state measured per contender and "
        f"round (default: {DEFAULT_WINDOW_S:g})",
    )
    parser.add_argument(
        "--latency-duration",
        type=float,
        help=f"seconds of each open-loop latency run (default: {DEFAULT_LATENCY_DURATION_S:g})",
    )
    parser.add_argument(
        "--broker-warmup",
        type=float,
        help="seconds of the latency run's load, not measured, before the latency runs: a "
        "broker just started is slow for about a minute; 0 skips it "
        f"(default: {DEFAULT_BROKER_WARMUP_S:g})",
    )
    parser.add_argument(
        "--price-per-hour",
        type=float,
        default=DEFAULT_PRICE_PER_HOUR,
        help="USD per hour of this machine, for the cost per million decisions "
        "(default: %(default)s, a 2-vCPU on-demand instance)",
    )
    parser.add_argument(
        "-X",
        "--kafka-option",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka setting for every confluent-kafka contender (repeatable)",
    )
    parser.add_argument(
        "--service-flag",
        dest="service_flags",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag of every service contender, e.g. --service-flag=--scoring "
        "--service-flag=inline (repeatable)",
    )
    table = parser.add_argument_group(
        "latency table",
        "p50/p99/max event→decision by guarantee, partitions and rate, run after the latency "
        "runs (bench/latency_table.py); --quick: one run of one cell",
    )
    table.add_argument(
        "--table-partitions",
        type=_numbers(int),
        help="partition counts, comma-separated "
        f"(default: {','.join(map(str, DEFAULT_TABLE_PARTITIONS))})",
    )
    table.add_argument(
        "--table-rates",
        type=_numbers(float),
        help="open-loop rates in tx/s, comma-separated "
        f"(default: {','.join(f'{r:g}' for r in DEFAULT_TABLE_RATES)})",
    )
    table.add_argument(
        "--table-guarantees",
        type=lambda text: tuple(text.split(",")),
        help=f"processing guarantees, comma-separated (default: {','.join(DEFAULT_GUARANTEES)})",
    )
    table.add_argument(
        "--table-runs",
        type=int,
        help=f"runs per cell; 0 skips the table (default: {DEFAULT_TABLE_RUNS})",
    )
    parser.add_argument("--quick", action="store_true", help="a small run, to check the set-up")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile the service over the backlog with py-spy (the bench extra)",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a bound is missed")
    parser.add_argument("--bounds", type=Path, default=DEFAULT_BOUNDS, help="budgets file")
    parser.add_argument(
        "--results", type=Path, default=DEFAULT_RESULTS, help="where to write the results JSON"
    )
    return parser


def settings(args: argparse.Namespace, scratch: Path) -> Run:
    """The run's settings; ValueError naming the option for a bad one."""

    def pick(value: float | None, default: float, quick: float) -> float:
        return value if value is not None else quick if args.quick else default

    run = Run(
        bootstrap=args.bootstrap_servers,
        records=int(pick(args.records, DEFAULT_RECORDS, QUICK["records"])),
        partitions=args.partitions,
        rounds=int(pick(args.rounds, DEFAULT_ROUNDS, QUICK["rounds"])),
        warmup_s=pick(args.warmup, DEFAULT_WARMUP_S, QUICK["warmup_s"]),
        window_s=pick(args.window, DEFAULT_WINDOW_S, QUICK["window_s"]),
        latency_duration_s=pick(
            args.latency_duration, DEFAULT_LATENCY_DURATION_S, QUICK["latency"]
        ),
        price_per_hour=args.price_per_hour,
        kafka_options=tuple(args.kafka_options),
        service_flags=tuple(args.service_flags),
        logs=args.results.parent / "logs",
        scratch=scratch,
        broker_warmup_s=pick(args.broker_warmup, DEFAULT_BROKER_WARMUP_S, QUICK["broker_warmup"]),
    )
    for name, value, low in (
        ("--records", run.records, 2),
        ("--partitions", run.partitions, 1),
        ("--rounds", run.rounds, 1),
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    for name, seconds in (
        ("--warmup", run.warmup_s),
        ("--window", run.window_s),
        ("--latency-duration", run.latency_duration_s),
    ):
        if not seconds > 0:
            raise ValueError(f"{name} must be > 0, got {seconds:g}")
    for name, amount in (
        ("--price-per-hour", run.price_per_hour),
        ("--broker-warmup", run.broker_warmup_s),
    ):
        if not amount >= 0:
            raise ValueError(f"{name} must be >= 0, got {amount:g}")
    return run


def _numbers(kind: type[int] | type[float]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            numbers = tuple(kind(word) for word in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected numbers like 1,12,24, got {text!r}"
            ) from None
        if any(n <= 0 for n in numbers):
            raise argparse.ArgumentTypeError(f"every number must be > 0, got {text!r}")
        return numbers

    return parse


def table_cells(args: argparse.Namespace) -> tuple[list[Cell], int]:
    """The latency table's cells and runs per cell; ValueError naming the option."""
    quick = args.quick
    runs = args.table_runs if args.table_runs is not None else 1 if quick else DEFAULT_TABLE_RUNS
    if runs < 0:
        raise ValueError(f"--table-runs must be >= 0, got {runs}")
    cells = cells_of(
        args.table_guarantees or (("at-least-once",) if quick else DEFAULT_GUARANTEES),
        args.table_partitions or ((1,) if quick else DEFAULT_TABLE_PARTITIONS),
        args.table_rates or ((5_000.0,) if quick else DEFAULT_TABLE_RATES),
    )
    return cells, runs


def _note(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _rounds(run: Run, broker: Broker, backlog: str) -> list[Round]:
    rounds: list[Round] = []
    for index in range(1, run.rounds + 1):
        round_: Round = {}
        for name in CONTENDERS:
            _note(f"round {index}/{run.rounds}: {name}")
            measurement = contender(run, broker, name, backlog, f"{name}-{index}")
            if measurement.error:
                _note(f"{name}: {measurement.error}")
            elif measurement.exhausted and measurement.window_s < run.window_s:
                shortfall = f"the backlog ran out after {measurement.window_s:.1f} s of window"
                _note(f"{name}: {shortfall}: raise --records")
            round_[name] = measurement
        rounds.append(round_)
    return rounds


def _latency(run: Run, broker: Broker, variant: str) -> dict[str, Any]:
    mode = LABELS[variant]
    _note(f"latency ({mode}): fraud-loadgen at 5,000 tx/s for {run.latency_duration_s:g} s")
    report = run.logs.parent / f"latency-report-{variant}"
    try:
        return latency(run, broker, report, variant=variant)
    except RuntimeError as exc:
        _note(f"latency ({mode}): {exc}")
        return {"error": str(exc), "p99_ms": None}


def _broker_warmup(run: Run, broker: Broker) -> dict[str, Any]:
    """The latency run's load for `run.broker_warmup_s`, not measured (its p99 is kept, to show
    what a cold broker does)."""
    _note(
        f"broker warm-up: fraud-loadgen at 5,000 tx/s for {run.broker_warmup_s:g} s, not measured"
    )
    warm_run = run._replace(latency_duration_s=run.broker_warmup_s)
    report = run.logs.parent / "latency-report-warmup"
    try:
        measured = latency(warm_run, broker, report, role="latency-warmup")
    except RuntimeError as exc:
        _note(f"broker warm-up: {exc}")
        return {"seconds": run.broker_warmup_s, "error": str(exc)}
    return {"seconds": run.broker_warmup_s, "p99_ms": measured.get("p99_ms")}


def _profile(run: Run, broker: Broker, backlog: str) -> dict[str, Any]:
    """The service over the backlog again, under py-spy; its top entries."""
    executable = profiling.py_spy()
    if executable is None:
        return {"error": "py-spy is not installed: pip install -e '.[bench]'"}
    raw_path = run.logs / "pipeline-profile.txt"
    wrapper = profiling.py_spy_prefix(executable, raw_path)
    measurement = contender(run, broker, "pipeline", backlog, "pipeline-profiled", wrapper)
    if not raw_path.is_file():
        return {"error": f"py-spy wrote no profile; see {run.logs / 'pipeline-profiled.log'}"}
    profile = profiling.summarize(raw_path.read_text())
    return {
        "raw": shown(raw_path),
        "records_per_s_while_profiled": measurement.records_per_s,
        "samples": profile.samples,
        "all_samples": profile.all_samples,
        "by_thread": [entry._asdict() for entry in profile.by_thread],
        "own": [entry._asdict() for entry in profile.own],
        "own_lines": [entry._asdict() for entry in profile.own_lines],
        "inclusive": [entry._asdict() for entry in profile.inclusive],
        "text": profiling.render(profile),
    }


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        try:
            run = settings(args, Path(scratch))
            cells, table_runs = table_cells(args)
            bounds: list[dict[str, Any]] = json.loads(args.bounds.read_text())["bounds"]
        except (ValueError, OSError, KeyError) as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        run.logs.mkdir(parents=True, exist_ok=True)
        broker = Broker(run.bootstrap)
        results: dict[str, Any] = {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": _machine(),
            "settings": {
                **{
                    k: shown(v) if isinstance(v, Path) else str(v)
                    for k, v in run._asdict().items()
                    if k != "scratch"
                },
                "quick": args.quick,
            },
        }
        try:
            broker.check()
            # Latency first, on a broker that holds none of the throughput rounds' gigabytes and
            # is not deleting them (a run after the rounds measured that too).
            if run.broker_warmup_s > 0:
                results["broker_warmup"] = _broker_warmup(run, broker)
            latencies = {name: _latency(run, broker, name) for name, _, _ in LATENCY_FIGURES}
            table = measure_table(run, broker, cells, table_runs, _note) if table_runs else []
            broker.delete_topics()  # the table's many topics, before the backlog's gigabytes
            backlog = broker.topic("backlog", run.partitions)
            _note(f"producing a backlog of {run.records:,} transactions to {backlog}")
            results["backlog_produce_s"] = round(
                produce_backlog(run.bootstrap, backlog, run.records), 2
            )
            rounds = _rounds(run, broker, backlog)
            if args.profile:
                _note("profile: the service over the backlog again, under py-spy")
                results["profile"] = _profile(run, broker, backlog)
        except RuntimeError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        finally:
            broker.delete_topics()
    values = figures(rounds, latencies, run.price_per_hour)
    checked = check_bounds(bounds, values)
    results.update(
        load_average_after=load_average(),
        rounds=[{name: m._asdict() for name, m in r.items()} for r in rounds],
        latency=latencies["pipeline"],
        latency_eos=latencies["pipeline_eos"],
        latency_no_reasons=latencies["pipeline_no_reasons"],
        latency_quix=latencies["quix"],
        latency_table={"runs": table, "cells": summarize(table)},
        figures=values,
        bounds=checked,
    )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")

    print(render_table(rounds, values, run.price_per_hour))
    if table:
        print(render_latency_table(summarize(table)))
        print(render_stages(summarize(table)))
    if "profile" in results:
        print(results["profile"].get("text") or results["profile"]["error"])
    print(render_bounds(checked))
    print(f"results: {shown(args.results)}")
    met = all(bound["met"] for bound in checked)
    print(json.dumps({**values, "bounds_met": met}), flush=True)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
