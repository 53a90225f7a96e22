"""What the features worker costs: CPU-seconds per 1,000 transactions, in all and by stage
(issue 44), live and catching up.

    python -m bench.worker_cost [--rate 5000] [--duration 30] [--records 100000]
                                [--partitions 12] [--runs 3] [--write-interval-ms MS]
                                [--combine {on,off}] [--terminals N] [--profile]

Each run starts `fraud-features run` on fresh topics and measures two phases one after the
other. Live: once it is ready, transactions are produced at `--rate` for `--duration` seconds,
timed now (the simulator's cards and 9,855 terminals; a day lasts a day). Catch-up: then a
backlog of `--records` transactions in compressed history time (`bench.harness`: a day lasts
about 2 s of event time, so nearly every transaction moves its terminal to a new day, the most
a catch-up publishes) is produced at once, while the worker reads on. A phase ends once the
table has taken every routed transaction (`fraud_features_terminal_events_total` of source
transaction reaches `fraud_features_transactions_total{outcome="routed"}`), the published
records have stopped growing, and the worker has committed every internal record it read (what
they changed is written to its tables: FRAUD_FEATURES_WRITE_INTERVAL_MS). The worker's CPU
comes from /proc over each phase (start-up excluded); its stages from its own
`fraud_features_stage_cpu_seconds_total` (the CPU time of the thread running each stage; the
publication rounds run on faust's event loop beside other tasks, so theirs includes some of
what those do while a send waits). The runs' median and range go to
bench/results/worker-cost.json. `--profile` records the first run under py-spy and prints where
the time goes. `--write-interval-ms` and `--combine` set the worker's
FRAUD_FEATURES_WRITE_INTERVAL_MS and FRAUD_FEATURES_COMBINE (unset: its defaults).
`--terminals N` makes every transaction, live and backlog, name one of N terminals instead of
the simulator's 9,855 (each terminal mapped to one of N by its id's crc32): a world of dense
merchants, each terminal seeing many transactions a second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.harness import (
    BACKLOG_EVENT_RATE,
    BACKLOG_SEED,
    BACKLOG_TEMPLATES,
    REPO,
    Broker,
    backlog_templates,
    connect,
    free_port,
    load_average,
    produce_backlog,
    record_parts,
    stop,
    tool_parser,
    wait_ready,
)
from bench.profiling import py_spy, py_spy_prefix, render, summarize
from loadgen.time_scale import time_scale
from plumbing.metrics_text import samples
from plumbing.metrics_text import scrape as scrape_text
from terminals.topics import events_topic_name

RESULTS = REPO / "bench" / "results" / "worker-cost.json"
SAMPLE_EVERY_S = 0.5
#: How long the counts must stay still, once every routed transaction is counted, for the run
#: to be over (the last publications and changelog writes).
SETTLE_S = 2.0
DONE_TIMEOUT_S = 900.0
READY_TIMEOUT_S = 120.0
TABLE_PARTITIONS = 6
LIVE, CATCH_UP = "live", "catch-up"
MODES = (LIVE, CATCH_UP)
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: The profile's focus: the router's loop and faust's event loops (its own, and its consumer
#: thread's); the profile samples the thread holding the GIL (`py_spy_prefix`).
FOCUS = ("Router.run", "BaseEventLoop.run_forever")


def scrape(port: int) -> dict[str, float]:
    """The worker's samples, by name and labels ("name{a=b,...}", sorted) and summed by name."""
    values: dict[str, float] = {}
    for sample in samples(scrape_text(f"http://127.0.0.1:{port}/metrics")):
        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
        values[f"{sample.name}{{{labels}}}"] = sample.value
        values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each of the process's threads, summed by thread name,
    and in all ("total")."""
    by_name: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        group = "librdkafka" if name.startswith("rdk:") else name
        by_name[group] = by_name.get(group, 0.0) + seconds
    by_name["total"] = sum(by_name.values())
    return by_name


def produce_live(
    bootstrap: str, topic: str, rate: float, duration_s: float, terminals: int | None = None
) -> int:
    """Produce simulated transactions timed now, at `rate` a second for `duration_s`, open
    loop; return how many. `terminals`: as `backlog_templates`."""
    templates = backlog_templates(BACKLOG_TEMPLATES, terminals=terminals)
    keys, middles = record_parts(templates)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    total = int(rate * duration_s)
    started = time.monotonic()
    for n in range(total):
        due = started + n / rate
        wait = due - time.monotonic()
        if wait > 0.001:
            time.sleep(wait)
        i = n % len(templates)
        value = b'{"transaction_id":"live%d"%b%d}' % (n, middles[i], time.time_ns() // 1_000_000)
        while True:
            try:
                producer.produce(topic, value, keys[i])
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the live transactions were not acknowledged within 60 s")
    return total


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment variables the options set for the worker (none left to its defaults)."""
    chosen = {
        "FRAUD_FEATURES_WRITE_INTERVAL_MS": args.write_interval_ms,
        "FRAUD_FEATURES_COMBINE": args.combine,
    }
    return {name: str(value) for name, value in chosen.items() if value is not None}


def one_run(broker: Broker, args: argparse.Namespace, mode: str, note: Any) -> dict[str, Any]:
    """Start a fresh worker on fresh topics, give it the mode's load, and return what it cost
    from the moment it was ready until it had counted everything."""
    run = f"{broker.run_id}-{time.monotonic_ns() % 1_000_000}"
    transactions = broker.topic(f"tx-{run}", args.partitions)
    labels = broker.topic(f"labels-{run}", 1)
    # The worker creates its outputs (compacted) itself; the broker deletes them with the run's.
    risk, frauds, dlq = (f"bench-{run}-{role}" for role in ("risk", "frauds", "dlq"))
    scale = time_scale(BACKLOG_SEED, BACKLOG_EVENT_RATE) if mode == CATCH_UP else 1.0
    port = free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="worker-cost-"))
    command = [
        sys.executable,
        *("-m", "terminals", "run", "--bootstrap-servers", broker.bootstrap),
        *("--app-id", f"bench-{run}", "--input-topic", transactions, "--labels-topic", labels),
        *("--terminal-risk-topic", risk, "--card-frauds-topic", frauds, "--dlq-topic", dlq),
        *("--table-partitions", str(TABLE_PARTITIONS), "--data-dir", str(data_dir)),
        *("--history-time-scale", str(scale), "--auto-offset-reset", "earliest"),
        *("--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--log-level", "WARNING"),
    ]
    profile = data_dir / "profile.txt" if args.profile else None
    if profile is not None:
        spy = py_spy()
        if spy is None:
            raise RuntimeError("--profile needs py-spy: `make bench` installs the bench extra")
        command = [*py_spy_prefix(spy, profile, gil=True), *command]
    log_path = data_dir / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **worker_env(args)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_ready(process, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
        pid = _worker_pid(process)
        load_before = load_average()
        before = cpu_seconds(pid)
        started = time.monotonic()
        if mode == CATCH_UP:
            produce_backlog(broker.bootstrap, transactions, args.records, args.terminals)
        else:
            produce_live(broker.bootstrap, transactions, args.rate, args.duration, args.terminals)
        written = _Written(broker.bootstrap, f"bench-{run}")
        try:
            result = _measure(process, port, pid, before, started, written, note)
        finally:
            written.close()
        result["mode"], result["load_average_before"] = mode, load_before
    finally:
        stop(process)
        if profile is not None and profile.exists():
            note(render(summarize(profile.read_text(), focus=FOCUS)))
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _worker_pid(process: subprocess.Popen[bytes]) -> int:
    """The worker's pid: the child's, or under py-spy its child's."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    found = children.read_text().split() if children.exists() else []
    return int(found[0]) if found else process.pid


class _Written:
    """Whether the worker has committed every record of its internal topic: then what they
    changed is written to its tables, and that write's CPU is in the phase's figures."""

    def __init__(self, bootstrap: str, app_id: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": app_id})
        topic = events_topic_name(app_id)
        self._partitions = [TopicPartition(topic, p) for p in range(TABLE_PARTITIONS)]

    def __call__(self) -> bool:
        committed = self._consumer.committed(self._partitions, timeout=10)
        for tp in committed:
            _low, high = self._consumer.get_watermark_offsets(tp, timeout=10)
            if high > 0 and tp.offset < high:
                return False
        return True

    def close(self) -> None:
        self._consumer.close()


def _measure(
    process: subprocess.Popen[bytes],
    port: int,
    pid: int,
    before: dict[str, float],
    started: float,
    written: _Written,
    note: Any,
) -> dict[str, Any]:
    """Wait until every routed transaction is counted, the publications stop and the tables
    are written, then return the CPU spent since `before`, per 1,000 transactions."""
    deadline = started + DONE_TIMEOUT_S
    last: tuple[float, ...] = ()
    still_since = None
    metrics: dict[str, float] = {}
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited early (status {process.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not count it all in {DONE_TIMEOUT_S:.0f} s")
        time.sleep(SAMPLE_EVERY_S)
        try:
            metrics = scrape(port)
        except OSError:
            continue
        routed = metrics.get("fraud_features_transactions_total{outcome=routed}", 0.0)
        taken = sum(
            value
            for name, value in metrics.items()
            if name.startswith("fraud_features_terminal_events_total{")
            and "source=transaction" in name
        )
        now = (routed, taken, metrics.get("fraud_features_risk_published_total", 0.0))
        if routed > 0 and taken >= routed:
            if now != last:
                still_since, last = time.monotonic(), now
            elif (
                still_since is not None and time.monotonic() - still_since >= SETTLE_S and written()
            ):
                break
        else:
            last, still_since = now, None
    after = cpu_seconds(pid)
    per_1k = 1000.0 / max(last[0], 1.0)
    stages = {
        name.split("stage=", 1)[1].rstrip("}"): round(value * per_1k, 4)
        for name, value in metrics.items()
        if name.startswith("fraud_features_stage_cpu_seconds_total{stage=")
    }
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    result = {
        "routed": int(last[0]),
        "published": int(last[2]),
        "seconds": round((still_since or time.monotonic()) - started, 1),
        "cpu_s_per_1k": round(spent["total"] * per_1k, 4),
        "threads_cpu_s_per_1k": {k: round(v * per_1k, 4) for k, v in sorted(spent.items())},
        "stages_cpu_s_per_1k": dict(sorted(stages.items())),
    }
    note(
        f"  counted {int(last[1]):,} in {result['seconds']} s: {result['cpu_s_per_1k']} CPU-s "
        f"per 1,000 transactions; {int(last[2]):,} terminal records published"
    )
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median and [min, max] of each run figure."""

    def spread(values: list[float]) -> dict[str, Any]:
        return {"median": round(statistics.median(values), 4), "range": [min(values), max(values)]}

    figures: dict[str, Any] = {"cpu_s_per_1k": spread([r["cpu_s_per_1k"] for r in runs])}
    for key in ("threads_cpu_s_per_1k", "stages_cpu_s_per_1k"):
        names = sorted({name for r in runs for name in r[key]})
        figures[key] = {n: spread([r[key].get(n, 0.0) for r in runs]) for n in names}
    return figures


def main() -> int:
    parser = tool_parser("python -m bench.worker_cost", __doc__)
    parser.add_argument(
        "--rate", type=float, default=5_000.0, help="live: transactions a second (%(default)s)"
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="live: seconds of load (%(default)s)"
    )
    parser.add_argument(
        "--records", type=int, default=100_000, help="catch-up: backlog size (%(default)s)"
    )
    parser.add_argument(
        "--partitions", type=int, default=12, help="transactions partitions (%(default)s)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (%(default)s)")
    parser.add_argument(
        "--write-interval-ms",
        type=int,
        default=None,
        help="the worker's FRAUD_FEATURES_WRITE_INTERVAL_MS (default: its own default); 0 writes "
        "each changed entry at every internal record, as the worker did before it had one",
    )
    parser.add_argument(
        "--combine",
        choices=("on", "off"),
        default=None,
        help="the worker's FRAUD_FEATURES_COMBINE (default: unset, its own default): whether it "
        "counts a terminal's transactions together",
    )
    parser.add_argument(
        "--terminals",
        type=int,
        default=None,
        metavar="N",
        help="every transaction (live and backlog) names one of N terminals instead of its own, "
        "by its id's crc32 mod N (default: the simulator's 9,855): each terminal sees many "
        "transactions a second",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated, of %(default)s (default: both)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="record every run under py-spy and summarise"
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help="results file, JSON (%(default)s)"
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    if min(args.records, args.runs, args.partitions) < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--records, --runs, --partitions, --rate and --duration must be positive")
    if args.terminals is not None and args.terminals < 1:
        parser.error("--terminals must be at least 1")
    broker = connect(parser.prog, args.bootstrap_servers)
    if broker is None:
        return 1

    def note(text: str) -> None:
        print(text, flush=True)

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        # Modes in turn, so a slow spell of the machine falls on both alike.
        for n in range(args.runs):
            for mode in modes:
                note(f"{mode}, run {n + 1} of {args.runs}")
                runs[mode].append(one_run(broker, args, mode, note))
                broker.delete_topics()
    finally:
        broker.delete_topics()
    result = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "profile")},
        "runs": runs,
        "summary": {mode: summary(found) for mode, found in runs.items()},
    }
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for mode, found in result["summary"].items():
        note(f"{mode}: {json.dumps(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
