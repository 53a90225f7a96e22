"""`make bench`: the service against three other ways of doing its job, on the local broker,
over the same pre-produced backlog of transactions, plus its latency under open-loop load.

Contenders, each a child process reading the one backlog topic in its own consumer group and
writing to its own output topic:

- passthrough (bench/loops.py): consume → produce, no decoding, no scoring; the ceiling.
- pipeline: `python -m stream run` with its defaults; the service itself.
- faust (bench/faust_app.py): faust-streaming, `Stream.take(max_, within)`, the same model.
- per_record (bench/loops.py): one ONNX Runtime call per record; the naive loop.

Then the service's event→decision latency at an open-loop 5,000 tx/s (fraud-loadgen), the
cost per million decisions at a given machine price, and optionally (`--profile`) a py-spy
profile of the service working through the backlog. Figures are compared with the budgets in
bench/bounds.json; the results go to bench/results/latest.json and, last on stdout, one JSON
line. A benchmark, not a test: it exits 0 on a missed bound unless `--strict`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import onnxruntime

from bench import profiling
from bench.harness import (
    REPO,
    Broker,
    Measurement,
    free_port,
    load_average,
    measure,
    produce_backlog,
    stop,
)
from loadgen.html_report import REPORT_FILE

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_BOUNDS = BENCH_DIR / "bounds.json"
DEFAULT_RESULTS = BENCH_DIR / "results" / "latest.json"

DEFAULT_RECORDS = 200_000
QUICK_RECORDS = 20_000
DEFAULT_PARTITIONS = 3
#: The slow contenders get this long over the backlog; their rate is measured on what they
#: produced by then, which keeps the whole benchmark within about five minutes.
DEFAULT_CONTENDER_TIMEOUT_S = 75.0
QUICK_CONTENDER_TIMEOUT_S = 25.0
LATENCY_RATE = 5_000.0
DEFAULT_LATENCY_DURATION_S = 20.0
QUICK_LATENCY_DURATION_S = 5.0
#: A 2-vCPU cloud machine, on demand, in USD.
DEFAULT_PRICE_PER_HOUR = 0.10
SECONDS_PER_HOUR = 3_600.0
PER_MILLION = 1_000_000.0
#: How long the latency run's service may take to be assigned its partitions.
ASSIGNMENT_TIMEOUT_S = 60.0
ASSIGNMENT_POLL_S = 0.2
#: What the service logs (at INFO, its default) once the group gave it partitions.
ASSIGNED_LOG_LINE = "INFO stream.service: assigned "
#: On top of the load run itself: start-up, draining and settling of fraud-loadgen.
LOADGEN_GRACE_S = 120.0

CONTENDERS: tuple[str, ...] = ("passthrough", "pipeline", "faust", "per_record")
LABELS = {
    "passthrough": "pass-through (ceiling)",
    "pipeline": "pipeline (the service)",
    "faust": "faust-streaming take()",
    "per_record": "per-record scoring",
}


class Run(NamedTuple):
    """One benchmark run's settings."""

    bootstrap: str
    records: int
    partitions: int
    contender_timeout_s: float
    latency_duration_s: float
    price_per_hour: float
    #: Extra librdkafka settings, given alike to every confluent-kafka contender.
    kafka_options: tuple[str, ...]
    #: Contender logs, the profile, the latency run's report.
    logs: Path
    #: Throw-away state of the contenders (faust's data directory), removed after the run.
    scratch: Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pipeline_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers [env KAFKA_BOOTSTRAP_SERVERS; default: %(default)s]",
    )
    parser.add_argument(
        "--records",
        type=int,
        help=f"backlog size (default: {DEFAULT_RECORDS:,}; --quick: {QUICK_RECORDS:,})",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="partitions of every benchmark topic (default: %(default)s)",
    )
    parser.add_argument(
        "--contender-timeout",
        type=float,
        help="seconds a contender may spend on the backlog; a slower one is measured on what it "
        f"did by then (default: {DEFAULT_CONTENDER_TIMEOUT_S:g}; --quick: "
        f"{QUICK_CONTENDER_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--latency-duration",
        type=float,
        help=f"seconds of the open-loop {LATENCY_RATE:,.0f} tx/s latency run "
        f"(default: {DEFAULT_LATENCY_DURATION_S:g}; --quick: {QUICK_LATENCY_DURATION_S:g})",
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
        help="extra librdkafka setting for the service, the pass-through and the per-record "
        "contenders alike (repeatable)",
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
    return parser  # fmt: skip


def _settings(args: argparse.Namespace, scratch: Path) -> Run:
    def pick(value: float | None, default: float, quick: float) -> float:
        return value if value is not None else quick if args.quick else default

    run = Run(
        bootstrap=args.bootstrap_servers,
        records=int(pick(args.records, DEFAULT_RECORDS, QUICK_RECORDS)),
        partitions=args.partitions,
        contender_timeout_s=pick(
            args.contender_timeout, DEFAULT_CONTENDER_TIMEOUT_S, QUICK_CONTENDER_TIMEOUT_S
        ),
        latency_duration_s=pick(
            args.latency_duration, DEFAULT_LATENCY_DURATION_S, QUICK_LATENCY_DURATION_S
        ),
        price_per_hour=args.price_per_hour,
        kafka_options=tuple(args.kafka_options),
        logs=args.results.parent / "logs",
        scratch=scratch,
    )
    if run.records < 2:
        raise ValueError(f"--records must be >= 2, got {run.records}")
    if run.partitions < 1:
        raise ValueError(f"--partitions must be >= 1, got {run.partitions}")
    if not run.contender_timeout_s > 0:
        raise ValueError(f"--contender-timeout must be > 0, got {run.contender_timeout_s}")
    if not run.latency_duration_s > 0:
        raise ValueError(f"--latency-duration must be > 0, got {run.latency_duration_s}")
    if not run.price_per_hour >= 0:
        raise ValueError(f"--price-per-hour must be >= 0, got {run.price_per_hour}")
    return run


def _note(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _kafka_flags(run: Run) -> list[str]:
    return [word for option in run.kafka_options for word in ("-X", option)]


def _service_command(run: Run, input_topic: str, output_topic: str, dlq_topic: str,
                     group: str, metrics_port: int) -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "stream", "run",
        "--bootstrap-servers", run.bootstrap,
        "--input-topic", input_topic, "--output-topic", output_topic, "--dlq-topic", dlq_topic,
        "--group-id", group, "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
        *_kafka_flags(run),
    ]  # fmt: skip


def _loop_command(
    run: Run, mode: str, input_topic: str, output_topic: str, group: str
) -> list[str]:
    return [
        sys.executable, "-m", "bench.loops", mode, "--bootstrap-servers", run.bootstrap,
        "--input-topic", input_topic, "--output-topic", output_topic, "--group-id", group,
        *_kafka_flags(run),
    ]  # fmt: skip


def _contender(
    run: Run, broker: Broker, name: str, backlog: str, wrapper: Sequence[str] = ()
) -> Measurement:
    """Run one contender over the backlog; `wrapper` prefixes its command (a profiler)."""
    role = f"{name}-profiled" if wrapper else name
    output = broker.topic(f"{role}-out", run.partitions)
    group = broker.group(role)
    env: dict[str, str] = {}
    if name == "pipeline":
        dlq = broker.topic(f"{role}-dlq", run.partitions)
        command = _service_command(run, backlog, output, dlq, group, free_port())
    elif name == "faust":
        if importlib.util.find_spec("faust") is None:
            return Measurement(
                name, 0, False, 0.0, None, load_average(),
                "faust-streaming is not installed: pip install -e '.[bench]'",
            )  # fmt: skip
        command = [sys.executable, "-m", "bench.faust_app", "worker", "-l", "warn"]
        env = {
            "BENCH_BOOTSTRAP_SERVERS": run.bootstrap,
            "BENCH_INPUT_TOPIC": backlog,
            "BENCH_OUTPUT_TOPIC": output,
            "BENCH_GROUP_ID": group,
            "BENCH_DATADIR": str(run.scratch / "faust"),
        }
    else:
        command = _loop_command(run, name.replace("_", "-"), backlog, output, group)
    _note(f"{name}: running over {run.records:,} records (at most {run.contender_timeout_s:g} s)")
    result = measure(
        name,
        [*wrapper, *command],
        bootstrap=run.bootstrap,
        output_topic=output,
        expected=run.records,
        timeout_s=run.contender_timeout_s,
        log_path=run.logs / f"{role}.log",
        env=env,
    )
    if result.error:
        _note(f"{name}: {result.error}")
    return result


def _wait_for_assignment(log_path: Path, service: subprocess.Popen[bytes]) -> None:
    """Wait until the service has joined its group and been given partitions (its log says
    so), so that the latency run does not measure the group join."""
    deadline = time.monotonic() + ASSIGNMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        if ASSIGNED_LOG_LINE in log_path.read_text(errors="replace"):
            return
        if service.poll() is not None:
            raise RuntimeError(f"the service exited early; see {log_path}")
        time.sleep(ASSIGNMENT_POLL_S)
    raise RuntimeError(f"the service got no partitions within {ASSIGNMENT_TIMEOUT_S} s")


def _latency(run: Run, broker: Broker, report_dir: Path) -> dict[str, Any]:
    """The service's event→decision latency under fraud-loadgen at LATENCY_RATE, open loop."""
    input_topic = broker.topic("latency-in", run.partitions)
    output_topic = broker.topic("latency-out", run.partitions)
    dlq_topic = broker.topic("latency-dlq", run.partitions)
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    command = _service_command(
        run, input_topic, output_topic, dlq_topic, broker.group("latency"), port
    )
    load = load_average()
    _note(f"latency: fraud-loadgen at {LATENCY_RATE:,.0f} tx/s for {run.latency_duration_s:g} s")
    loadgen_command = [
        sys.executable, "-m", "loadgen.cli", "--bootstrap-servers", run.bootstrap,
        "--input-topic", input_topic, "--output-topic", output_topic, "--dlq-topic", dlq_topic,
        "--rate", str(LATENCY_RATE), "--duration", str(run.latency_duration_s),
        "--metrics-url", metrics_url, "--report", str(report_dir), "--json", "--quiet",
    ]  # fmt: skip
    log_path = run.logs / "latency-service.log"
    with log_path.open("wb") as log:
        service = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for_assignment(log_path, service)
        loadgen = subprocess.run(
            loadgen_command, cwd=REPO, capture_output=True, text=True, check=False,
            timeout=run.latency_duration_s + LOADGEN_GRACE_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"fraud-loadgen did not finish within {exc.timeout} s") from exc
    finally:
        stop(service)
    if not loadgen.stdout.strip():
        raise RuntimeError(f"fraud-loadgen printed no summary:\n{loadgen.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(loadgen.stdout.strip().splitlines()[-1])
    keys = ("sent", "decided", "lost", "duplicates", "achieved_rate", "schedule_lag_max_ms",
            "p50_ms", "p95_ms", "p99_ms", "max_ms")  # fmt: skip
    return {
        "rate": LATENCY_RATE,
        "duration_s": run.latency_duration_s,
        "load_average_before": load,
        "report": _shown(report_dir / REPORT_FILE),
        **{key: summary.get(key) for key in keys},
    }


def _profile(run: Run, broker: Broker, backlog: str) -> dict[str, Any]:
    """The service over the backlog again, under py-spy; its top entries."""
    executable = profiling.py_spy()
    if executable is None:
        return {"error": "py-spy is not installed: pip install -e '.[bench]'"}
    raw_path = run.logs / "pipeline-profile.txt"
    measurement = _contender(
        run, broker, "pipeline", backlog, profiling.py_spy_prefix(executable, raw_path)
    )
    if not raw_path.is_file():
        log = _shown(run.logs / "pipeline-profiled.log")
        return {"error": f"py-spy wrote no profile; see {log}"}
    profile = profiling.summarize(raw_path.read_text())
    return {
        "raw": _shown(raw_path),
        "records_per_s_while_profiled": measurement.records_per_s,
        "samples": profile.samples,
        "all_samples": profile.all_samples,
        "by_thread": [entry._asdict() for entry in profile.by_thread],
        "own": [entry._asdict() for entry in profile.own],
        "own_lines": [entry._asdict() for entry in profile.own_lines],
        "inclusive": [entry._asdict() for entry in profile.inclusive],
        "text": profiling.render(profile),
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)


def cost_per_million(records_per_s: float | None, price_per_hour: float) -> float | None:
    """USD per million decisions for a machine doing `records_per_s` at `price_per_hour`."""
    if not records_per_s:
        return None
    return round(price_per_hour / (records_per_s * SECONDS_PER_HOUR) * PER_MILLION, 5)


def figures(
    measurements: dict[str, Measurement], p99_ms: float | None, price_per_hour: float
) -> dict[str, float | None]:
    """The headline numbers (the keys of the final JSON line)."""
    tps = {name: measurements[name].records_per_s for name in CONTENDERS}
    pipeline = tps["pipeline"]
    return {
        "pipeline_tps": pipeline and round(pipeline, 1),
        "passthrough_tps": tps["passthrough"] and round(tps["passthrough"], 1),
        "faust_tps": tps["faust"] and round(tps["faust"], 1),
        "per_record_tps": tps["per_record"] and round(tps["per_record"], 1),
        "p99_ms_at_5000": p99_ms,
        "pipeline_vs_passthrough": _ratio(pipeline, tps["passthrough"]),
        "pipeline_vs_faust": _ratio(pipeline, tps["faust"]),
        "pipeline_vs_per_record": _ratio(pipeline, tps["per_record"]),
        "cost_per_million_decisions_usd": cost_per_million(pipeline, price_per_hour),
        "price_per_hour_usd": price_per_hour,
    }


def check_bounds(
    bounds: list[dict[str, Any]], values: dict[str, float | None]
) -> list[dict[str, Any]]:
    """Each bound with the measured value and whether it was met (unmeasured: missed)."""
    checked = []
    for bound in bounds:
        value = values.get(bound["metric"])
        if value is None:
            met = False
        elif "min" in bound:
            met = value >= bound["min"]
        else:
            met = value <= bound["max"]
        checked.append({**bound, "value": value, "met": met})
    return checked


def render_table(
    run: Run, measurements: dict[str, Measurement], values: dict[str, float | None]
) -> str:
    """The human-readable results."""
    lines = [
        f"{'contender':<24} {'outputs':>9} {'complete':>8} {'window s':>9} {'records/s':>11} "
        f"{'pipeline/it':>11} {'USD per M':>10} {'load 1m':>8}",
    ]
    pipeline = measurements["pipeline"].records_per_s
    for name in CONTENDERS:
        m = measurements[name]
        rate = "n/a" if m.records_per_s is None else f"{m.records_per_s:,.0f}"
        ratio = _ratio(pipeline, m.records_per_s)
        cost = cost_per_million(m.records_per_s, run.price_per_hour)
        lines.append(
            f"{LABELS[name]:<24} {m.outputs:>9,} {'yes' if m.complete else 'no':>8} "
            f"{m.window_s:>9.2f} {rate:>11} {'n/a' if ratio is None else f'{ratio:g}':>11} "
            f"{'n/a' if cost is None else f'{cost:.4f}':>10} {m.load_average_before:>8}"
        )
    p99 = values["p99_ms_at_5000"]
    lines.append(
        f"p99 event→decision at an open-loop {LATENCY_RATE:,.0f} tx/s: "
        + ("not measured" if p99 is None else f"{p99:g} ms")
    )
    return "\n".join(lines)


def render_bounds(checked: list[dict[str, Any]]) -> str:
    """One PASS/MISS line per bound."""
    lines = []
    for bound in checked:
        limit = f">= {bound['min']}" if "min" in bound else f"<= {bound['max']}"
        value = "not measured" if bound["value"] is None else bound["value"]
        lines.append(
            f"{'PASS' if bound['met'] else 'MISS'}  {bound['metric']} {limit}: {value}"
            f"  ({bound['why']})"
        )
    return "\n".join(lines)


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
    }


def _shown(path: Path) -> str:
    """`path` as results show it: relative to the repository when inside it."""
    return os.path.relpath(path, REPO) if path.resolve().is_relative_to(REPO) else str(path)


def _measure_all(
    run: Run, broker: Broker, args: argparse.Namespace, results: dict[str, Any]
) -> tuple[dict[str, Measurement], dict[str, Any]]:
    """Every measurement of the run: the contenders, the latency, the profile if asked."""
    broker.check()
    backlog = broker.topic("backlog", run.partitions)
    _note(f"producing a backlog of {run.records:,} transactions to {backlog}")
    results["backlog_produce_s"] = round(produce_backlog(run.bootstrap, backlog, run.records), 2)
    measurements = {name: _contender(run, broker, name, backlog) for name in CONTENDERS}
    try:
        latency = _latency(run, broker, run.logs.parent / "latency-report")
    except RuntimeError as exc:
        _note(f"latency: {exc}")
        latency = {"error": str(exc), "p99_ms": None}
    if args.profile:
        _note("profile: the service over the backlog again, under py-spy")
        results["profile"] = _profile(run, broker, backlog)
    return measurements, latency


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        try:
            run = _settings(args, Path(scratch))
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
                **{key: value for key, value in run._asdict().items() if key != "scratch"},
                "logs": _shown(run.logs),
                "quick": args.quick,
            },
        }
        try:
            measurements, latency = _measure_all(run, broker, args, results)
        except RuntimeError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        finally:
            broker.delete_topics()
    values = figures(measurements, latency["p99_ms"], run.price_per_hour)
    checked = check_bounds(bounds, values)
    results.update(
        load_average_after=load_average(),
        contenders={name: m._asdict() for name, m in measurements.items()},
        latency=latency,
        figures=values,
        bounds=checked,
    )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")

    print(render_table(run, measurements, values))
    if "profile" in results:
        print(results["profile"].get("text") or results["profile"]["error"])
    print(render_bounds(checked))
    print(f"results: {args.results}")
    met = all(bound["met"] for bound in checked)
    print(json.dumps({**values, "bounds_met": met}), flush=True)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
