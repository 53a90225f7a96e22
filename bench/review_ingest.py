"""What the review console keeps up with, and how many open cases it holds (issue 47).

    python -m bench.review_ingest [--rate 5000] [--flagged 0.05] [--duration 30]
                                  [--backlog 200000] [--open-cases 1000000] [--runs 3]

Live: `fraud-review serve` on fresh topics; each transaction, then its decision (the scorer's
order; `--flagged` of them at review, with three reasons and a rule), produced open loop at
`--rate` a second for `--duration` seconds. The phase ends once every flagged decision is a case
(`fraud_review_cases_opened_total`). Reported: how
long after the last record that took (the console kept up when it is about a poll), the
console's CPU over the phase per 1,000 transactions, and its resident memory.
Backlog: `--backlog` more pairs produced at once while it reads: how many transactions a second
it drains. Store: `--open-cases` open cases written into a fresh store in batches of 500 (as the
ingest writes them): how fast, the file's size, and how long the page's queue (the top 200 by
expected loss) and the open-case count take at that size. Live and backlog run `--runs` times,
each on fresh topics and a fresh console; every run and the median of each figure go to
bench/results/review-ingest.json.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.harness import (
    REPO,
    Broker,
    backlog_templates,
    connect,
    free_port,
    load_average,
    process_cpu_s,
    record_parts,
    stop,
    tool_parser,
    wait_ready,
)
from plumbing.metrics_text import by_key
from plumbing.metrics_text import scrape as scrape_text
from review.cases import CaseStore, NewCase, TransactionDetails

RESULTS = REPO / "bench" / "results" / "review-ingest.json"
TEMPLATES = 20_000
PARTITIONS = 6
#: How long a phase may take to show every case before the run is called failed.
DRAIN_TIMEOUT_S = 600.0
#: As the scorer writes them: each reason's words twice, as `text` and the deprecated `label`.
_REASONS = (
    b',"reasons":[{"feature":"card_testing_velocity","text":"6 small online payments in '
    b'minutes","label":"6 small online payments in minutes","contribution":0.28},'
    b'{"feature":"log_amount","text":"amount 0.71","label":"amount 0.71",'
    b'"contribution":0.0008},{"feature":"card_since_previous","text":"2 minutes since the '
    b'card\'s previous transaction","label":"2 minutes since the card\'s previous '
    b'transaction","contribution":0.0005}],"rules":["night_ecom"]'
)


class Pairs:
    """Transactions and their decisions, produced in the scorer's order."""

    def __init__(self, bootstrap: str, transactions: str, decisions: str, flagged: float):
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
        self._transactions, self._decisions = transactions, decisions
        templates = backlog_templates(TEMPLATES)
        self._keys, self._middles = record_parts(templates)
        self._flagged = flagged
        self._random = random.Random(47)
        self.sent = self.flagged_sent = 0

    def send(self, prefix: str, n: int) -> None:
        i = n % len(self._keys)
        now = time.time_ns() // 1_000_000
        tid = b"%s%d" % (prefix.encode(), n)
        flagged = self._random.random() < self._flagged
        decision = (
            b'{"transaction_id":"%s","card_id":"%s","score":%.4f,"decision":"%s",'
            b'"model_version":"bench","degraded":false,"event_time":%d,"decided_at":%d%s}'
            % (tid, self._keys[i], 0.3 if flagged else 0.001,
               b"review" if flagged else b"approve", now, now, _REASONS if flagged else b"")
        )  # fmt: skip
        for topic, value in (
            (self._transactions, b'{"transaction_id":"%s"%b%d}' % (tid, self._middles[i], now)),
            (self._decisions, decision),
        ):
            while True:
                try:
                    self._producer.produce(topic, value, self._keys[i])
                    break
                except BufferError:
                    self._producer.poll(0.05)
        self._producer.poll(0)
        self.sent += 1
        self.flagged_sent += flagged

    def flush(self) -> None:
        if self._producer.flush(60):
            raise RuntimeError("records not acknowledged within 60 s")


def scrape(port: int, name: str) -> float:
    """The value of an unlabelled sample of the console's /metrics."""
    return by_key(scrape_text(f"http://127.0.0.1:{port}/metrics"))[name]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def wait_for_cases(port: int, expected: int, process: subprocess.Popen[bytes]) -> float:
    """Until `expected` cases were opened and none waits for its fields; return when."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the console exited")
        if scrape(port, "fraud_review_cases_opened_total") >= expected:
            return time.monotonic()
        time.sleep(0.05)
    raise RuntimeError(f"{expected} cases not opened within {DRAIN_TIMEOUT_S:.0f} s")


def console_run(broker: Broker, args: Any, tmp: Path) -> dict[str, Any]:
    transactions = broker.topic("transactions", PARTITIONS)
    decisions = broker.topic("decisions", PARTITIONS)
    labels = broker.topic("labels", 1)
    port = free_port()
    command = [
        sys.executable, "-m", "review", "serve", "--bootstrap-servers", broker.bootstrap,
        "--db", str(tmp / "review.db"), "--port", str(port), "--output-topic", decisions,
        "--input-topic", transactions, "--labels-topic", labels,
        "--group-id", broker.group("review"),
    ]  # fmt: skip
    log = (tmp / "review.log").open("wb")
    process = subprocess.Popen(
        command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_ready(process, f"http://127.0.0.1:{port}/readyz", 60)
        pairs = Pairs(broker.bootstrap, transactions, decisions, args.flagged)
        cpu0, started = process_cpu_s(process.pid), time.monotonic()
        total = int(args.rate * args.duration)
        for n in range(total):
            wait = started + n / args.rate - time.monotonic()
            if wait > 0.001:
                time.sleep(wait)
            pairs.send("live", n)
        pairs.flush()
        produced_s = time.monotonic() - started
        done = wait_for_cases(port, pairs.flagged_sent, process)
        live = {
            "transactions": total,
            "flagged": pairs.flagged_sent,
            "achieved_rate": round(total / produced_s),
            "cases_behind_last_record_s": round(done - (started + produced_s), 3),
            "cpu_s_per_1000_transactions": round(
                (process_cpu_s(process.pid) - cpu0) / total * 1000, 4
            ),
            "rss_mb": round(rss_mb(process.pid), 1),
        }
        cpu0, started = process_cpu_s(process.pid), time.monotonic()
        flagged_before = pairs.flagged_sent
        for n in range(args.backlog):
            pairs.send("backlog", n)
        pairs.flush()
        done = wait_for_cases(port, pairs.flagged_sent, process)
        backlog = {
            "transactions": args.backlog,
            "flagged": pairs.flagged_sent - flagged_before,
            "drained_per_s": round(args.backlog / (done - started)),
            "cpu_s_per_1000_transactions": round(
                (process_cpu_s(process.pid) - cpu0) / args.backlog * 1000, 4
            ),
            "rss_mb": round(rss_mb(process.pid), 1),
        }
        return {"live": live, "backlog": backlog}
    finally:
        stop(process)
        log.close()


def store_run(open_cases: int, tmp: Path) -> dict[str, Any]:
    store = CaseStore(str(tmp / "store.db"))
    details = TransactionDetails(120.5, "EUR", "merch-00001", "merch-00001-t1", "FR", "ecom", 60)
    words = "6 small online payments in minutes"
    reasons = [{"feature": "card_testing_velocity", "text": words, "label": words,
                "contribution": 0.28}] * 3  # fmt: skip
    rng = random.Random(7)
    started = time.monotonic()
    for first in range(0, open_cases, 500):
        now = int(time.time() * 1000)
        store.open_cases(
            NewCase(
                f"t{n}",
                f"card-{n % 20_000}",
                rng.random(),
                "review",
                "bench",
                now,
                now,
                reasons,
                ["night_ecom"],
                details,
                [],
            )
            for n in range(first, min(first + 500, open_cases))
        )
    insert_s = time.monotonic() - started
    timings: dict[str, float] = {}
    for name, call in (
        ("queue_top_200_ms", lambda: store.list_cases("open", 200)),
        ("count_open_ms", store.queue_state),
        ("one_case_ms", lambda: store.case(f"t{open_cases // 2}")),
    ):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            call()
            runs.append((time.perf_counter() - t0) * 1000)
        timings[name] = round(sorted(runs)[2], 2)
    store.close()
    size = sum(p.stat().st_size for p in tmp.glob("store.db*"))
    return {
        "open_cases": open_cases,
        "inserted_per_s": round(open_cases / insert_s),
        "file_mb": round(size / 2**20, 1),
        **timings,
    }


def main() -> int:
    parser = tool_parser("bench.review_ingest", __doc__)
    parser.add_argument("--rate", type=float, default=5000, help="tx/s (default %(default)s)")
    parser.add_argument(
        "--flagged", type=float, default=0.05, help="share at review (default %(default)s)"
    )
    parser.add_argument("--duration", type=float, default=30, help="live seconds (default 30)")
    parser.add_argument(
        "--backlog", type=int, default=200_000, help="backlog transactions (default 200,000)"
    )
    parser.add_argument(
        "--open-cases", type=int, default=1_000_000, help="store size (default 1,000,000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="live and backlog runs (default 3)")
    args = parser.parse_args()
    broker = connect("bench.review_ingest", args.bootstrap_servers)
    if broker is None:
        return 1
    result: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores",
        "load_average_before": load_average(),
        "args": vars(args),
        "runs": [],
    }
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}: {args.rate:.0f} tx/s for {args.duration:.0f} s, "
              f"then a backlog of {args.backlog:,}", flush=True)  # fmt: skip
        broker = Broker(args.bootstrap_servers)
        with tempfile.TemporaryDirectory() as folder:
            try:
                result["runs"].append(console_run(broker, args, Path(folder)))
            finally:
                broker.delete_topics()
    result["median"] = {
        phase: {
            key: statistics.median(run[phase][key] for run in result["runs"])
            for key in result["runs"][0][phase]
        }
        for phase in ("live", "backlog")
    }
    print(f"store: {args.open_cases:,} open cases", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        result["store"] = store_run(args.open_cases, Path(folder))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
