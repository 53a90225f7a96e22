"""The load generator's labels: the simulator's confirmed outcomes, produced to the labels topic
when they become known, in the run's wall-clock time.

The simulator hands out each label once its `reported_at` has passed in simulated time, with
event times compressed to the sending rate (`SimulatedBatch.labels`). The load generator stamps
each transaction with the wall clock when it sends it (its `event_time`), so a label moves the
same way: its `event_time` becomes its transaction's, looked up by the transaction's position in
the run, and its `reported_at` keeps the simulated delay after it. It is produced (key =
`card_id`, as the labels contract wants) once the wall clock reaches that `reported_at`; a label
whose transaction has not been sent yet waits for it. Labels still due after the run ends are
never sent: they are counted as pending.
"""

from __future__ import annotations

import heapq
from typing import cast

import msgspec
from confluent_kafka import KafkaError, Message, Producer

#: When librdkafka's local queue is full, serve delivery reports this long before retrying.
QUEUE_FULL_BACKOFF_S = 0.01


class LabelFeed:
    """Holds the simulator's labels until they are due, then produces them to `topic`."""

    def __init__(self, producer: Producer, topic: str, id_prefix: str, sent_ms: list[int]) -> None:
        """`sent_ms[i]` is the wall-clock time (the event_time) of the run's i-th transaction,
        whose id is f"{id_prefix}-{i}"; the list grows as the run sends."""
        self.topic = topic
        self._producer = producer
        self._id_start = len(id_prefix) + 1
        self._sent_ms = sent_ms
        #: (transaction index, order, label): waiting for their transaction to be sent.
        self._unsent: list[tuple[int, int, dict[str, object]]] = []
        #: (due epoch ms, order, label): waiting for the clock.
        self._due: list[tuple[int, int, dict[str, object]]] = []
        self._order = 0
        self.sent = 0
        self.sent_fraud = 0
        self.failed = 0

    @property
    def pending(self) -> int:
        """Labels known to the simulator but not sent yet."""
        return len(self._unsent) + len(self._due)

    def add(self, labels: list[dict[str, object]]) -> None:
        """Take the labels a simulated batch released."""
        for label in labels:
            index = int(str(label["transaction_id"])[self._id_start :])
            heapq.heappush(self._unsent, (index, self._order, label))
            self._order += 1

    def send_due(self, now_ms: int) -> None:
        """Produce every label whose transaction was sent and whose report time has come."""
        sent = len(self._sent_ms)
        while self._unsent and self._unsent[0][0] < sent:
            index, order, label = heapq.heappop(self._unsent)
            delay_ms = int(cast(int, label["reported_at"])) - int(cast(int, label["event_time"]))
            event_time = self._sent_ms[index]
            moved = {**label, "event_time": event_time, "reported_at": event_time + delay_ms}
            heapq.heappush(self._due, (event_time + delay_ms, order, moved))
        while self._due and self._due[0][0] <= now_ms:
            _due, _order, label = heapq.heappop(self._due)
            self._produce(label)

    def _produce(self, label: dict[str, object]) -> None:
        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self.failed += 1

        key = str(label["card_id"]).encode()
        value = msgspec.json.encode(label)
        while True:
            try:
                self._producer.produce(self.topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:
                self._producer.poll(QUEUE_FULL_BACKOFF_S)
        self.sent += 1
        self.sent_fraud += bool(label["fraud"])

    def summary(self) -> dict[str, object]:
        """The feed's figures for the run's summary."""
        return {
            "labels_topic": self.topic,
            "labels_sent": self.sent,
            "labels_fraud_sent": self.sent_fraud,
            "labels_failed": self.failed,
            "labels_pending": self.pending,
        }
