"""Shared set-up of the pipeline benchmark: topics, the pre-produced backlog, and running one
contender as a child process while measuring its throughput from what it produced.

Throughput is read off the output topic itself: every output record carries the producer's
CreateTime, so the rate is (outputs - 1) / (last - first timestamp), taken after a warm-up
share of the outputs. Start-up, group join and model loading are outside the window, and the
measuring never competes with the contender for the CPU while it runs (it only polls the
topic's high watermarks).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from simulator.transactions import TransactionSimulator

REPO = Path(__file__).resolve().parents[1]
#: Outputs at the start of a run left out of the rate: the first fetches and batches of a
#: process run colder (page faults, first allocations) than its steady state.
WARMUP_FRACTION = 0.05
#: How often the watcher reads the output topic's high watermarks.
WATCH_INTERVAL_S = 0.25
#: How long a contender may take to stop on SIGINT before it is killed.
STOP_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0
#: Records simulated per call while producing the backlog.
BACKLOG_CHUNK = 10_000
BACKLOG_SEED = 11
#: Simulated transactions per second of the backlog's event times.
BACKLOG_EVENT_RATE = 5_000.0
FLUSH_TIMEOUT_S = 120.0
READ_BATCH = 10_000
READ_TIMEOUT_S = 1.0
MS_PER_S = 1000.0


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Broker:
    """The local broker: creates the benchmark's topics and deletes them all at the end."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._created: list[str] = []
        self.run_id = uuid.uuid4().hex[:8]

    def check(self) -> None:
        """Raise RuntimeError when no broker answers."""
        try:
            self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        except Exception as exc:
            raise RuntimeError(
                f"no Kafka broker at {self.bootstrap} ({exc}); start one with `make kafka-up`"
            ) from exc

    def topic(self, role: str, partitions: int) -> str:
        """Create a fresh topic for `role` and return its name."""
        name = f"bench-{self.run_id}-{role}"
        for future in self._admin.create_topics([NewTopic(name, partitions, 1)]).values():
            try:
                future.result(timeout=ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                raise RuntimeError(f"cannot create topic {name}: {exc}") from exc
        self._created.append(name)
        return name

    def group(self, role: str) -> str:
        """A consumer group name of this run for `role`."""
        return f"bench-{self.run_id}-{role}"

    def delete_topics(self) -> None:
        """Delete every topic this run created."""
        if self._created:
            for future in self._admin.delete_topics(self._created).values():
                future.result(timeout=ADMIN_TIMEOUT_S)
            self._created.clear()


def produce_backlog(bootstrap: str, topic: str, records: int) -> float:
    """Produce `records` valid simulated transactions keyed by card; return the seconds taken."""
    started = time.monotonic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    simulator = TransactionSimulator(
        BACKLOG_SEED, start_time_ms=time.time_ns() // 1_000_000, id_prefix="bench"
    )
    encode = msgspec.json.encode
    left = records
    while left > 0:
        batch = simulator.generate(min(BACKLOG_CHUNK, left), rate_per_s=BACKLOG_EVENT_RATE)
        for record in batch.records:
            key = str(record["card_id"]).encode()
            while True:
                try:
                    producer.produce(topic, key=key, value=encode(record))
                    break
                except BufferError:
                    producer.poll(READ_TIMEOUT_S)
        producer.poll(0)
        left -= len(batch.records)
    if producer.flush(FLUSH_TIMEOUT_S):
        raise RuntimeError(f"the backlog was not acknowledged within {FLUSH_TIMEOUT_S} s")
    return time.monotonic() - started


def load_average() -> float:
    """The 1-minute load average (how busy the shared machine was)."""
    return round(os.getloadavg()[0], 2)


class Measurement(NamedTuple):
    """One contender's run over the backlog."""

    name: str
    #: Outputs found on its output topic.
    outputs: int
    #: Whether it produced the whole backlog before its time limit.
    complete: bool
    #: Seconds of the measured window (after the warm-up share).
    window_s: float
    records_per_s: float | None
    load_average_before: float
    #: Why there is no number, when there is none.
    error: str | None = None


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic]
    return sorted(metadata.partitions)


def _produced(consumer: Consumer, topic: str, partitions: Sequence[int]) -> int:
    return sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=ADMIN_TIMEOUT_S)[1]
        for p in partitions
    )


def output_timestamps(bootstrap: str, topic: str) -> npt.NDArray[np.int64]:
    """The CreateTime (epoch ms) of every record on `topic`, sorted."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })  # fmt: skip
    try:
        partitions = _partitions(consumer, topic)
        pending = {
            p for p in partitions
            if consumer.get_watermark_offsets(TopicPartition(topic, p), ADMIN_TIMEOUT_S)[1] > 0
        }  # fmt: skip
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        stamps: list[int] = []
        while pending:
            for message in consumer.consume(READ_BATCH, READ_TIMEOUT_S):
                error = message.error()
                if error is None:
                    stamps.append(message.timestamp()[1])
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition() or 0)
                else:
                    raise RuntimeError(f"reading {topic}: {error.str()}")
    finally:
        consumer.close()
    return np.sort(np.array(stamps, np.int64))


def rate_of(timestamps_ms: npt.NDArray[np.int64]) -> tuple[float, float | None]:
    """(window seconds, records per second) of sorted output timestamps, after the warm-up."""
    skip = int(len(timestamps_ms) * WARMUP_FRACTION)
    window = timestamps_ms[skip:]
    if len(window) < 2:
        return 0.0, None
    # CreateTime has millisecond resolution: a window can never be shorter than one tick.
    seconds = max(float(window[-1] - window[0]), 1.0) / MS_PER_S
    return seconds, (len(window) - 1) / seconds


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the contender's whole process group (a profiler and its child alike), then
    SIGKILL if it does not end in time."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def measure(
    name: str,
    command: Sequence[str],
    *,
    bootstrap: str,
    output_topic: str,
    expected: int,
    timeout_s: float,
    log_path: Path,
    env: dict[str, str] | None = None,
) -> Measurement:
    """Run `command` until `expected` outputs are on `output_topic` (or `timeout_s` passes, or
    it exits), stop it, and measure its rate from the outputs' timestamps."""
    load = load_average()
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-watch-{name}"})
    partitions = _partitions(watcher, output_topic)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(command),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
    produced = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and process.poll() is None:
            produced = _produced(watcher, output_topic, partitions)
            if produced >= expected:
                break
            time.sleep(WATCH_INTERVAL_S)
        exit_code = process.poll()
    finally:
        stop(process)
        watcher.close()
    timestamps = output_timestamps(bootstrap, output_topic)
    window_s, rate = rate_of(timestamps)
    error = None
    if exit_code is not None and len(timestamps) < expected:
        tail = log_path.read_text(errors="replace")[-2000:]
        error = f"exited with status {exit_code} after {len(timestamps)} outputs:\n{tail}"
    elif rate is None:
        error = f"produced {len(timestamps)} outputs in {timeout_s} s: too few to measure"
    return Measurement(
        name, len(timestamps), len(timestamps) >= expected, window_s, rate, load, error
    )
