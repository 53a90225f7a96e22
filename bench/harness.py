"""Shared set-up of the pipeline benchmark: topics, the pre-produced backlog, and running one
contender as a child process while measuring its throughput from what it produces.

Throughput is read off the output topic: the sum of its partitions' high watermarks, sampled
every WATCH_INTERVAL_S while the contender runs. The rate is the growth over a steady window that
starts `warmup_s` after the first output (start-up, group join and model loading stay outside)
and lasts `window_s`, or ends earlier if the backlog runs out (the window is then reported
shorter). Sampling watermarks costs the broker one small request and the contender nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from simulator.transactions import TransactionSimulator

REPO = Path(__file__).resolve().parents[1]
#: How often the watcher reads the output topic's high watermarks.
WATCH_INTERVAL_S = 0.25
#: How long a contender may take to stop on SIGINT before it is killed.
STOP_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0
#: Distinct simulated transactions the backlog repeats (with fresh ids).
BACKLOG_TEMPLATES = 50_000
BACKLOG_SEED = 11
#: Simulated transactions per second of the backlog's event times.
BACKLOG_EVENT_RATE = 5_000.0
FLUSH_TIMEOUT_S = 120.0
#: How often the assignment of a starting service is looked at.
ASSIGNMENT_POLL_S = 0.2
READ_BATCH = 10_000
READ_TIMEOUT_S = 1.0
#: Decisions read back per service contender for its flagged share.
FLAGGED_SAMPLE = 100_000
#: How long a read of decisions may find none before it ends.
FLAGGED_QUIET_S = 5.0
_FLAGGED = re.compile(rb'"decision":"(?:review|decline)"')
MS_PER_S = 1000.0


def shown(path: Path) -> str:
    """A path as results and output name it: relative to the repository when inside it, so a
    results file says nothing about the machine it was written on."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


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

    def delete_topics(self, keep: Collection[str] = ()) -> None:
        """Delete every topic of this run but `keep`: those it created and those its services
        created (their card-state changelogs, which once piled up on the dev broker: 62 topics,
        gigabytes of logs, after a few runs), Quix Streams' too, which put the run's names
        behind a prefix of their own (`changelog__<group>--<topic>--default`)."""
        prefix = f"bench-{self.run_id}-"
        existing = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
        names = {*self._created, *(name for name in existing if prefix in name)}
        doomed = sorted(names - set(keep))
        if doomed:
            for future in self._admin.delete_topics(doomed).values():
                try:
                    future.result(timeout=ADMIN_TIMEOUT_S)
                except KafkaException as exc:
                    # Listed while the previous deletion of it was still under way: gone.
                    if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
        self._created = [name for name in self._created if name in keep]


def tool_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of a bench tool that needs the local broker (its docstring's first paragraph
    as description), with its --bootstrap-servers."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument(
        "--bootstrap-servers",
        default="127.0.0.1:9092",
        help="a running broker (default %(default)s; `make kafka-up` starts one)",
    )
    return parser


def connect(prog: str, bootstrap: str) -> Broker | None:
    """The broker at `bootstrap`, or None after saying on stderr that none answers."""
    broker = Broker(bootstrap)
    try:
        broker.check()
    except RuntimeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return broker


def backlog_templates(
    count: int, start_time_ms: int | None = None, terminals: int | None = None
) -> list[dict[str, object]]:
    """The simulated transactions (contract records) a backlog repeats, from `start_time_ms`
    (default: now). With `terminals`, each names one of that many terminals instead of its own
    (`T<crc32 of its id mod terminals>`: a terminal's transactions stay together)."""
    start = time.time_ns() // 1_000_000 if start_time_ms is None else start_time_ms
    simulator = TransactionSimulator(BACKLOG_SEED, start_time_ms=start, id_prefix="bench")
    records = simulator.generate(count, rate_per_s=BACKLOG_EVENT_RATE).records
    if terminals is not None:
        for r in records:
            r["terminal_id"] = f"T{zlib.crc32(str(r['terminal_id']).encode()) % terminals:05d}"
    return records


def record_parts(templates: Sequence[dict[str, object]]) -> tuple[list[bytes], list[bytes]]:
    """Each template's key (its card) and its JSON value between the transaction id and the
    event time: the id leads every record and the event time ends it, so a copy of a template
    is `b'{"transaction_id":"<id>"' + middle + b'<event time>}'`."""
    keys = [str(r["card_id"]).encode() for r in templates]
    middles = [
        msgspec.json.encode({**r, "transaction_id": "", "event_time": 0})[
            len(b'{"transaction_id":""') : -len(b"0}")
        ]
        for r in templates
    ]
    return keys, middles


def produce_backlog(
    bootstrap: str, topic: str, records: int, terminals: int | None = None
) -> float:
    """Produce `records` valid simulated transactions keyed by card; return the seconds taken.

    A block of BACKLOG_TEMPLATES simulated transactions is produced over and over with fresh
    transaction ids, each copy one block's span of event time after the one before, so every
    card's history goes on as the simulator's does: a backlog of millions costs seconds instead
    of minutes of simulation. The last copy ends about now (no event time is in the future).
    Services read it with `--history-time-scale` `time_scale(BACKLOG_SEED, BACKLOG_EVENT_RATE)`.
    `terminals`: as `backlog_templates`.
    """
    started = time.monotonic()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "batch.size": 1_000_000}
    )
    count = min(BACKLOG_TEMPLATES, records)
    span_ms = math.ceil(count * MS_PER_S / BACKLOG_EVENT_RATE)
    copies = math.ceil(records / count)
    start = time.time_ns() // 1_000_000 - copies * span_ms
    templates = backlog_templates(count, start, terminals)
    keys, middles = record_parts(templates)
    times = [int(str(r["event_time"])) for r in templates]
    produce = producer.produce
    for n in range(records):
        copy, i = divmod(n, count)
        event_time = times[i] + copy * span_ms
        value = b'{"transaction_id":"b%d"%b%d}' % (n, middles[i], event_time)
        while True:
            try:
                produce(topic, value, keys[i])
                break
            except BufferError:
                producer.poll(READ_TIMEOUT_S)
    if producer.flush(FLUSH_TIMEOUT_S):
        raise RuntimeError(f"the backlog was not acknowledged within {FLUSH_TIMEOUT_S} s")
    return time.monotonic() - started


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) a process has spent so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # past the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    """Until `url` (a /readyz) answers 200; RuntimeError if the process ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"exited early (status {process.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:  # not serving yet, or 503
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {timeout_s:.0f} s")
        time.sleep(0.5)


def load_average() -> float:
    """The 1-minute load average (how busy the shared machine was)."""
    return round(os.getloadavg()[0], 2)


class Measurement(NamedTuple):
    """One contender's run over the backlog."""

    name: str
    #: Outputs found on its output topic when it was stopped.
    outputs: int
    #: Whether it produced the whole backlog (then the window may be shorter than asked).
    exhausted: bool
    #: Seconds of the measured steady window.
    window_s: float
    records_per_s: float | None
    load_average_before: float
    #: Why there is no number, when there is none.
    error: str | None = None
    #: Share of its decisions that are reviews or declines (service contenders; what the cost of
    #: reasons grows with), over the first FLAGGED_SAMPLE of them.
    flagged_share: float | None = None


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic]
    return sorted(metadata.partitions)


def _produced(consumer: Consumer, topic: str, partitions: Sequence[int]) -> int:
    return sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=ADMIN_TIMEOUT_S)[1]
        for p in partitions
    )


def steady_rate(
    samples: Sequence[tuple[float, int]], warmup_s: float, window_s: float
) -> tuple[float, float | None]:
    """(window seconds, records per second) of (time, outputs) samples, over the samples that
    enclose `warmup_s` after the first output to `window_s` later (so the window is at least
    `window_s` long), or that end at the last sample if it comes sooner."""
    first = next((t for t, produced in samples if produced > 0), None)
    if first is None:
        return 0.0, None
    begin = first + warmup_s
    end = begin + window_s
    start = max((i for i, (t, _) in enumerate(samples) if t <= begin), default=None)
    stop = min((i for i, (t, _) in enumerate(samples) if t >= end), default=len(samples) - 1)
    if start is None or stop <= start:
        return 0.0, None
    (t0, p0), (t1, p1) = samples[start], samples[stop]
    return t1 - t0, (p1 - p0) / (t1 - t0)


def measure(
    name: str,
    command: Sequence[str],
    *,
    bootstrap: str,
    output_topic: str,
    expected: int,
    warmup_s: float,
    window_s: float,
    timeout_s: float,
    log_path: Path,
    env: dict[str, str] | None = None,
) -> Measurement:
    """Run `command` until its steady window is over (or the backlog of `expected` records is
    done, or `timeout_s` passes, or it exits), stop it, and measure its rate in that window."""
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
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    first_output: float | None = None
    try:
        while process.poll() is None and time.monotonic() - started < timeout_s:
            try:
                now, produced = time.monotonic(), _produced(watcher, output_topic, partitions)
            except KafkaException:  # a fresh topic's leader not known yet: the next tick
                time.sleep(WATCH_INTERVAL_S)
                continue
            samples.append((now, produced))
            if first_output is None and produced:
                first_output = now
            if produced >= expected or (
                first_output is not None and now >= first_output + warmup_s + window_s
            ):
                break
            time.sleep(WATCH_INTERVAL_S)
        exit_code = process.poll()
    finally:
        stop(process)
        watcher.close()
    outputs = samples[-1][1] if samples else 0
    measured_s, rate = steady_rate(samples, warmup_s, window_s)
    error = None
    if exit_code is not None and outputs < expected:
        # Paths inside the repository relative to it: results are committed as samples.
        tail = log_path.read_text(errors="replace")[-2000:].replace(f"{REPO}/", "")
        error = f"exited with status {exit_code} after {outputs} outputs:\n{tail}"
    elif rate is None:
        error = f"produced {outputs} outputs in {timeout_s} s: too few to measure"
    return Measurement(name, outputs, outputs >= expected, measured_s, rate, load, error)


def flagged_share(bootstrap: str, topic: str, sample: int = FLAGGED_SAMPLE) -> float | None:
    """The share of reviews and declines among the first `sample` decisions on `topic` (None
    when it holds none)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-flagged-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    decisions = flagged = 0
    try:
        consumer.subscribe([topic])
        quiet_since = time.monotonic()
        while decisions < sample and time.monotonic() - quiet_since < FLAGGED_QUIET_S:
            messages = consumer.consume(READ_BATCH, READ_TIMEOUT_S)
            if messages:
                quiet_since = time.monotonic()
            for message in messages:
                value = message.value()
                if message.error() is None and value is not None:
                    decisions += 1
                    flagged += _FLAGGED.search(value) is not None
    finally:
        consumer.close()
    return flagged / decisions if decisions else None


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


def wait_for_assignment(
    bootstrap: str, group: str, process: subprocess.Popen[bytes], timeout_s: float
) -> None:
    """Wait until `group` is stable with partitions assigned (the AdminClient says so), so a
    latency run does not measure the group join. Raises RuntimeError on timeout or exit."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited early (status {process.returncode})")
        future = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group]
        try:
            description = future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException:
            description = None
        if description is not None and any(
            member.assignment.topic_partitions for member in description.members
        ):
            return
        time.sleep(ASSIGNMENT_POLL_S)
    raise RuntimeError(f"group {group} got no partitions within {timeout_s} s")
