"""Drain a large backlog with one replica: drain time, peak RSS, and the adaptive batch cap's
trajectory (issue: bounded memory and AIMD batching under a backlog).

    python -m bench.backlog_drain [--records 300000] [--slo-ms 25] [--max-in-flight 10000]

It produces the backlog to a fresh topic, starts `fraud-scorer run` with the adaptive cap on,
samples the replica's RSS (from /proc) and its metrics every quarter second until every record
is decided, and writes the figures to bench/results/backlog.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import (
    BACKLOG_EVENT_RATE,
    BACKLOG_SEED,
    REPO,
    Broker,
    free_port,
    produce_backlog,
    stop,
)
from loadgen.time_scale import time_scale
from plumbing.metrics_text import scrape as scrape_text
from plumbing.metrics_text import totals

SAMPLE_EVERY_S = 0.25
RESULTS = REPO / "bench" / "results" / "backlog.json"


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def scrape(port: int) -> dict[str, float]:
    """The replica's samples by name, each summed over its label values."""
    return totals(scrape_text(f"http://127.0.0.1:{port}/metrics"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers", default="127.0.0.1:9092", help="(default: %(default)s)"
    )
    parser.add_argument(
        "--records", type=int, default=300_000, help="backlog size (default: %(default)s)"
    )
    parser.add_argument("--partitions", type=int, default=3, help="(default: %(default)s)")
    parser.add_argument(
        "--slo-ms",
        type=float,
        default=25.0,
        help="the replica's FRAUD_SLO_MS; 0 = fixed cap (default: %(default)s)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=10_000,
        help="the replica's FRAUD_MAX_IN_FLIGHT_RECORDS (default: %(default)s)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=2048,
        help="upper bound of the adaptive cap (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds (default: %(default)s)"
    )
    args = parser.parse_args()

    broker = Broker(args.bootstrap_servers)
    broker.check()
    try:
        topics = {role: broker.topic(role, args.partitions) for role in ("in", "out", "dlq")}
        produced_s = produce_backlog(args.bootstrap_servers, topics["in"], args.records)
        print(f"backlog: {args.records:,} records produced in {produced_s:.1f} s", file=sys.stderr)
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "stream",
            "run",
            "--bootstrap-servers",
            args.bootstrap_servers,
            "--input-topic",
            topics["in"],
            "--output-topic",
            topics["out"],
            "--dlq-topic",
            topics["dlq"],
            "--group-id",
            broker.group("drain"),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--history-time-scale",
            str(time_scale(BACKLOG_SEED, BACKLOG_EVENT_RATE)),
            "--slo-ms",
            str(args.slo_ms),
            "--max-batch-size",
            str(args.max_batch_size),
            "--max-in-flight-records",
            str(args.max_in_flight),
        ]
        log_path = REPO / "bench" / "results" / "backlog-service.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        samples: list[dict[str, float]] = []
        started = time.monotonic()
        first_consumed: float | None = None
        try:
            while time.monotonic() - started < args.timeout and process.poll() is None:
                try:
                    values = scrape(port)
                except OSError:
                    time.sleep(SAMPLE_EVERY_S)
                    continue
                now = time.monotonic() - started
                done = values.get("fraud_decisions_produced_total", 0.0) + values.get(
                    "fraud_dead_letters_total", 0.0
                )
                if first_consumed is None and values.get("fraud_records_consumed_total", 0):
                    first_consumed = now
                samples.append(
                    {
                        "t_s": round(now, 2),
                        "rss_mb": round(rss_mb(process.pid), 1),
                        "done": done,
                        "cap": values.get("fraud_batch_size_cap_records", 0.0),
                        "in_flight": values.get("fraud_in_flight_records", 0.0),
                        "paused": values.get("fraud_paused_partitions", 0.0),
                        "batches": values.get("fraud_batch_size_records_count", 0.0),
                    }
                )
                if done >= args.records:
                    break
                time.sleep(SAMPLE_EVERY_S)
        finally:
            stop(process)
    finally:
        broker.delete_topics()

    last = samples[-1]
    drain_s = last["t_s"] - (first_consumed or 0.0)
    trajectory: list[tuple[float, float]] = []  # (t_s, cap) at each change of the cap
    for sample in samples:
        if not trajectory or sample["cap"] != trajectory[-1][1]:
            trajectory.append((sample["t_s"], sample["cap"]))
    result = {
        "records": args.records,
        "decided_or_dead_lettered": last["done"],
        "drain_s": round(drain_s, 2),
        "records_per_s": round(last["done"] / drain_s, 1) if drain_s > 0 else None,
        "peak_rss_mb": max(s["rss_mb"] for s in samples),
        "peak_in_flight": max(s["in_flight"] for s in samples),
        "max_in_flight": args.max_in_flight,
        "slo_ms": args.slo_ms,
        "mean_batch_size": round(last["done"] / last["batches"], 1) if last["batches"] else None,
        "cap_trajectory": trajectory,
        "samples": samples,
    }
    RESULTS.write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary))
    return 0 if last["done"] >= args.records else 1


if __name__ == "__main__":
    sys.exit(main())
