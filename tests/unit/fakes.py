"""In-memory stand-ins for the scorer and the output sink (never for Kafka in integration tests)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from plumbing.errors import DeliveryError, ScoreError, TransientDeliveryError
from stream.card_history_changelog import ChangelogBatch, ChangelogTailGone
from stream.outcomes import OutcomeGroup
from stream.sink import Headers, Output
from tests.support.records import offset_of


class FakeScorer:
    """Scores rows with a fixed rule; raises or returns NaN for rows a test marks as poison."""

    model_version = "fake-1"

    def __init__(
        self,
        rule: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]] | None = None,
        raises_on: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.bool_]] | None = None,
        broken: bool = False,
    ) -> None:
        self._rule = rule or (lambda f: (f[:, 0] / (1.0 + f[:, 0])).astype(np.float32))
        self._raises_on = raises_on
        self.broken = broken
        self.calls: list[int] = []

    def warm_up(self) -> float:
        return 0.0

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        self.calls.append(len(features))
        if self.broken:
            raise ScoreError("CUDA error: device lost")
        if self._raises_on is not None and self._raises_on(features).any():
            raise ScoreError("Gather: index out of bounds")
        return self._rule(features)


class Change(NamedTuple):
    """One changelog record of a `OwnedCardHistory.update`, on its own (tests look at them one by
    one)."""

    partition: int
    card_id: str
    state: bytes | None
    batch_index: int


def changes(batches: Iterable[ChangelogBatch]) -> list[Change]:
    """The changelog records of `OwnedCardHistory.update`'s per-partition batches, one by one."""
    return [
        Change(batch.partition, card_id.decode(), state, batch.batch_index)
        for batch in batches
        for card_id, state in zip(batch.card_ids, batch.states, strict=True)
    ]


class MemoryChangelog:
    """A changelog topic in memory: partition → records in the order written, each at its
    offset; `compact()` keeps each key's last record (at its offset), as the broker's cleaner
    does, and `delete_before()` drops the records before an offset, as retention does."""

    topic = "cards-changelog"

    def __init__(self, chunk: int = 7) -> None:
        self.partitions: dict[int, list[tuple[str, bytes | None]]] = {}
        self._offsets: dict[int, list[int]] = {}
        self._end: dict[int, int] = {}
        self._start: dict[int, int] = {}
        self._chunk = chunk
        #: The `start` of every read, in order: (partition, offset).
        self.reads: list[tuple[int, int]] = []

    def append(self, partition: int, card_id: str, state: bytes | None) -> None:
        self.partitions.setdefault(partition, []).append((card_id, state))
        self._offsets.setdefault(partition, []).append(self.end(partition))
        self._end[partition] = self.end(partition) + 1

    def partition_ids(self) -> list[int]:
        """The partitions that hold records (or held some)."""
        return sorted(self._end)

    def end(self, partition: int) -> int:
        """The offset the next record of `partition` gets."""
        return self._end.get(partition, 0)

    def compact(self) -> None:
        for partition, records in self.partitions.items():
            last = {card: i for i, (card, _) in enumerate(records)}
            kept = sorted(last.values())
            self.partitions[partition] = [records[i] for i in kept]
            self._offsets[partition] = [self._offsets[partition][i] for i in kept]

    def delete_before(self, partition: int, offset: int) -> None:
        kept = [i for i, at in enumerate(self._offsets.get(partition, [])) if at >= offset]
        self.partitions[partition] = [self.partitions[partition][i] for i in kept]
        self._offsets[partition] = [self._offsets[partition][i] for i in kept]
        self._start[partition] = offset

    def read(
        self, partition: int, progress: Callable[[], None], start: int = 0
    ) -> Iterator[list[tuple[str, bytes | None]]]:
        self.reads.append((partition, start))
        if start > 0 and not self._start.get(partition, 0) <= start <= self.end(partition):
            raise ChangelogTailGone(f"{partition}: not {start}")
        records = [
            record
            for record, at in zip(
                self.partitions.get(partition, []), self._offsets.get(partition, []), strict=True
            )
            if at >= start
        ]
        for first in range(0, len(records), self._chunk):
            progress()
            yield records[first : first + self._chunk]


class MemorySink:
    """Keeps outputs; delivers them on `deliver()` or fails them through `on_failure`."""

    def __init__(self) -> None:
        self.sent: list[Output] = []
        #: The `headers` argument of each `send_batch`, in order.
        self.batch_headers: list[Sequence[Headers | None] | None] = []

    def send(self, output: Output) -> None:
        self.sent.append(output)

    def send_batch(
        self,
        topic: str,
        keys: list[bytes],
        values: Sequence[bytes | None],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
        partition: int | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
    ) -> None:
        outputs = [output_of(i) for i in range(len(values))]
        # What a failed output is rebuilt with must be what was sent.
        assert [o.headers for o in outputs] == list(headers or [None] * len(outputs))
        self.batch_headers.append(headers)
        self.sent.extend(outputs)

    def deliver_all(self) -> None:
        for output in self.sent:
            output.delivered()
        self.sent = []

    def poll(self) -> None:
        """Nothing to serve: deliveries happen when the test says."""

    def flush(self, timeout_s: float) -> int:
        return len(self.sent)


def message(
    offset: int,
    value: bytes = b"{}",
    partition: int = 0,
    topic: str = "tx",
    key: bytes = b"card",
    headers: list[tuple[str, bytes]] | None = None,
) -> Message:
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=[("trace", b"t-1")] if headers is None else [*headers],
        timestamp=(1, 1_000),
    )


class OneBrokerCluster:
    """What `stream/resume.py` asks a consumer after a resume, answered for a cluster of one
    broker (id 1, the leader of partitions 0-63 of every topic); `wakeups` lists the
    partitions whose watermarks were queried."""

    def __init__(self) -> None:
        self.wakeups: list[tuple[str, int]] = []
        #: A partition's end offset, as `offsets_for_times` answers for the latest time.
        self.ends: Callable[[str, int], int] = lambda topic, partition: 0

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]:
        return [
            TopicPartition(p.topic, p.partition, self.ends(p.topic, p.partition))
            for p in partitions
        ]

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        partitions = {p: SimpleNamespace(leader=1) for p in range(64)}
        metadata = SimpleNamespace(partitions=partitions, error=None)
        return SimpleNamespace(topics={topic: metadata})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        self.wakeups.append((partition.topic, partition.partition))
        return 0, 0


class FakeConsumer(OneBrokerCluster):
    """A consumer driven by the test: it hands out the messages queued with `feed`, and runs
    rebalance callbacks (`assign`, `revoke`, `lose`) inside `poll`/`consume`, on the consuming
    thread, as librdkafka does. Paused partitions hand out nothing."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._messages: deque[Message] = deque()
        self._events: deque[tuple[str, list[TopicPartition]]] = deque()
        self._callbacks: dict[str, Callable[..., None]] = {}
        self.paused: set[tuple[str, int]] = set()
        self.assigned: set[tuple[str, int]] = set()
        self.stored: dict[tuple[str, int], int] = {}
        #: Offsets committed by the consumer itself (at-least-once) ...
        self.consumer_commits: dict[tuple[str, int], int] = {}
        #: ... or by a transaction (exactly-once).
        self.committed_offsets: dict[tuple[str, int], int] = {}
        self.seeks: list[tuple[str, int, int]] = []
        self.polls = 0
        self.closed = False
        self.handed_out: list[Message] = []

    # -- what the test does
    def feed(self, messages: list[Message]) -> None:
        with self._lock:
            self._messages.extend(messages)

    def assign(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._events.append(("assign", partitions))

    def revoke(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._events.append(("revoke", partitions))

    def lose(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._events.append(("lost", partitions))

    # -- the consumer's interface
    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self._callbacks = {k.removeprefix("on_"): v for k, v in callbacks.items()}

    def poll(self, timeout: float) -> Message | None:
        taken = self.consume(1, timeout)
        return taken[0] if taken else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.polls += 1
        self._run_events()
        with self._lock:
            taken: list[Message] = []
            skipped: list[Message] = []
            while self._messages and len(taken) < num_messages:
                message = self._messages.popleft()
                key = (message.topic(), message.partition())
                if key not in self.assigned:
                    continue  # not ours (any more): dropped, as a revoked partition's queue
                (skipped if key in self.paused else taken).append(message)
            self._messages.extendleft(reversed(skipped))
            self.handed_out.extend(taken)
        if not taken:
            time.sleep(min(timeout, 0.001))
        return taken

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update((p.topic, p.partition) for p in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update((p.topic, p.partition) for p in partitions)

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self.stored[tp.topic, tp.partition] = tp.offset

    def commit(self, asynchronous: bool = True) -> None:
        self.consumer_commits.update(self.stored)

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.assigned)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.committed_offsets.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def seek(self, partition: TopicPartition) -> None:
        """Go back: drop what is queued of the partition, and hand out its messages from the
        offset again (the test feeds every message; the fake keeps what it handed out)."""
        key = (partition.topic, partition.partition)
        self.seeks.append((*key, partition.offset))

        def ours(m: Message) -> bool:
            return (m.topic(), m.partition()) == key

        with self._lock:
            again = {
                offset_of(m): m
                for m in self.handed_out
                if ours(m) and offset_of(m) >= max(partition.offset, 0)
            }
            again.update({offset_of(m): m for m in self._messages if ours(m)})
            self._messages = deque(m for m in self._messages if not ours(m))
            self._messages.extendleft(reversed([again[o] for o in sorted(again)]))

    def close(self) -> None:
        if self.assigned:
            partitions = [TopicPartition(t, p) for t, p in sorted(self.assigned)]
            self._callbacks["revoke"](self, partitions)
            self.assigned.clear()
        self.closed = True

    def _run_events(self) -> None:
        while True:
            with self._lock:
                if not self._events:
                    return
                kind, partitions = self._events.popleft()
            keys = {(p.topic, p.partition) for p in partitions}
            if kind == "assign":
                self.assigned |= keys
            self._callbacks[kind](self, partitions)
            if kind != "assign":
                self.assigned -= keys
                self.paused -= keys


class AutoSink(MemorySink):
    """Delivers every output it holds when polled (or fails them all, while `failing`)."""

    def __init__(
        self,
        on_failure: Callable[[Output, DeliveryError], None],
        changelog: MemoryChangelog | None = None,
    ) -> None:
        """Card state outputs it delivers are appended to `changelog`, if given."""
        super().__init__()
        self._on_failure = on_failure
        self._changelog = changelog
        self._lock = threading.Lock()
        self.delivered: list[Output] = []
        self.failing: DeliveryError | None = None
        #: Outputs it says yes to fail (a transient error), reported `late_polls` polls later,
        #: as librdkafka reports a timeout once message.timeout.ms has passed; the others are
        #: delivered meanwhile.
        self.fail_when: Callable[[Output], bool] | None = None
        self.late_polls = 20
        self._late: list[tuple[int, Output]] = []
        self._polls = 0
        self.holding = False

    def send(self, output: Output) -> None:
        with self._lock:
            self.sent.append(output)

    def send_batch(
        self,
        topic: str,
        keys: list[bytes],
        values: Sequence[bytes | None],
        group: OutcomeGroup,
        output_of: Callable[[int], Output],
        partition: int | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
    ) -> None:
        with self._lock:
            self.sent.extend(output_of(i) for i in range(len(values)))

    def poll(self) -> None:
        if self.holding:
            return
        with self._lock:
            outputs, self.sent = self.sent, []
            self._polls += 1
            due = [output for at, output in self._late if at <= self._polls]
            self._late = [(at, output) for at, output in self._late if at > self._polls]
        for output in due:
            self._on_failure(output, TransientDeliveryError("timed out", "_MSG_TIMED_OUT"))
        for output in outputs:
            if self.failing is not None:
                self._on_failure(output, self.failing)
            elif self.fail_when is not None and self.fail_when(output):
                with self._lock:
                    self._late.append((self._polls + self.late_polls, output))
            else:
                self.delivered.append(output)
                if output.kind == "changelog" and self._changelog is not None:
                    assert output.partition is not None and output.key is not None
                    self._changelog.append(output.partition, output.key.decode(), output.value)
                output.delivered()

    def flush(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            with self._lock:
                left = len(self.sent) + len(self._late)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.005)


class FakeTransactionalProducer:
    """A transactional producer in memory: produced records become `committed` only when the
    transaction commits (with the consumer's offsets), and vanish when it aborts."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self._consumer = consumer
        self._open: list[tuple[str, bytes | None, bytes | None]] = []
        self._offsets: dict[tuple[str, int], int] = {}
        self.committed: list[tuple[str, bytes | None, bytes | None]] = []
        self._open_headers: list[list[tuple[str, bytes]]] = []
        #: Per committed transaction: its outputs (topic, value, headers) and the group's
        #: committed offsets right after it.
        self.transactions: list[
            tuple[
                list[tuple[str, bytes | None, list[tuple[str, bytes]]]], dict[tuple[str, int], int]
            ]
        ] = []
        self.in_transaction = False
        self.commits = 0
        self.fail_next_commit: KafkaError | None = None
        #: Every commit fails with this while it is set (a transaction coordinator gone).
        self.commit_error: KafkaError | None = None
        #: Every abort fails with this while it is set; as in librdkafka, the abort then stays
        #: under way and no transaction begins until a call of abort_transaction() returns.
        self.abort_error: KafkaError | None = None
        self._aborting = False
        #: Every produce fails with this while it is set.
        self.produce_error: KafkaError | None = None
        #: init_transactions() fails with this while it is set (the coordinator unreachable).
        self.init_error: KafkaError | None = None
        self.initialized = False
        #: Card states committed to its topic are appended here, if set.
        self.changelog: MemoryChangelog | None = None
        self._open_partitions: list[int] = []

    def init_transactions(self, timeout: float) -> None:
        """Nothing to fence in memory."""
        if self.init_error is not None:
            raise KafkaException(self.init_error)
        self.initialized = True

    def begin_transaction(self) -> None:
        if self._aborting:
            raise KafkaException(
                KafkaError(KafkaError._CONFLICT, "Conflicting abort_transaction API call")
            )
        assert not self.in_transaction, "a transaction is already open"
        self.in_transaction = True

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
        **_kw: object,
    ) -> None:
        if self.produce_error is not None:
            raise KafkaException(self.produce_error)
        assert self.in_transaction, "produce outside a transaction"
        self._open.append((topic, key, value))
        self._open_headers.append(list(headers or []))
        self._open_partitions.append(int(_kw.get("partition", -1)))  # type: ignore[call-overload]

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], metadata: object, timeout: float
    ) -> None:
        assert self.in_transaction and metadata == self._consumer.consumer_group_metadata()
        self._offsets.update({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def commit_transaction(self, timeout: float) -> None:
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)
        if self.fail_next_commit is not None:
            error, self.fail_next_commit = self.fail_next_commit, None
            raise KafkaException(error)
        self.committed.extend(self._open)
        changelog = self.changelog
        for (topic, key, value), partition in zip(self._open, self._open_partitions, strict=True):
            if changelog is not None and topic == changelog.topic and key is not None:
                changelog.append(partition, key.decode(), value)
        self._consumer.committed_offsets.update(self._offsets)
        outputs = [
            (topic, value, headers)
            for (topic, _key, value), headers in zip(self._open, self._open_headers, strict=True)
        ]
        self.transactions.append((outputs, dict(self._consumer.committed_offsets)))
        self._open, self._offsets, self._open_headers = [], {}, []
        self._open_partitions = []
        self.in_transaction = False
        self.commits += 1

    def abort_transaction(self, timeout: float) -> None:
        if self.abort_error is not None:
            self._aborting = True
            raise KafkaException(self.abort_error)
        self._aborting = False
        self._open, self._offsets, self._open_headers = [], {}, []
        self._open_partitions = []
        self.in_transaction = False

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0
