"""`fraud-loadgen`: produce simulated transactions at a fixed rate, read the decisions back and
report what happened (sent, decided, lost, duplicates, dead letters, latency, fraud caught).

The load is open-loop: record i is due at start + i / rate whatever the service does, so a slow
service shows up as latency, not as a politely slower sender.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import cast

import msgspec
import numpy as np
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from loadgen.malformed import malform
from loadgen.report import (
    ReceivedLog,
    SentLog,
    batch_size_distribution,
    render_text,
    scrape_batch_sizes,
    summarize,
)
from loadgen.simulator import TransactionSimulator

log = logging.getLogger("loadgen")

#: Records simulated per call; large enough to amortise numpy, small enough to stay fresh.
CHUNK = 1_000
#: The sender wakes at least this often to keep to its schedule.
TICK_S = 0.002
PROGRESS_EVERY_S = 1.0
SETTLE_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="fraud-loadgen",
        description="Open-loop load generator for fraud-scorer: simulated transactions in, "
        "decisions and dead letters read back and matched by transaction.",
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers [env KAFKA_BOOTSTRAP_SERVERS; default: %(default)s]",
    )
    parser.add_argument(
        "--input-topic",
        default=env("FRAUD_INPUT_TOPIC", "transactions"),
        help="topic to produce transactions to [env FRAUD_INPUT_TOPIC; default: %(default)s]",
    )
    parser.add_argument(
        "--output-topic",
        default=env("FRAUD_OUTPUT_TOPIC", "decisions"),
        help="topic to read decisions from [env FRAUD_OUTPUT_TOPIC; default: %(default)s]",
    )
    parser.add_argument(
        "--dlq-topic",
        default=env("FRAUD_DLQ_TOPIC", "transactions.dlq"),
        help="dead-letter topic to read [env FRAUD_DLQ_TOPIC; default: %(default)s]",
    )
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="transactions per second (default: %(default)s)"
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds to send for (default: %(default)s)"
    )
    parser.add_argument(
        "--bad-ratio",
        type=float,
        default=0.0,
        help="share of records sent malformed on purpose, 0..1 (default: %(default)s)",
    )
    parser.add_argument(
        "--fraud-rate",
        type=float,
        default=0.02,
        help="share of simulated fraud among valid records (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=7, help="simulator seed (default: %(default)s)")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for outstanding outcomes after sending (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9102/metrics",
        help="scorer /metrics to read the batch-size distribution from; "
        "empty to skip (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary as one JSON line last on stdout"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser  # fmt: skip


def _validate(args: argparse.Namespace) -> None:
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if not args.duration > 0:
        raise ValueError(f"--duration must be > 0, got {args.duration}")
    if not 0.0 <= args.bad_ratio <= 1.0:
        raise ValueError(f"--bad-ratio must be within 0..1, got {args.bad_ratio}")
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")


class OutcomeReader(threading.Thread):
    """Reads decisions and dead letters produced after the run started."""

    def __init__(self, bootstrap: str, topics: list[str], decision_topic: str) -> None:
        super().__init__(name="outcome-reader", daemon=True)
        self.received = ReceivedLog()
        self._decision_topic = decision_topic
        self._stop_event = threading.Event()
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"fraud-loadgen-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        })  # fmt: skip
        # Start at today's end of every partition: earlier runs' outcomes are not ours.
        assignment = []
        for topic in topics:
            metadata = self._consumer.list_topics(topic, timeout=10).topics[topic]
            if metadata.error is not None:
                raise RuntimeError(f"topic {topic!r}: {metadata.error.str()}")
            for partition in metadata.partitions:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                assignment.append(TopicPartition(topic, partition, high))
        self._consumer.assign(assignment)

    @property
    def count(self) -> int:
        return len(self.received.decisions) + len(self.received.dead_letters)

    def run(self) -> None:
        decode = msgspec.json.decode
        try:
            while not self._stop_event.is_set():
                for message in self._consumer.consume(1000, 0.1):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("reader: %s", error.str())
                        continue
                    if message.topic() == self._decision_topic:
                        d = decode(message.value() or b"null")
                        self.received.decisions.append(
                            (d["transaction_id"], d["decision"], d["event_time"], d["decided_at"])
                        )
                    else:
                        self._dead_letter(message)
        finally:
            self._consumer.close()

    def _dead_letter(self, message: Message) -> None:
        headers = dict(cast(list[tuple[str, bytes]], message.headers() or []))
        try:
            position = (
                int(headers["dlq.original.partition"]),
                int(headers["dlq.original.offset"]),
            )
        except (KeyError, ValueError):
            position = (-1, -1)
        self.received.dead_letters.append(position)

    def stop(self) -> None:
        self._stop_event.set()


def send(args: argparse.Namespace, sent: SentLog, reader: OutcomeReader) -> float:
    """Produce the schedule; return the seconds sending took."""
    producer = Producer({
        "bootstrap.servers": args.bootstrap_servers,
        "linger.ms": 1,
        "enable.idempotence": True,
    })  # fmt: skip
    # The simulated clock starts now, so the hour-of-day mix of scenarios matches event_time.
    simulator = TransactionSimulator(
        args.seed,
        fraud_rate=args.fraud_rate,
        start_time_ms=time.time_ns() // 1_000_000,
        id_prefix=f"lg{uuid.uuid4().hex[:8]}",
    )
    rng = np.random.default_rng(args.seed + 1)
    total = int(args.rate * args.duration)
    buffer: list[tuple[dict[str, object], bool, str]] = []

    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY_S
    i = 0
    while i < total:
        now = time.monotonic()
        due = min(total, int((now - started) * args.rate) + 1)
        if i >= due:
            producer.poll(min(TICK_S, (i + 1) / args.rate - (now - started)))
            continue
        now_ms = time.time_ns() // 1_000_000
        while i < due:
            if not buffer:
                batch = simulator.generate(CHUNK, rate_per_s=args.rate)
                buffer = list(
                    zip(
                        batch.records, batch.is_fraud.tolist(), batch.scenario.tolist(), strict=True
                    )
                )
                buffer.reverse()
            record, is_fraud, scenario = buffer.pop()
            record["event_time"] = now_ms
            bad = args.bad_ratio > 0 and rng.random() < args.bad_ratio
            value = malform(record, rng) if bad else msgspec.json.encode(record)
            index = len(sent.transaction_ids)
            sent.transaction_ids.append(str(record["transaction_id"]))
            sent.is_fraud.append(is_fraud)
            sent.scenario.append(scenario)
            sent.malformed.append(bad)
            _produce(
                producer, args.input_topic, str(record["card_id"]).encode(), value, index, sent
            )
            i += 1
        producer.poll(0)
        if not args.quiet and now >= next_progress:
            next_progress += PROGRESS_EVERY_S
            _progress(i, now - started, reader.count)
    send_seconds = time.monotonic() - started
    producer.flush(30)
    return send_seconds


def _produce(
    producer: Producer, topic: str, key: bytes, value: bytes, index: int, sent: SentLog
) -> None:
    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is None:
            sent.positions[(cast(int, message.partition()), cast(int, message.offset()))] = index
        else:
            sent.failed_sends += 1

    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=delivered)
            return
        except BufferError:
            producer.poll(0.01)


def _progress(sent: int, elapsed_s: float, outcomes: int) -> None:
    print(
        f"[{elapsed_s:6.1f}s] sent {sent:>9} ({sent / elapsed_s:8.0f}/s)  outcomes {outcomes:>9}  "
        f"outstanding {sent - outcomes:>7}",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _validate(args)
    except ValueError as exc:
        print(f"fraud-loadgen: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    batch_before = scrape_batch_sizes(args.metrics_url) if args.metrics_url else None
    try:
        reader = OutcomeReader(
            args.bootstrap_servers, [args.output_topic, args.dlq_topic], args.output_topic
        )
    except Exception as exc:
        print(f"fraud-loadgen: cannot read the outcome topics: {exc}", file=sys.stderr)
        return 1
    reader.start()
    sent = SentLog()
    run_started = time.monotonic()
    send_seconds = send(args, sent, reader)

    deadline = time.monotonic() + args.drain_timeout
    while reader.count < len(sent.transaction_ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(SETTLE_S)  # late duplicates would show now
    reader.stop()
    reader.join(timeout=10)
    run_seconds = time.monotonic() - run_started - SETTLE_S

    summary = summarize(sent, reader.received, send_seconds, run_seconds)
    if args.metrics_url:
        summary["batch_sizes"] = batch_size_distribution(
            batch_before, scrape_batch_sizes(args.metrics_url)
        )
    print(render_text(summary), file=sys.stderr)
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
