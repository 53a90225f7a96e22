"""The contenders of `make bench` and how each is run and measured.

Each contender is a child process reading the one backlog topic in its own consumer group and
writing to its own output topic:

- passthrough (bench/loops.py): consume → produce, no decoding, no scoring; the ceiling.
- floor (bench/loops.py): the least an at-least-once scorer with card history must do per
  batch (decode, model, decisions and a changelog-sized record produced with delivery
  callbacks), without card state, reasons or bookkeeping.
- pipeline: `python -m stream run` with its defaults; the service itself (card history on).
- pipeline_stateless: the same with `--card-history off`: what the per-card state costs.
- pipeline_eos: the same with `--processing-guarantee exactly-once`.
- pipeline_no_reasons, pipeline_features: the same with `--reasons off`, and with every
  decision carrying its feature row (`--decision-features on`).
- faust (bench/faust_app.py): faust-streaming, `Stream.take(max_, within)`, the same model.
- quix (bench/quix_app.py): Quix Streams, record by record, per-card history in its RocksDB
  `State`, the same model; in its own virtualenv (QUIX_PYTHON).
- per_record (bench/loops.py): one ONNX Runtime call per record; the naive loop.

Plus the service's event→decision latency under fraud-loadgen at an open-loop rate.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.harness import (
    BACKLOG_EVENT_RATE,
    BACKLOG_SEED,
    REPO,
    Broker,
    Measurement,
    flagged_share,
    free_port,
    load_average,
    measure,
    process_cpu_s,
    shown,
    stop,
    wait_for_assignment,
    wait_ready,
)
from bench.loops import STATE_TOPIC_SUFFIX
from loadgen.html_report import REPORT_FILE
from loadgen.options import DEFAULT_SEED as LOADGEN_SEED
from loadgen.scrape import read_page
from loadgen.time_scale import time_scale
from plumbing.metrics_text import Sample, by_key, samples, scrape

CONTENDERS: tuple[str, ...] = (
    "passthrough",
    "floor",
    "pipeline",
    "pipeline_stateless",
    "pipeline_eos",
    "pipeline_no_reasons",
    "pipeline_features",
    "faust",
    "quix",
    "per_record",
)
LABELS = {
    "passthrough": "pass-through (ceiling)",
    "floor": "floor: decode, model, 2 outputs",
    "pipeline": "pipeline (the service)",
    "pipeline_stateless": "pipeline, no card history",
    "pipeline_eos": "pipeline, exactly-once",
    "pipeline_no_reasons": "pipeline, no reasons",
    "pipeline_features": "pipeline, features logged",
    "faust": "faust-streaming take()",
    "quix": "Quix Streams, RocksDB state",
    "per_record": "per-record scoring",
}
#: Service flags of each pipeline contender.
PIPELINE_FLAGS: dict[str, tuple[str, ...]] = {
    "pipeline": (),
    "pipeline_stateless": ("--card-history", "off"),
    "pipeline_eos": ("--processing-guarantee", "exactly-once"),
    "pipeline_no_reasons": ("--reasons", "off"),
    "pipeline_features": ("--decision-features", "on"),
}
LATENCY_RATE = 5_000.0
#: How long `fraud-features` may take to be ready before a whole-system latency run.
WORKER_READY_S = 120.0
#: The features worker's totals a whole-system run reports beside its CPU.
WORKER_FIGURES = (
    "fraud_features_risk_published_total",
    "fraud_features_card_frauds_published_total",
    "fraud_features_transactions_total",
)
#: How long the features worker may take, after the load, to count all of it.
WORKER_COUNT_TIMEOUT_S = 600.0
#: How long the latency run's service may take to be assigned its partitions.
ASSIGNMENT_TIMEOUT_S = 60.0
#: How long fraud-loadgen waits for the last decisions after sending: long enough for the
#: Quix Streams contender (about 2,000 records/s on 2 cores) to work through what it fell
#: behind by in a 20 s run at 5,000 tx/s.
DRAIN_TIMEOUT_S = 120.0
#: On top of the load run and its drain: start-up and settling of fraud-loadgen.
LOADGEN_GRACE_S = 60.0
#: Start-up (imports, model, group join) and stopping, on top of warm-up and window.
START_STOP_ALLOWANCE_S = 45.0
#: The Quix Streams contender's interpreter: quixstreams pins confluent-kafka below the
#: project's, so it has a virtualenv of its own (`make bench` builds it).
QUIX_PYTHON = REPO / ".venv-quix" / "bin" / "python"
QUIX_MISSING = f"Quix Streams' virtualenv is missing ({shown(QUIX_PYTHON)}): `make bench` builds it"


class Run(NamedTuple):
    """One benchmark run's settings."""

    bootstrap: str
    records: int
    partitions: int
    rounds: int
    warmup_s: float
    window_s: float
    latency_duration_s: float
    price_per_hour: float
    #: Extra librdkafka settings, given alike to every confluent-kafka contender.
    kafka_options: tuple[str, ...]
    #: Extra flags of every service contender (e.g. --scoring inline).
    service_flags: tuple[str, ...]
    #: Contender logs, the profile, the latency run's report.
    logs: Path
    #: Throw-away state of the contenders (faust's data directory, Quix's RocksDB state),
    #: removed after the run.
    scratch: Path
    #: Seconds of unmeasured latency-run load before the latency runs (a cold broker is slow).
    broker_warmup_s: float = 0.0


def _kafka_flags(run: Run) -> list[str]:
    return [word for option in run.kafka_options for word in ("-X", option)]


def service_command(
    run: Run,
    topics: tuple[str, str, str],
    group: str,
    metrics_port: int,
    *flags: str,
    history_time_scale: float,
) -> list[str]:
    """`fraud-scorer run` on (input, output, dead-letter) topics in `group`, with a terminal-risk
    topic of its own that nothing fills: every contender scores with neutral terminal risk, and
    none starts by reading a risk table left on the broker (a demo's held 294,359 records).
    `history_time_scale`: how compressed the input's event time is (`harness.time_scale`)."""
    input_topic, output_topic, dlq_topic = topics
    return [
        sys.executable,
        "-m",
        "stream",
        "run",
        "--bootstrap-servers",
        run.bootstrap,
        "--input-topic",
        input_topic,
        "--output-topic",
        output_topic,
        "--dlq-topic",
        dlq_topic,
        "--group-id",
        group,
        "--terminal-risk-topic",
        f"{group}-terminal-risk",
        "--card-frauds-topic",
        f"{group}-card-frauds",
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
        "--history-time-scale",
        str(history_time_scale),
        *run.service_flags,
        *flags,
        *_kafka_flags(run),
    ]


def _loop_command(run: Run, mode: str, backlog: str, output: str, group: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.loops",
        mode,
        "--bootstrap-servers",
        run.bootstrap,
        "--input-topic",
        backlog,
        "--output-topic",
        output,
        "--group-id",
        group,
        *_kafka_flags(run),
    ]


def _quix_command(
    run: Run, topics: tuple[str, str], group: str, state_dir: Path, *, history_time_scale: float
) -> list[str]:
    input_topic, output_topic = topics
    return [
        str(QUIX_PYTHON),
        "-m",
        "bench.quix_app",
        "--bootstrap-servers",
        run.bootstrap,
        "--input-topic",
        input_topic,
        "--output-topic",
        output_topic,
        "--group-id",
        group,
        "--state-dir",
        str(state_dir),
        "--history-time-scale",
        str(history_time_scale),
        *_kafka_flags(run),
    ]


def contender(
    run: Run, broker: Broker, name: str, backlog: str, role: str, wrapper: Sequence[str] = ()
) -> Measurement:
    """Run one contender over the backlog as `role` (a name unique in this run); `wrapper`
    prefixes its command (a profiler, or bench/scaling.py's shell starting several copies)."""
    output = broker.topic(f"{role}-out", run.partitions)
    group = broker.group(role)
    env: dict[str, str] = {}
    if name in PIPELINE_FLAGS:
        topics = (backlog, output, broker.topic(f"{role}-dlq", run.partitions))
        scale = time_scale(BACKLOG_SEED, BACKLOG_EVENT_RATE)
        command = service_command(
            run, topics, group, free_port(), *PIPELINE_FLAGS[name], history_time_scale=scale
        )
    elif name == "faust":
        if importlib.util.find_spec("faust") is None:
            return Measurement(
                name, 0, False, 0.0, None, load_average(), "faust-streaming is not installed"
            )
        command = [sys.executable, "-m", "bench.faust_app", "worker", "-l", "warn"]
        env = {
            "BENCH_BOOTSTRAP_SERVERS": run.bootstrap,
            "BENCH_INPUT_TOPIC": backlog,
            "BENCH_OUTPUT_TOPIC": output,
            "BENCH_GROUP_ID": group,
            "BENCH_DATADIR": str(run.scratch / f"faust-{role}"),
        }
    elif name == "quix":
        if not QUIX_PYTHON.is_file():
            return Measurement(name, 0, False, 0.0, None, load_average(), QUIX_MISSING)
        scale = time_scale(BACKLOG_SEED, BACKLOG_EVENT_RATE)
        state_dir = run.scratch / f"quix-{role}"
        command = _quix_command(run, (backlog, output), group, state_dir, history_time_scale=scale)
    else:
        if name == "floor":
            broker.topic(f"{role}-out{STATE_TOPIC_SUFFIX}", run.partitions)
        command = _loop_command(run, name.replace("_", "-"), backlog, output, group)
    measured = measure(
        name,
        [*wrapper, *command],
        bootstrap=run.bootstrap,
        output_topic=output,
        expected=run.records,
        warmup_s=run.warmup_s,
        window_s=run.window_s,
        timeout_s=run.warmup_s + run.window_s + START_STOP_ALLOWANCE_S,
        log_path=run.logs / f"{role}.log",
        env=env,
    )
    if name not in PIPELINE_FLAGS:
        return measured
    return measured._replace(flagged_share=flagged_share(run.bootstrap, output))


def latency(
    run: Run,
    broker: Broker,
    report_dir: Path,
    *,
    exactly_once: bool = False,
    role: str | None = None,
    variant: str | None = None,
    rate: float = LATENCY_RATE,
    features_worker: bool = False,
) -> dict[str, Any]:
    """Event→decision latency under fraud-loadgen at `rate` tx/s, open loop, on topics of
    `run.partitions`; `role` names its topics and group (one per latency run of a bench);
    `variant`: the pipeline contender whose flags the service runs with (default: by
    `exactly_once`), or "quix" for the Quix Streams contender. A contender slower than `rate`
    falls behind for the whole run: fraud-loadgen waits up to `DRAIN_TIMEOUT_S` for its last
    decisions, and those still missing count as `lost`. `features_worker`: `fraud-features`
    runs beside the service on the same input, publishing the terminal risk the service reads
    (the whole system); the CPU each spent during the load run is reported per 1,000
    decisions."""
    variant = variant or ("pipeline_eos" if exactly_once else "pipeline")
    if variant == "quix" and not QUIX_PYTHON.is_file():
        raise RuntimeError(QUIX_MISSING)
    role = role or f"latency-{variant}"
    topics = (
        broker.topic(f"{role}-in", run.partitions),
        broker.topic(f"{role}-out", run.partitions),
        broker.topic(f"{role}-dlq", run.partitions),
    )
    port = free_port()
    group = broker.group(role)
    scale = time_scale(LOADGEN_SEED, rate)
    if variant == "quix":
        state_dir = run.scratch / f"quix-{role}"
        command = _quix_command(run, topics[:2], group, state_dir, history_time_scale=scale)
        # Quix has no /metrics: fraud-loadgen is told the scale by the rate it is given.
        metrics_url = ""
    else:
        flags = PIPELINE_FLAGS[variant]
        command = service_command(run, topics, group, port, *flags, history_time_scale=scale)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    worker_command = (
        _worker_command(run, topics, broker.topic(f"{role}-labels", 1), group, scale)
        if features_worker
        else None
    )
    load = load_average()
    loadgen_command = [
        sys.executable,
        "-m",
        "loadgen.cli",
        "--bootstrap-servers",
        run.bootstrap,
        "--input-topic",
        topics[0],
        "--output-topic",
        topics[1],
        "--dlq-topic",
        topics[2],
        "--rate",
        str(rate),
        "--duration",
        str(run.latency_duration_s),
        "--drain-timeout",
        str(DRAIN_TIMEOUT_S),
        "--metrics-url",
        metrics_url,
        "--report",
        str(report_dir),
        "--json",
        "--quiet",
    ]
    worker = None
    counted_s: float | None = None
    worker_samples: list[Sample] = []
    if worker_command is not None:
        worker_port = int(worker_command[worker_command.index("--metrics-port") + 1])
        worker = _start(worker_command, run.logs / f"{role}-features.log")
    service = None
    cpu: dict[str, float] = {}
    try:
        if worker is not None:
            try:
                wait_ready(worker, f"http://127.0.0.1:{worker_port}/readyz", WORKER_READY_S)
            except RuntimeError as exc:
                raise RuntimeError(f"fraud-features: {exc}") from exc
        service = _start(command, run.logs / f"{role}-service.log")
        wait_for_assignment(run.bootstrap, group, service, ASSIGNMENT_TIMEOUT_S)
        processes = {"scorer": service, **({"features_worker": worker} if worker else {})}
        cpu = {name: -process_cpu_s(p.pid) for name, p in processes.items()}
        loadgen = subprocess.run(
            loadgen_command,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=run.latency_duration_s + DRAIN_TIMEOUT_S + LOADGEN_GRACE_S,
        )
        cpu["scorer"] += process_cpu_s(service.pid)
        if worker is not None:
            sent = _sent(loadgen.stdout)
            worker_metrics = f"http://127.0.0.1:{worker_port}/metrics"
            counted_s = _wait_counted(worker, worker_metrics, sent)
            cpu["features_worker"] += process_cpu_s(worker.pid)
            worker_samples = samples(scrape(worker_metrics))
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"fraud-loadgen did not finish within {exc.timeout} s") from exc
    else:
        stages = stage_means_ms(metrics_url) if metrics_url else {}
    finally:
        for started in (service, worker):
            if started is not None:
                stop(started)
    worker_totals: dict[str, float] = {}
    for sample in worker_samples:
        if sample.name in WORKER_FIGURES:
            worker_totals[sample.name] = worker_totals.get(sample.name, 0.0) + sample.value
    worker_stages = {
        sample.labels["stage"]: round(sample.value, 3)
        for sample in worker_samples
        if sample.name == "fraud_features_stage_cpu_seconds_total"
    }
    if not loadgen.stdout.strip():
        raise RuntimeError(f"fraud-loadgen printed no summary:\n{loadgen.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(loadgen.stdout.strip().splitlines()[-1])
    keys: tuple[str, ...] = ("sent", "decided", "lost", "duplicates", "achieved_rate")
    keys += ("schedule_lag_max_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms")
    return {
        "variant": variant,
        "rate": rate,
        "partitions": run.partitions,
        "duration_s": run.latency_duration_s,
        "exactly_once": variant == "pipeline_eos",
        "load_average_before": load,
        "report": shown(report_dir / REPORT_FILE),
        **{key: summary.get(key) for key in keys},
        "stage_mean_ms": stages,
        "features_worker": features_worker,
        "worker_counted_after_s": counted_s,
        # What the worker's own metrics say of its work: CPU-s by stage, records published.
        "worker_totals": worker_totals,
        "worker_stage_cpu_s": worker_stages,
        "cpu_s_per_1k": {
            name: round(seconds * 1000 / max(summary.get("decided") or 0, 1), 4)
            for name, seconds in cpu.items()
        },
    }


def _sent(loadgen_stdout: str) -> int:
    """How many transactions fraud-loadgen's summary (its last line) says it sent."""
    lines = loadgen_stdout.strip().splitlines()
    return int(json.loads(lines[-1]).get("sent") or 0) if lines else 0


def _wait_counted(worker: subprocess.Popen[bytes], metrics_url: str, sent: int) -> float:
    """Wait until the features worker has read all `sent` transactions and its table has
    counted every one it routed, so that its CPU is what the load needed, not what it was
    given while the load ran; return how many seconds that took after the load."""
    started = time.monotonic()
    while True:
        if worker.poll() is not None:
            raise RuntimeError(f"fraud-features exited (status {worker.returncode})")
        waited = time.monotonic() - started
        try:
            values = by_key(scrape(metrics_url))
        except OSError:
            values = {}
        read = sum(
            v for k, v in values.items() if k.startswith("fraud_features_transactions_total{")
        )
        routed = values.get('fraud_features_transactions_total{outcome="routed"}', 0.0)
        counted = sum(
            v
            for k, v in values.items()
            if k.startswith("fraud_features_terminal_events_total{") and 'source="transaction"' in k
        )
        if read >= sent and counted >= routed:
            return round(waited, 1)
        if waited > WORKER_COUNT_TIMEOUT_S:
            raise RuntimeError(
                f"fraud-features had read {read:,.0f} of {sent:,} transactions and counted "
                f"{counted:,.0f} of {routed:,.0f} routed, {WORKER_COUNT_TIMEOUT_S:.0f} s after "
                "the load"
            )
        time.sleep(0.5)


def _start(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _worker_command(
    run: Run, topics: tuple[str, str, str], labels: str, group: str, history_time_scale: float
) -> list[str]:
    """`fraud-features run` on the service's input, publishing to the terminal-risk and
    card-frauds topics the service reads (`service_command`), with its defaults otherwise."""
    return [
        sys.executable,
        *("-m", "terminals", "run", "--bootstrap-servers", run.bootstrap),
        *("--app-id", f"{group}-features", "--input-topic", topics[0], "--labels-topic", labels),
        *("--terminal-risk-topic", f"{group}-terminal-risk"),
        *("--card-frauds-topic", f"{group}-card-frauds", "--dlq-topic", topics[2]),
        *("--data-dir", str(run.scratch / f"features-{group}")),
        *("--history-time-scale", str(history_time_scale), "--auto-offset-reset", "earliest"),
        *("--metrics-host", "127.0.0.1", "--metrics-port", str(free_port())),
        *("--log-level", "WARNING"),
    ]


def stage_means_ms(metrics_url: str) -> dict[str, float]:
    """Where a batch's time went over the service's life: the mean of each stage of
    `fraud_stage_seconds` in ms (empty when /metrics cannot be read)."""
    try:
        text = read_page(metrics_url)
    except OSError:
        return {}
    return stage_means_of(text)


def stage_means_of(text: str) -> dict[str, float]:
    """`stage_means_ms` of a /metrics page's text."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sample in samples(text):
        stage = sample.labels.get("stage")
        if sample.name == "fraud_stage_seconds_sum" and stage:
            sums[stage] = sample.value
        elif sample.name == "fraud_stage_seconds_count" and stage:
            counts[stage] = sample.value
    return {stage: 1000 * sums[stage] / n for stage, n in counts.items() if n and stage in sums}
