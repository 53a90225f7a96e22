"""The worker's front: the transactions and labels topics read with librdkafka, each record's
terminal event sent to its terminal's partition of the internal topic, invalid labels
dead-lettered, and the input offsets committed once all of that is acknowledged.

```
transactions, labels (key card_id) ─► Router (consumer group <app id>-router)
        decode + validate (terminals/events.py) ── invalid label ─► dead-letter topic
        one record per internal partition and batch ─► <app id>-terminal-events ─► faust's table
```

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
- A failed output is sent again after a backoff, until it is acknowledged; the loop keeps
  beating meanwhile, and the worker reports itself not ready. A dead letter the broker refuses
  as too large (a label of a megabyte) is sent in a smaller form (`deadletter.router.shrink`):
  without its value, its size in `dlq.value.dropped`.
- A rebalance needs nothing extra: the loop commits each batch before it asks for the next, so
  nothing routed is left uncommitted when partitions move.
- Transactions that are invalid are skipped and counted (the scorer dead-letters them);
  records without a terminal are skipped and counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from contracts.errors import RecordError, RecordRejectedError
from contracts.kafka_errors import translate_kafka_error
from deadletter.router import DeadLetterRecord, DeadLetterRouter, shrink
from terminals.config import WorkerConfig
from terminals.events import Routed, batch_by_partition, route_label, route_transaction
from terminals.metrics import WorkerMetrics
from terminals.topics import events_topic_name

log = logging.getLogger(__name__)

#: Input records routed together (one internal record per partition and batch), and how long
#: the loop waits for them: faust's cost is per internal record, so batching is what keeps the
#: table agent's work small (about 500 records/s one a record, thousands batched).
ROUTE_BATCH = 1_000
ROUTE_WITHIN_S = 0.2
#: How long the producer waits to fill a batch.
LINGER_MS = 20
#: One wait for acknowledgements: the loop beats between waits.
FLUSH_SLICE_S = 1.0
#: Backoff between rounds of outputs sent again.
RETRY_BACKOFF_S = (0.5, 10.0)
#: The largest record the producer sends (librdkafka's message.max.bytes default): a dead
#: letter refused as too large shrinks under it.
MAX_MESSAGE_BYTES = 1_000_000


class _Output(NamedTuple):
    """One record to produce: an internal record (partition set) or a dead letter."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    letter: DeadLetterRecord | None = None


class RouterProgress(NamedTuple):
    """What the router tells the worker's health (`terminals/health.py`)."""

    beat: Callable[[], None]
    delivering: Callable[[bool], None]


class Router:
    """Routes the input topics to the internal topic until `stop` is set (see the module
    docstring). Run it on a thread of its own with `run`."""

    def __init__(
        self,
        config: WorkerConfig,
        metrics: WorkerMetrics,
        progress: RouterProgress,
        *,
        kafka: Mapping[str, Any] | None = None,
    ) -> None:
        settings = {**config.kafka_settings(), **(kafka or {})}
        settings["bootstrap.servers"] = config.bootstrap_servers
        self._config = config
        self._metrics = metrics
        self._progress = progress
        self._events_topic = events_topic_name(config.app_id)
        self._dead_letters = DeadLetterRouter(config.dlq_topic, config.service)
        self._consumer = Consumer(
            {
                **settings,
                "group.id": router_group(config.app_id),
                "enable.auto.commit": False,
                "auto.offset.reset": config.auto_offset_reset,
                "session.timeout.ms": int(config.session_timeout_s * 1000),
            }
        )
        self._producer = Producer({**settings, "enable.idempotence": True, "linger.ms": LINGER_MS})
        self.error: BaseException | None = None

    def run(self, stop: threading.Event) -> None:
        """Route until `stop` is set; a failure that cannot pass is kept in `error`."""
        consumer = self._consumer
        consumer.subscribe(
            [self._config.input_topic, self._config.labels_topic],
            on_assign=lambda _consumer, partitions: _log_partitions("routing", partitions),
            on_revoke=lambda _consumer, partitions: _log_partitions("revoked", partitions),
        )
        try:
            while not stop.is_set():
                self._progress.beat()
                messages = consumer.consume(ROUTE_BATCH, ROUTE_WITHIN_S)
                if messages:
                    self._route(messages, stop)
        except BaseException as exc:
            self.error = exc
            log.critical("the router stopped: %s", exc)
            raise
        finally:
            self._producer.flush(FLUSH_SLICE_S)
            consumer.close()

    def _route(self, messages: list[Message], stop: threading.Event) -> None:
        """Route one batch: outputs acknowledged, then its offsets committed."""
        routed: list[Routed] = []
        outputs: list[_Output] = []
        ends: dict[tuple[str, int], int] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.error("consume error: %s", error.str())
                    if error.fatal():
                        raise KafkaException(error)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            ends[topic, partition] = offset + 1
            if topic == self._config.input_topic:
                self._route_transaction(message, routed)
            else:
                self._route_label(message, routed, outputs)
        for partition, value in batch_by_partition(routed, self._config.table_partitions).items():
            outputs.append(_Output(self._events_topic, partition, None, value, None))
        self._deliver(outputs, stop)
        if stop.is_set() and outputs:
            return  # not all acknowledged: read again by the next owner
        if ends:
            offsets = [TopicPartition(t, p, o) for (t, p), o in ends.items()]
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                # A rebalance under way: the next owner routes these records again, and the
                # table counts each once.
                log.warning("routed records not committed (%s): they are routed again", exc)

    def _route_transaction(self, message: Message, routed: list[Routed]) -> None:
        try:
            found = route_transaction(message.value(), _partition(message), _offset(message))
        except RecordError:
            self._metrics.transaction("invalid")  # the scorer dead-letters it
            return
        if found is None:
            self._metrics.transaction("no_terminal")
            return
        routed.append(found)
        self._metrics.transaction("routed")

    def _route_label(self, message: Message, routed: list[Routed], outputs: list[_Output]) -> None:
        try:
            found = route_label(message.value(), _partition(message), _offset(message))
        except RecordError as exc:
            letter = self._dead_letters.dead_letter(message, exc)
            outputs.append(_letter_output(letter))
            self._metrics.label("dead_lettered")
            log.warning(
                "label dead-lettered reason=%s topic=%s partition=%s offset=%s: %s",
                exc.reason,
                message.topic(),
                message.partition(),
                message.offset(),
                exc,
            )
            return
        routed.extend(found)
        event = found[0].event
        if len(found) == 1:  # its card's event only
            self._metrics.label("no_terminal")
        else:
            self._metrics.label("fraud" if event.fraud else "legit")
        self._metrics.label_delay(event.reported_at - event.event_time)

    def _deliver(self, outputs: list[_Output], stop: threading.Event) -> None:
        """Send `outputs` until every one is acknowledged (or `stop`); `outputs` is left with
        what was not."""
        attempt = 0
        while outputs and not stop.is_set():
            failed: list[tuple[_Output, KafkaError]] = []
            for output in outputs:
                refused = self._produce(output, failed)
                if refused is not None:
                    failed.append((output, refused))
            while self._producer.flush(FLUSH_SLICE_S) and not stop.is_set():
                self._progress.beat()
            outputs[:] = [self._again(output, error) for output, error in failed]
            if outputs:
                attempt += 1
                self._progress.delivering(False)
                self._metrics.delivery_retry()
                backoff_s = min(RETRY_BACKOFF_S[0] * 2 ** (attempt - 1), RETRY_BACKOFF_S[1])
                log.warning(
                    "%s outputs not acknowledged (%s): sending them again in %.1fs",
                    len(outputs),
                    failed[0][1].str(),
                    backoff_s,
                )
                self._sleep(backoff_s, stop)
        if not outputs:
            self._progress.delivering(True)

    def _produce(
        self, output: _Output, failed: list[tuple[_Output, KafkaError]]
    ) -> KafkaError | None:
        def report(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                failed.append((output, error))

        while True:
            try:
                self._producer.produce(
                    output.topic,
                    output.value,
                    output.key,
                    headers=cast(Any, output.headers),
                    partition=-1 if output.partition is None else output.partition,
                    on_delivery=report,
                )
                return None
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:  # refused at once (too large for the client)
                error: KafkaError = exc.args[0]
                return error

    def _again(self, output: _Output, error: KafkaError) -> _Output:
        """What to send after `output` failed: a smaller dead letter when the broker refused
        it as too large, else the same output."""
        if output.letter is None or not isinstance(
            translate_kafka_error(error, output.topic), RecordRejectedError
        ):
            return output
        smaller = shrink(output.letter, MAX_MESSAGE_BYTES)
        if smaller is None:
            log.error(
                "dead letter refused (%s) even without its value, key and original headers: "
                "raise the dead-letter topic's max.message.bytes; retrying it as it is",
                error.name(),
            )
            return output
        log.warning("dead letter refused (%s): sending it in a smaller form", error.name())
        return _letter_output(smaller)

    def _sleep(self, seconds: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            self._progress.beat()
            stop.wait(min(FLUSH_SLICE_S, deadline - time.monotonic()))


def router_group(app_id: str) -> str:
    """The router's consumer group (faust's own group, `app_id`, reads the internal topic)."""
    return f"{app_id}-router"


def _letter_output(letter: DeadLetterRecord) -> _Output:
    return _Output(letter.topic, None, letter.key, letter.value, list(letter.headers), letter)


def _partition(message: Message) -> int:
    partition = message.partition()
    assert partition is not None
    return partition


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None
    return offset


def _log_partitions(what: str, partitions: list[TopicPartition]) -> None:
    """One line per rebalance: which input partitions this router now routes, or gave up."""
    log.info("%s %s", what, ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "none")
