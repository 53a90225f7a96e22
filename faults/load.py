"""The scenarios' open-loop load: transactions produced at a fixed rate whatever the service does,
with a malformed record now and then so that dead letters flow too.

Record i is due at i / rate seconds after the start; a sender that falls behind catches up at
once (its lag is reported), so a slow or absent broker shows as a backlog, never as a politely
slower load. The producer is idempotent and buffers generously, so it rides through a broker
restart without losing, repeating or reordering a record: the input topic is the ground truth
the verifier checks against.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import msgspec
from confluent_kafka import KafkaError, Message, Producer

from simulator.transactions import TransactionSimulator

log = logging.getLogger(__name__)

#: Records simulated per call.
CHUNK = 1_000
#: The sender wakes at least this often to keep to its schedule.
TICK_S = 0.005
#: When librdkafka's local queue is full, serve delivery reports this long before retrying.
QUEUE_FULL_BACKOFF_S = 0.01
FLUSH_TIMEOUT_S = 120.0

PRODUCER_SETTINGS = {
    "enable.idempotence": True,
    "linger.ms": 5,
    # A broker down for half a minute at 5,000 tx/s: every record waits in the local queue.
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.timeout.ms": 600_000,
}


class OpenLoopLoad(threading.Thread):
    """Produces `rate` transactions per second to `topic`, keyed by card, until `stop()`; every
    `bad_every`-th record is malformed (it must end as a dead letter)."""

    def __init__(
        self, bootstrap: str, topic: str, rate: float, *, seed: int, bad_every: int = 500
    ) -> None:
        super().__init__(name="load", daemon=True)
        self._topic = topic
        self._rate = rate
        self._bad_every = bad_every
        self._producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
        self._simulator = TransactionSimulator(seed, id_prefix=f"f{seed}")
        self._prefix = f"f{seed}-{uuid.uuid4().hex[:6]}"
        self._stop_event = threading.Event()
        #: While set, no malformed record is sent (scenario 5 waits for its dead letters).
        self.bad_paused = threading.Event()
        self.sent = 0
        self.bad_sent = 0
        self.failed = 0
        self.worst_lag_s = 0.0
        self.started_ms = 0

    def run(self) -> None:
        encode = msgspec.json.encode
        buffer: list[dict[str, object]] = []
        started = time.monotonic()
        self.started_ms = time.time_ns() // 1_000_000
        while not self._stop_event.is_set():
            elapsed = time.monotonic() - started
            due = int(elapsed * self._rate)
            if self.sent >= due:
                self._producer.poll(TICK_S)
                continue
            self.worst_lag_s = max(self.worst_lag_s, elapsed - self.sent / self._rate)
            now_ms = time.time_ns() // 1_000_000
            while self.sent < due:
                if not buffer:
                    buffer = self._simulator.generate(CHUNK).records[::-1]
                record = buffer.pop()
                record["transaction_id"] = f"{self._prefix}-{self.sent}"
                record["event_time"] = now_ms
                key = str(record["card_id"]).encode()
                if self.sent % self._bad_every == 0 and not self.bad_paused.is_set():
                    value = b'{"transaction_id": "' + str(self.sent).encode() + b'", "broken'
                    self.bad_sent += 1
                else:
                    value = encode(record)
                self._produce(key, value)
                self.sent += 1
            self._producer.poll(0)
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left:
            log.error("load: %s records not acknowledged after %ss", left, FLUSH_TIMEOUT_S)
            self.failed += left

    def _produce(self, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(self._topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:
                self._producer.poll(QUEUE_FULL_BACKOFF_S)

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.failed += 1
            log.error("load: a record was not delivered: %s", error.str())

    def stop(self) -> None:
        """Stop sending; return once everything sent is acknowledged."""
        self._stop_event.set()
        self.join(timeout=FLUSH_TIMEOUT_S + 10)
