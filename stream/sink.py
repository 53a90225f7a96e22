"""Where decisions and dead letters go: the `OutputSink` interface and its Kafka producer.

The routing and batching logic talks to an `OutputSink`, so unit tests can use an in-memory one;
integration tests use `KafkaSink` against the real broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

from confluent_kafka import KafkaError, KafkaException, Producer

from stream.errors import DeliveryError

log = logging.getLogger(__name__)

#: Called once per output with None on success, or the reason it was not delivered.
DeliveryCallback = Callable[[DeliveryError | None], None]
Headers = list[tuple[str, bytes]]

#: When librdkafka's local queue is full, serve delivery reports this long before retrying.
QUEUE_FULL_BACKOFF_S = 0.05


class OutputSink(Protocol):
    """Accepts output records and reports each one's delivery exactly once."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        on_delivery: DeliveryCallback,
        headers: Headers | None = None,
    ) -> None: ...

    def poll(self) -> None:
        """Serve pending delivery reports without blocking."""

    def flush(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every output to be reported; return how many are left."""
        ...


class KafkaSink:
    """An `OutputSink` over one idempotent confluent-kafka producer."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        on_delivery: DeliveryCallback,
        headers: Headers | None = None,
    ) -> None:
        def report(error: KafkaError | None, _message: object) -> None:
            on_delivery(None if error is None else DeliveryError(f"{topic}: {error.str()}"))

        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=cast(Any, headers), on_delivery=report
                )
                return
            except BufferError:
                # The local queue is full: backpressure from the broker. Serving delivery
                # reports frees room; the record is retried, never dropped.
                self._producer.poll(QUEUE_FULL_BACKOFF_S)
            except KafkaException as exc:
                on_delivery(DeliveryError(f"{topic}: {exc}"))
                return

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))
