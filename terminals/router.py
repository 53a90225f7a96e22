"""The worker's front: the transactions and labels topics read with librdkafka, each record's
terminal event sent to its terminal's partition of the internal topic in event-time order,
invalid labels dead-lettered, and the input offsets committed once all of that is acknowledged.

```
transactions, labels (key card_id) ─► Router (consumer group <app id>-router)
        decode + validate (terminals/input_reader.py, terminals/events.py)
                                           ── invalid label ─► dead-letter topic
        queued per input partition; routed in event-time order (terminals/order.py),
        an input read ahead of the others paused
        one record per internal partition and batch, with the inputs' marks
        sent until acknowledged (terminals/output_sender.py)
                                           ─► <app id>-terminal-events ─► faust's table
```

Why in event-time order, and why here: the table's clock says what is stale and which
terminals are idle, and the inputs are read at their own speeds (the small labels topic to its
end, weeks of report time ahead, while a backlog of transactions is still at its first days). So
the router routes a record only once every input partition has been read up to its time, as
Kafka Streams picks the partition whose head is oldest, and it sends with each internal record
how far it has read each input (`InputMarks`); each table partition's clock moves with the
minimum over every input partition, as Flink's watermarks do, whichever replica's router owns it
and however faust interleaves the internal partitions (terminals/state.py). A partition that has
nothing queued is waited for until it has read nothing for FRAUD_FEATURES_INPUT_WAIT_MS (Kafka
Streams' `max.task.idle.ms`), even when read to its end: a backfill may still be being written
into it.
In a live run that delays the counts by at most the wait, and they feed windows that end days
back. The table side alone could not restore the order: it sees a label long before the
transactions it must count after.

Why librdkafka here and faust (aiokafka) only behind it: the input topics are written by other
systems, and aiokafka decodes every header key as UTF-8 while it parses a fetched batch. One
record whose header key is not UTF-8 (any producer can write one) raised inside its fetcher and
stopped the worker, and again at every restart. librdkafka hands such a record over and only
reading its headers fails, which the dead-letter path handles (`dlq.headers.dropped`). The
internal topic carries only what this module writes.

Responsibilities and decisions:
- At least once: a batch's internal records and dead letters are all acknowledged before its
  input offsets are committed; after a crash the records since the commit are routed again, and
  the table counts each input position once (terminals/state.py).
- A failed output is sent again until it is acknowledged (terminals/output_sender.py).
- A rebalance needs little: the loop commits each batch before it asks for the next, so
  nothing routed is left uncommitted when partitions move; what a revoked partition had queued
  is dropped (it was not committed: the next owner reads it again).
- Records read ahead are held decoded (terminals/input_reader.py), at most `MAX_QUEUED` per
  input partition before it is paused, and their offsets are committed only once they are
  routed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaException, TopicPartition

from terminals.config import FeaturesSettings
from terminals.events import InputMarks, Routed, batch_by_partition
from terminals.input_reader import InputReader, QueuedRead
from terminals.metrics import WorkerMetrics
from terminals.order import EventTimeOrder
from terminals.output_sender import OutputSender, RouterOutput
from terminals.topics import events_topic_name

log = logging.getLogger(__name__)

#: Input records routed together (one internal record per partition and batch), and how long
#: the loop waits for them: faust's cost is per internal record, so batching is what keeps the
#: table agent's work small (about 500 records/s one a record, thousands batched).
ROUTE_BATCH = 1_000
ROUTE_WITHIN_S = 0.2
#: The broker answers a fetch once it has this much for the router, or after FETCH_WAIT_MS:
#: larger, rarer fetches. At librdkafka's default (answer at the first byte) a live stream came
#: a few records a fetch, and librdkafka's threads were a quarter of the worker's CPU
#: (docs/benchmarks.md, "Fewer, larger fetches"). A record is routed at most FETCH_WAIT_MS
#: later for it; a counted label already waited up to a publication round (1 s by default).
FETCH_MIN_BYTES = 256 * 1024
FETCH_WAIT_MS = 500
#: Records of one input partition held, read ahead of the other inputs, before the partition is
#: paused (resumed below half). Pausing drops what librdkafka prefetched for it (up to
#: max.partition.fetch.bytes, 1 MiB: thousands of records), fetched again on resume, so the
#: bound leaves room for two such fetches: the partitions of a backlog, read a fetch at a time,
#: are not paused in turn. Each is held decoded (a few hundred bytes).
MAX_QUEUED = 8 * ROUTE_BATCH
#: And before what its queued records hold reaches this: a dead letter holds its record's key,
#: value and headers, and an invalid label may be as large as the topic allows (a megabyte).
MAX_QUEUED_BYTES = 16 * 1024 * 1024
#: How often the router tells how far behind the inputs it is.
LAG_EVERY_S = 1.0
#: Bounds of how long a table partition goes without a record from this router.
QUIET_MIN_S, QUIET_MAX_S = 1.0, 5.0
#: How long a lookup of the input topics' partition counts may take (the marks name them).
METADATA_TIMEOUT_S = 5.0
#: The input each record comes from, as the marks and the table's positions name it.
TRANSACTIONS, LABELS = "t", "l"


class RouterProgress(NamedTuple):
    """What the router tells the worker's health (`terminals/health.py`)."""

    beat: Callable[[], None]
    delivering: Callable[[bool], None]
    #: The input records not routed yet (None: not known yet).
    lag: Callable[[int | None], None]


class Router:
    """Routes the input topics to the internal topic until `stop` is set (see the module
    docstring). Run it on a thread of its own with `run`."""

    def __init__(
        self,
        config: FeaturesSettings,
        metrics: WorkerMetrics,
        progress: RouterProgress,
        *,
        kafka: Mapping[str, Any] | None = None,
    ) -> None:
        settings = {**config.kafka_settings(), **(kafka or {})}
        settings["bootstrap.servers"] = config.bootstrap_servers
        self._config = config
        #: The bound of the transactions the combiner sends as runs (None: it is off).
        self._event_clock = config.event_clock if config.combine == "on" else None
        self._metrics = metrics
        self._progress = progress
        self._events_topic = events_topic_name(config.app_id)
        self._consumer = Consumer(
            {
                **settings,
                "group.id": router_group(config.app_id),
                "enable.auto.commit": False,
                "auto.offset.reset": config.auto_offset_reset,
                "session.timeout.ms": int(config.session_timeout_s * 1000),
                # A partition read to its end has no lag to tell (and no position, if empty).
                "enable.partition.eof": True,
                "fetch.min.bytes": FETCH_MIN_BYTES,
                "fetch.wait.max.ms": FETCH_WAIT_MS,
            }
        )
        self._sender = OutputSender(
            settings, metrics, beat=progress.beat, delivering=progress.delivering
        )
        self._order: EventTimeOrder[QueuedRead] = EventTimeOrder(
            MAX_QUEUED, MAX_QUEUED_BYTES, config.input_wait_ms / 1000
        )
        self._reader = InputReader(config, metrics, self._order)
        #: Assigned input partition → its name in the order and the marks ("t3", "l0").
        self._keys: dict[tuple[str, int], str] = {}
        #: Partitions of the transactions and labels topics (looked up after an assignment).
        self._input_partitions: tuple[int, int] | None = None
        #: Per table partition, what the marks last sent there said (`_summary`), and when
        #: (monotonic) it was last sent anything.
        self._sent: dict[int, tuple[object, ...]] = {}
        self._sent_at: dict[int, float] = {}
        #: A table partition sent nothing for this long is sent its marks: the table writes
        #: its entries, and commits, only on a record (`FRAUD_FEATURES_WRITE_INTERVAL_MS`),
        #: and knows how far behind it is only once it has applied one.
        self._quiet_s = min(max(config.write_interval_ms / 2000, QUIET_MIN_S), QUIET_MAX_S)
        #: The newest transaction time routed (the marks'), and when the lag was last told.
        self._newest_routed_ms = -1
        self._lag_told = -math.inf
        self._fetched = False
        self.error: BaseException | None = None

    def run(self, stop: threading.Event) -> None:
        """Route until `stop` is set; a failure that cannot pass is kept in `error`."""
        consumer = self._consumer
        consumer.subscribe(
            [self._config.input_topic, self._config.labels_topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )
        try:
            while not stop.is_set():
                self._progress.beat()
                messages = consumer.consume(ROUTE_BATCH, ROUTE_WITHIN_S)
                started = time.thread_time()
                self._reader.read(messages, self._keys)
                read = time.thread_time()
                self._route_in_order(stop)
                self._pause()
                self._tell_lag()
                self._metrics.stage_cpu("read", read - started)
                self._metrics.stage_cpu("route", time.thread_time() - read)
        except BaseException as exc:
            self.error = exc
            log.critical("the router stopped: %s", exc)
            raise
        finally:
            self._sender.flush()
            consumer.close()

    def _tell_lag(self) -> None:
        """Every LAG_EVERY_S: how many input records the partitions it owns hold past what it
        routed (queued, or not read); not known until each has been fetched up to a record or
        its end."""
        now = time.monotonic()
        if now - self._lag_told < LAG_EVERY_S:
            return
        self._lag_told = now
        behind: int | None = self._order.queued()
        # A partition read to its end has nothing more (and no position, if it never had a
        # record).
        reading = self._partitions(self._order.reading())
        for tp in self._consumer.position(reading) if reading else []:
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset < 0 or high < 0 or behind is None:
                behind = None
                continue
            behind += max(high - tp.offset, 0)
        if not self._fetched:
            behind = None  # no assignment yet
        if behind is not None:
            self._metrics.input_lag(behind)
        self._progress.lag(behind)

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        _log_partitions("routing", partitions)
        for tp in partitions:
            source = TRANSACTIONS if tp.topic == self._config.input_topic else LABELS
            self._keys[tp.topic, tp.partition] = f"{source}{tp.partition}"
        self._order.assign(self._keys[tp.topic, tp.partition] for tp in partitions)
        self._input_partitions = None
        self._fetched = True
        self._lag_told = -math.inf

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        _log_partitions("revoked", partitions)
        keys = [self._keys.pop((tp.topic, tp.partition), "") for tp in partitions]
        self._order.revoke(keys)

    def _pause(self) -> None:
        """Pause the input partitions whose queue is full (read ahead of the others)."""
        full = self._order.to_pause()
        if full:
            self._consumer.pause(self._partitions(full))

    def _resume(self) -> None:
        low = self._order.to_resume()
        if low:
            self._consumer.resume(self._partitions(low))

    def _partitions(self, keys: list[str]) -> list[TopicPartition]:
        named = {key: tp for tp, key in self._keys.items()}
        return [TopicPartition(*named[key]) for key in keys if key in named]

    def _route_in_order(self, stop: threading.Event) -> None:
        """Route, batch by batch, the queued records whose turn it is; and the marks alone to
        the table partitions that did not hear of a new day or idle input, or that were sent
        nothing for half the write interval."""
        while not stop.is_set():
            taken, last = self._order.take(ROUTE_BATCH)
            marks = self._marks()
            summary = None if marks is None else _summary(marks, self._config.day_ms)
            quiet_since = time.monotonic() - self._quiet_s
            behind = [
                p
                for p in range(self._config.table_partitions)
                if (summary is not None and self._sent.get(p) != summary)
                or (self._quiet_s > 0 and self._sent_at.get(p, -math.inf) <= quiet_since)
            ]
            if not taken and not behind:
                return
            ends = {key: offset + 1 for key, (offset, _) in last.items()}
            self._route(taken, ends, marks, behind, stop)
            self._resume()
            if len(taken) < ROUTE_BATCH:
                return

    def _marks(self) -> InputMarks | None:
        """How far the router has read its inputs; None until their partition counts are
        known."""
        if self._input_partitions is None:
            counts = []
            for topic in (self._config.input_topic, self._config.labels_topic):
                try:
                    found = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
                except KafkaException as exc:
                    log.debug("no partition count of %s yet: %s", topic, exc)
                    return None
                metadata = found.topics.get(topic)
                if metadata is None or metadata.error is not None or not metadata.partitions:
                    return None
                counts.append(len(metadata.partitions))
            self._input_partitions = (counts[0], counts[1])
        return self._order.marks(self._input_partitions)

    def _route(
        self,
        taken: list[QueuedRead],
        ends: dict[str, int],
        marks: InputMarks | None,
        behind: list[int],
        stop: threading.Event,
    ) -> None:
        """Route one batch: outputs acknowledged, then its offsets committed (`ends`: per input
        partition, the offset after its last record in the batch)."""
        routed: list[Routed] = []
        outputs: list[RouterOutput] = []
        for _offset, found in taken:
            if isinstance(found, Routed):
                routed.append(found)
            elif isinstance(found, list):
                routed.extend(found)
            elif found is not None:
                outputs.append(found)  # a dead letter
        clock = self._event_clock
        combine_to_ms = None if clock is None else clock.bound_ms()
        records = batch_by_partition(
            routed, self._config.table_partitions, marks, behind, combine_to_ms=combine_to_ms
        )
        for partition, value in records.items():
            outputs.append(RouterOutput(self._events_topic, partition, None, value, None))
        self._sender.deliver(outputs, stop)
        if stop.is_set() and outputs:
            return  # not all acknowledged: read again by the next owner
        now = time.monotonic()
        for partition in records:
            self._sent_at[partition] = now
        if marks is not None:
            newest = newest_transaction_time(marks)
            if newest > self._newest_routed_ms:
                self._newest_routed_ms = newest
                self._metrics.routed_event_time(newest)
            summary = _summary(marks, self._config.day_ms)
            for partition in records:
                self._sent[partition] = summary
        if ends:
            named = {key: tp for tp, key in self._keys.items()}
            offsets = [TopicPartition(*named[k], o) for k, o in ends.items() if k in named]
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                # A rebalance under way: the next owner routes these records again, and the
                # table counts each once.
                log.warning("routed records not committed (%s): they are routed again", exc)


def _summary(marks: InputMarks, day_ms: int) -> tuple[object, ...]:
    """What of the marks can move a table partition's clock (it counts in days): the oldest
    day over the inputs that are not idle (None: every one idle) and the newest day over all.
    The marks alone go to a table partition when this changed since it last heard."""
    reached = marks.reached.values()
    active = [time_ms for time_ms, idle in reached if not idle]
    newest = max((time_ms for time_ms, _ in reached), default=-1)
    oldest = min(active) // day_ms if active else None
    return marks.partitions, oldest, newest // day_ms


def newest_transaction_time(marks: InputMarks) -> int:
    """The newest time (epoch ms) the marks say a transactions partition was read up to; -1
    when none says one."""
    times = [time_ms for key, (time_ms, _) in marks.reached.items() if key[0] == TRANSACTIONS]
    return max(times, default=-1)


def router_group(app_id: str) -> str:
    """The router's consumer group (faust's own group, `app_id`, reads the internal topic)."""
    return f"{app_id}-router"


def _log_partitions(what: str, partitions: list[TopicPartition]) -> None:
    """One line per rebalance: which input partitions this router now routes, or gave up."""
    log.info("%s %s", what, ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "none")
