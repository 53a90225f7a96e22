"""`fraud-loadgen`: produce simulated transactions on a traffic shape, or replay a team's own
recorded rows (`--replay`, loadgen/replay.py); read the decisions back and report what happened
(sent, decided, lost, duplicates, dead letters, latency overall and second by second, fraud
caught), optionally as an offline HTML page with plots.

The load is open-loop: record i is due when the schedule says so (`loadgen/shapes.py`, or the
rows' own pace) whatever the service does, so a slow service shows up as latency, not as a
politely slower sender.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple, cast

import msgspec
import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from loadgen.html_report import write_report
from loadgen.labels import LabelFeed
from loadgen.malformed import malform
from loadgen.options import LoadgenSettings, build_parser, validate, validate_replay
from loadgen.reader import OutcomeReader
from loadgen.replay import ReplayRow, ReplaySchedule
from loadgen.report import SentLog, render_text, summarize
from loadgen.scrape import (
    MetricsScraper,
    batch_size_distribution,
    history_time_scale,
    metrics_over_time,
)
from loadgen.shapes import Schedule
from loadgen.time_scale import REPLAY_SCALE, assumption, check_replay, simulated_pace, world
from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import redact_urls
from plumbing.logs import configure_logging
from simulator.transactions import TransactionSimulator

log = logging.getLogger("loadgen")

#: Records simulated per call; large enough to amortise numpy, small enough to stay fresh.
CHUNK = 1_000
#: The sender wakes at least this often to keep to its schedule.
TICK_S = 0.002
PROGRESS_EVERY_S = 1.0
SETTLE_S = 1.0
#: How long the final flush waits for the broker to acknowledge what was sent.
FLUSH_TIMEOUT_S = 30.0
#: When librdkafka's local queue is full, serve delivery reports this long before retrying.
QUEUE_FULL_BACKOFF_S = 0.01
DRAIN_CHECK_S = 0.1
READER_JOIN_TIMEOUT_S = 10.0
METADATA_TIMEOUT_S = 10.0
#: The summary's label figures when no labels were sent.
NO_LABELS: dict[str, object] = {
    "labels_topic": None,
    "labels_sent": 0,
    "labels_fraud_sent": 0,
    "labels_failed": 0,
    "labels_pending": 0,
}
#: 1: a record went unanswered, or the run could not be done or reported.
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class SendResult(NamedTuple):
    """How the sending went."""

    #: time.monotonic() when the schedule started.
    started_s: float
    send_seconds: float
    #: The most the sender ever was behind its schedule (its own slowness, not the service's).
    worst_lag_s: float
    #: Simulated seconds per event-time second (FRAUD_HISTORY_TIME_SCALE for the services).
    time_scale: float
    #: The label feed's figures (LabelFeed.summary), or NO_LABELS.
    labels: dict[str, object]


class Outgoing(NamedTuple):
    """One record to send, and what the report needs to know of it."""

    key: bytes
    value: bytes
    transaction_id: str
    is_fraud: bool
    scenario: str
    malformed: bool
    #: False for a replayed row without a label: it counts in neither recall nor false positives.
    labelled: bool = True


class SimulatedSource:
    """The simulator's transactions, dated when they are sent, with its labels on their topic."""

    def __init__(
        self,
        args: argparse.Namespace,
        settings: LoadgenSettings,
        simulator: TransactionSimulator,
        time_scale: float,
        producer: Producer,
        sent: SentLog,
    ) -> None:
        """`simulator`: made by `simulator_of(args)`; `time_scale`: its clock's compression, the
        scorer's (`loadgen/time_scale.py`): simulated days pass in seconds."""
        self._simulator = simulator
        self._feed = _label_feed(args, settings, producer, simulator.id_prefix, sent)
        self._rng = np.random.default_rng(args.seed + 1)
        self._bad_ratio = args.bad_ratio
        self._rate = time_scale * simulator.natural_rate_per_s
        self._buffer: list[tuple[dict[str, object], bool, str]] = []
        self.time_scale = time_scale

    def tick(self, now_ms: int) -> None:
        if self._feed is not None:
            self._feed.send_due(now_ms)

    @property
    def labels_sent(self) -> int | None:
        return None if self._feed is None else self._feed.sent

    def next(self, now_ms: int) -> Outgoing:
        if not self._buffer:
            batch = self._simulator.generate(CHUNK, rate_per_s=self._rate)
            self.time_scale = batch.time_scale
            if self._feed is not None:
                self._feed.add(batch.labels)
            self._buffer = list(
                zip(batch.records, batch.is_fraud.tolist(), batch.scenario.tolist(), strict=True)
            )
            self._buffer.reverse()
        record, is_fraud, scenario = self._buffer.pop()
        record["event_time"] = now_ms
        bad = self._bad_ratio > 0 and self._rng.random() < self._bad_ratio
        value = malform(record, self._rng) if bad else msgspec.json.encode(record)
        key = str(record["card_id"]).encode()
        return Outgoing(key, value, str(record["transaction_id"]), is_fraud, scenario, bad)

    def labels(self) -> dict[str, object]:
        return NO_LABELS if self._feed is None else self._feed.summary()


class ReplaySource:
    """A team's recorded rows (`loadgen/replay.py`), in event-time order."""

    time_scale = REPLAY_SCALE
    labels_sent = None

    def __init__(self, rows: list[ReplayRow]) -> None:
        self._rows = iter(rows)

    def tick(self, now_ms: int) -> None:
        pass

    def next(self, now_ms: int) -> Outgoing:
        row = next(self._rows)
        fraud = bool(row.is_fraud)
        scenario = "labelled fraud" if fraud else "legit"
        return Outgoing(
            row.key, row.value, row.transaction_id, fraud, scenario, not row.readable,
            row.is_fraud is not None,
        )  # fmt: skip

    def labels(self) -> dict[str, object]:
        return NO_LABELS


def send(
    args: argparse.Namespace,
    settings: LoadgenSettings,
    schedule: Schedule | ReplaySchedule,
    source: SimulatedSource | ReplaySource,
    producer: Producer,
    sent: SentLog,
    reader: OutcomeReader,
) -> SendResult:
    """Produce the source's records when the schedule says they are due, recording each in
    `sent`."""
    started = time.monotonic()
    sent.started_ms = time.time_ns() // 1_000_000
    worst_lag_s = 0.0
    next_tick = started + PROGRESS_EVERY_S
    sent_at_progress = 0
    i = 0
    while i < schedule.total:
        now = time.monotonic()
        elapsed = now - started
        source.tick(time.time_ns() // 1_000_000)
        due = schedule.due_by(elapsed)
        if i >= due:
            wait_s = min(TICK_S, max(0.0, schedule.due_at(i) - elapsed))
            if wait_s >= 0.001:
                producer.poll(wait_s)
            else:
                # poll() counts whole milliseconds: a shorter wait would be poll(0), a busy
                # loop that took a whole core at 5,000 tx/s from the service it measures.
                producer.poll(0)
                time.sleep(wait_s)
            continue
        worst_lag_s = max(worst_lag_s, elapsed - schedule.due_at(i))
        now_ms = time.time_ns() // 1_000_000
        while i < due:
            record = source.next(now_ms)
            index = len(sent.transaction_ids)
            sent.transaction_ids.append(record.transaction_id)
            sent.sent_ms.append(now_ms)
            sent.is_fraud.append(record.is_fraud)
            sent.scenario.append(record.scenario)
            sent.malformed.append(record.malformed)
            sent.labelled.append(record.labelled)
            _produce(producer, settings.input_topic, record.key, record.value, index, sent)
            i += 1
        producer.poll(0)
        if now >= next_tick:
            next_tick += PROGRESS_EVERY_S
            # What is alive now (mostly the run's own logs) stays alive to the end. Keeping it
            # out of the collector's full passes stops their pauses, which would stall the
            # schedule and show up as latency, from growing with the run (tens of ms at 5,000
            # tx/s after 15 s otherwise).
            gc.freeze()
            if not args.quiet:
                target = schedule.rate_at(elapsed)
                _progress(
                    i, i - sent_at_progress, target, elapsed, reader.count, source.labels_sent
                )
            sent_at_progress = i
    send_seconds = time.monotonic() - started
    source.tick(time.time_ns() // 1_000_000)
    producer.flush(FLUSH_TIMEOUT_S)
    return SendResult(started, send_seconds, worst_lag_s, source.time_scale, source.labels())


def _label_feed(
    args: argparse.Namespace,
    settings: LoadgenSettings,
    producer: Producer,
    id_prefix: str,
    sent: SentLog,
) -> LabelFeed | None:
    """The run's label feed, or None with --no-labels or when the labels topic is missing."""
    if args.no_labels:
        return None
    labels_topic = settings.labels_topic
    topic = producer.list_topics(labels_topic, timeout=METADATA_TIMEOUT_S).topics.get(labels_topic)
    if topic is None or topic.error is not None:
        print(
            f"fraud-loadgen: labels topic {labels_topic!r} does not exist: no labels sent "
            "(fraud-features create-topics creates it; --no-labels silences this)",
            file=sys.stderr,
        )
        return None
    return LabelFeed(producer, labels_topic, id_prefix, sent.sent_ms)


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
            producer.poll(QUEUE_FULL_BACKOFF_S)


def _progress(
    sent: int, last_second: int, target: float, elapsed_s: float, outcomes: int, labels: int | None
) -> None:
    print(
        f"[{elapsed_s:6.1f}s] sent {sent:>9} ({last_second:>6}/s, due {target:6.0f}/s)  "
        f"outcomes {outcomes:>9}  outstanding {sent - outcomes:>7}"
        + ("" if labels is None else f"  labels {labels:>6}"),
        file=sys.stderr,
        flush=True,
    )


def simulator_of(args: argparse.Namespace) -> TransactionSimulator:
    """The run's simulator: its clock starts now, its transaction ids are the run's own."""
    return world(
        args.seed,
        args.cards,
        fraud_scale=args.fraud_scale,
        start_time_ms=time.time_ns() // 1_000_000,
        id_prefix=f"lg{uuid.uuid4().hex[:8]}",
    )


def agree_with_scorer(
    args: argparse.Namespace, schedule: Schedule, simulator: TransactionSimulator, rate_given: bool
) -> tuple[Schedule, float]:
    """The run's schedule and simulated time scale, agreed with the scorer's history time scale
    (`loadgen/time_scale.py`); a warning on stderr when the scorer's cannot be read.

    Raises:
        ConfigurationError: they cannot agree; the message names the setting to use.
        ValueError: the rate of the scorer's scale schedules no record.
    """
    scorer_scale, why = _scorer_scale(args.metrics_url)
    pace = simulated_pace(
        scorer_scale,
        rate=args.rate,
        rate_given=rate_given,
        rate_per_mean=args.rate / schedule.mean_rate,
        natural_rate=simulator.natural_rate_per_s,
        where=args.metrics_url,
    )
    if scorer_scale is None:
        print(assumption(pace.time_scale, pace.rate, why), file=sys.stderr)
    if pace.rate != args.rate:
        args.rate = pace.rate
        schedule = validate(args)
    return schedule, pace.time_scale


def _scorer_scale(metrics_url: str) -> tuple[float | None, str]:
    """The scorer's history time scale, or None and why it is not known."""
    if not metrics_url:
        return None, "no --metrics-url"
    try:
        return history_time_scale(metrics_url), ""
    except OSError as exc:
        return None, redact_urls(f"cannot read {metrics_url}: {exc}")
    except LookupError as exc:
        return None, redact_urls(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    replayed: list[ReplayRow] | None = None
    schedule: Schedule | ReplaySchedule
    simulator: TransactionSimulator | None = None
    time_scale = REPLAY_SCALE
    try:
        for warning in check_environment("fraud-loadgen"):
            print(f"fraud-loadgen: {warning}", file=sys.stderr)
        settings = LoadgenSettings.from_args(args)
        if args.replay is None:
            rate_given = args.rate is not None
            schedule = validate(args)
            simulator = simulator_of(args)
            schedule, time_scale = agree_with_scorer(args, schedule, simulator, rate_given)
        else:
            replayed, schedule = validate_replay(args, settings.input_mapping)
            scorer_scale, why = _scorer_scale(args.metrics_url)
            check_replay(scorer_scale, where=args.metrics_url)
            if scorer_scale is None:
                print(assumption(REPLAY_SCALE, None, why), file=sys.stderr)
        kafka = {**settings.kafka_settings(), "bootstrap.servers": settings.bootstrap_servers}
    except (ValueError, ConfigurationError) as exc:
        print(f"fraud-loadgen: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging("WARNING", "text")
    scraper = MetricsScraper(args.metrics_url) if args.metrics_url else None
    if scraper is not None:
        scraper.scrape_now()
        scraper.start()
    try:
        reader = OutcomeReader(
            kafka, [settings.output_topic, settings.dlq_topic], settings.output_topic
        )
    except Exception as exc:
        print(f"fraud-loadgen: cannot read the outcome topics: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    reader.start()
    sent = SentLog()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    producer = Producer({**kafka, "linger.ms": 1, "enable.idempotence": True})
    source = (
        SimulatedSource(args, settings, simulator, time_scale, producer, sent)
        if simulator is not None
        else ReplaySource(cast(list[ReplayRow], replayed))
    )
    result = send(args, settings, schedule, source, producer, sent, reader)

    deadline = time.monotonic() + args.drain_timeout
    while reader.count < len(sent.transaction_ids) and time.monotonic() < deadline:
        time.sleep(DRAIN_CHECK_S)
    time.sleep(SETTLE_S)  # late duplicates would show now
    reader.stop()
    reader.join(timeout=READER_JOIN_TIMEOUT_S)
    run_seconds = time.monotonic() - result.started_s - SETTLE_S

    summary = summarize(
        sent, reader.received, result.send_seconds, run_seconds, schedule.per_second()
    )
    summary.update(
        shape="replay" if replayed is not None else args.shape,
        rate=round(schedule.mean_rate, 1) if replayed is not None else args.rate,
        duration_s=round(schedule.duration_s, 3) if replayed is not None else args.duration,
        bad_ratio=args.bad_ratio,
        started_at=started_at,
        target_rate=round(schedule.mean_rate, 1),
        schedule_lag_max_ms=round(result.worst_lag_s * 1000.0, 1),
        time_scale=round(result.time_scale, 1),
        **result.labels,
    )
    if scraper is not None:
        scraper.stop()
        scraper.scrape_now()
        snapshots = scraper.snapshots
        summary["metrics_url"] = redact_urls(args.metrics_url)
        summary["batch_sizes"] = batch_size_distribution(
            snapshots[0].batch_buckets if snapshots else None,
            snapshots[-1].batch_buckets if len(snapshots) > 1 else None,
        )
        summary["scraped"] = metrics_over_time(snapshots, result.started_s)
    print(render_text(summary), file=sys.stderr)
    written = True
    if args.report is not None:
        try:
            print(f"report: {write_report(args.report, summary)}", file=sys.stderr)
        except OSError as exc:
            print(f"fraud-loadgen: cannot write the report: {exc}", file=sys.stderr)
            written = False
    if args.json:
        print(json.dumps(summary), flush=True)
    return EXIT_OK if written and summary["lost"] == 0 else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
