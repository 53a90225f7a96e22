"""`fraud-train from-topics` on a large backlog: its time and peak memory.

Produces `--decisions` decisions with logged features (rows of a simulated, replayed stream:
`simulator.replay.simulate`, repeated with fresh ids and later event times until there are
enough) and the fraud labels of their transactions to two fresh topics, runs
`fraud-train from-topics` on them in a child process, and prints and writes (`--results`) its
wall time and peak RSS.

    make kafka-up && python -m bench.train_from_topics --decisions 1000000
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from confluent_kafka import Producer

from bench.harness import REPO, Broker, connect, tool_parser
from contracts.decision import Decision, encode_features
from simulator.replay import simulate

RESULTS = REPO / "bench" / "results" / "train-from-topics.json"
#: Outcome delay of every fraud label (ms of event time).
LABEL_DELAY_MS = 3_600_000


def _produce(bootstrap: str, decisions: str, labels: str, count: int, seed: int) -> tuple[int, int]:
    """`count` decisions and the fraud labels of their frauds; returns (decisions, frauds)."""
    stream = simulate(seed, days=30, cards=5_000)
    rows = len(stream.is_fraud)
    span = int(stream.columns.event_time[-1] - stream.columns.event_time[0]) + 1
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    frauds = 0
    features = [encode_features(row) for row in stream.features]
    for n in range(count):
        copy, i = divmod(n, rows)
        event_time = int(stream.columns.event_time[i]) + copy * span
        transaction_id = f"t{n}"
        card = f"card-{int(stream.card[i])}"
        value = msgspec.json.encode(
            Decision(
                transaction_id,
                card,
                0.01,
                "approve",
                "served",
                False,
                event_time,
                event_time,
                features=features[i],
            )
        )
        _send(producer, decisions, card, value)
        if stream.is_fraud[i]:
            frauds += 1
            label = {
                "transaction_id": transaction_id,
                "card_id": card,
                "fraud": True,
                "event_time": event_time,
                "reported_at": event_time + LABEL_DELAY_MS,
            }
            _send(producer, labels, card, msgspec.json.encode(label))
    if producer.flush(120):
        raise RuntimeError("the decisions were not acknowledged within 120 s")
    return count, frauds


def _send(producer: Producer, topic: str, key: str, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key.encode())
            return
        except BufferError:
            producer.poll(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("python -m bench.train_from_topics", __doc__)
    parser.add_argument("--decisions", type=int, default=1_000_000, help="decisions to train on")
    parser.add_argument("--seed", type=int, default=7, help="simulator seed")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results JSON")
    args = parser.parse_args(argv)
    broker: Broker | None = connect("python -m bench.train_from_topics", args.bootstrap_servers)
    if broker is None:
        return 1
    try:
        decisions, labels = broker.topic("decisions", 3), broker.topic("labels", 3)
        began = time.monotonic()
        count, frauds = _produce(
            args.bootstrap_servers, decisions, labels, args.decisions, args.seed
        )
        produced_s = time.monotonic() - began
        print(
            f"produced {count:,} decisions ({frauds:,} fraud labels) in {produced_s:.0f} s",
            file=sys.stderr,
        )
        with tempfile.TemporaryDirectory() as scratch:
            began = time.monotonic()
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "training.cli",
                    "from-topics",
                    "--bootstrap-servers",
                    args.bootstrap_servers,
                    "--decisions-topic",
                    decisions,
                    "--labels-topic",
                    labels,
                    "--out",
                    str(Path(scratch) / "package"),
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
            )
            seconds = time.monotonic() - began
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    finally:
        broker.delete_topics()
    if run.returncode != 0:
        print(run.stdout, run.stderr[-3000:], file=sys.stderr)
        return 1
    result = {
        "decisions": count,
        "fraud_labels": frauds,
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(peak_mb),
        "output": run.stdout.strip().splitlines()[1:],  # not the scratch path
    }
    print(json.dumps(result, indent=2))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
