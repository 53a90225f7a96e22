"""The router's sending: its internal records and dead letters, produced with librdkafka until
the broker has acknowledged every one of a batch (the router commits the batch's input offsets
only then, terminals/router.py).

Responsibilities and decisions:
- A failed output is sent again after a backoff, until it is acknowledged; the loop keeps
  beating meanwhile, and the worker reports itself not ready. A dead letter the broker refuses
  as too large (a label of a megabyte) is sent in a smaller form (`deadletter.router.shrink`):
  without its value, its size in `dlq.value.dropped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRecord, shrink
from plumbing.errors import RecordRejectedError
from plumbing.kafka_errors import translate_kafka_error
from terminals.metrics import WorkerMetrics

log = logging.getLogger(__name__)

#: How long the producer waits to fill a batch.
LINGER_MS = 20
#: One wait for acknowledgements: the loop beats between waits.
FLUSH_SLICE_S = 1.0
#: Backoff between rounds of outputs sent again: the service's policy, without its bound on
#: attempts (the router sends until acknowledged or stopped; /readyz fails meanwhile).
DELIVERY_RETRY = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=10.0)
#: The largest record the producer sends (librdkafka's message.max.bytes default): a dead
#: letter refused as too large shrinks under it.
MAX_MESSAGE_BYTES = 1_000_000


class RouterOutput(NamedTuple):
    """One record to produce: an internal record (partition set) or a dead letter."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    letter: DeadLetterRecord | None = None


def letter_output(letter: DeadLetterRecord) -> RouterOutput:
    """The output that sends `letter` to its dead-letter topic."""
    return RouterOutput(letter.topic, None, letter.key, letter.value, list(letter.headers), letter)


class OutputSender:
    """Sends the router's outputs until each is acknowledged (see the module docstring); beats
    through `beat` while it waits, and tells through `delivering` whether outputs are failing."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        metrics: WorkerMetrics,
        *,
        beat: Callable[[], None],
        delivering: Callable[[bool], None],
    ) -> None:
        self._metrics = metrics
        self._beat = beat
        self._delivering = delivering
        self._producer = Producer({**settings, "enable.idempotence": True, "linger.ms": LINGER_MS})

    def flush(self) -> None:
        """One last wait for what is in flight (the router stops)."""
        self._producer.flush(FLUSH_SLICE_S)

    def deliver(self, outputs: list[RouterOutput], stop: threading.Event) -> None:
        """Send `outputs` until every one is acknowledged (or `stop`); `outputs` is left with
        what was not."""
        attempt = 0
        while outputs and not stop.is_set():
            failed: list[tuple[RouterOutput, KafkaError]] = []
            for output in outputs:
                refused = self._produce(output, failed)
                if refused is not None:
                    failed.append((output, refused))
            while self._producer.flush(FLUSH_SLICE_S) and not stop.is_set():
                self._beat()
            outputs[:] = [self._again(output, error) for output, error in failed]
            if outputs:
                attempt += 1
                self._delivering(False)
                self._metrics.delivery_retry()
                backoff_s = DELIVERY_RETRY.backoff_s(attempt)
                log.warning(
                    "%s outputs not acknowledged (%s): sending them again in %.1fs",
                    len(outputs),
                    failed[0][1].str(),
                    backoff_s,
                )
                self._sleep(backoff_s, stop)
        if not outputs:
            self._delivering(True)

    def _produce(
        self, output: RouterOutput, failed: list[tuple[RouterOutput, KafkaError]]
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

    def _again(self, output: RouterOutput, error: KafkaError) -> RouterOutput:
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
        return letter_output(smaller)

    def _sleep(self, seconds: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            self._beat()
            stop.wait(min(FLUSH_SLICE_S, deadline - time.monotonic()))
