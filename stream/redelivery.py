"""Outputs the broker did not acknowledge, tried again under the failure policy.

The producer's delivery reports hand failed outputs here (from any thread). The scoring thread
calls `retry()` before it takes the next batch, so while the broker is in trouble no new work
piles up behind it: the hand-off fills, fetching pauses, nothing is committed. A record the
broker rejects for itself is dead-lettered instead (a decision: reason `produce`; a dead letter
that is too large: sent again in a smaller form, `deadletter.router.shrink`). A dead letter
refused in its smallest form is a problem of the dead-letter topic (its `max.message.bytes`),
not of the record: it is retried like any infrastructure fault, unchanged.

A card state (changelog record) is sent again as the card is now, not as it was: a later batch's
state of the same card may have reached the changelog meanwhile, and the older one written after
it would be what compaction keeps and a restore reads. The card's current state is at least as
new as anything sent before it. A card whose partition went is not sent at all: its next owner
reads the records since the commit again and writes the state itself.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable

from contracts.offsets import position_of
from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter
from plumbing.errors import DeliveryError, RecordRejectedError, TransientDeliveryError
from stream.metrics import ServiceMetrics
from stream.owned_card_history import CardOwnership
from stream.refusals import replacement
from stream.sink import Output, OutputSink

log = logging.getLogger(__name__)

#: Time beyond the producer's message timeout for a failure report to arrive.
REPORT_GRACE_S = 5.0


class Redelivery:
    """Collects failed outputs and retries them with backoff until delivered or given up on."""

    def __init__(
        self,
        policy: RetryPolicy,
        router: DeadLetterRouter,
        *,
        delivery_timeout_s: float,
        max_message_bytes: int,
        metrics: ServiceMetrics,
        current_card: Callable[[int, str], CardOwnership] | None = None,
    ) -> None:
        """`current_card(partition, card_id)` says what a card's history is now (card history
        on)."""
        self._metrics = metrics
        self._current_card = current_card
        self._policy = policy
        self._router = router
        self._delivery_timeout_s = delivery_timeout_s
        self._max_message_bytes = max_message_bytes
        self._failed: deque[tuple[Output, DeliveryError]] = deque()
        self._retrying = threading.Event()
        self._stalled = threading.Event()
        #: librdkafka's name for the latest failure, the retry metric's cause.
        self._last_code = "unknown"

    @property
    def pending(self) -> bool:
        """Whether some output waits for another try."""
        return bool(self._failed)

    @property
    def busy(self) -> bool:
        """Whether outputs are failing: some wait for a retry, or a retry round is under way.
        Fetching more would only pile work up behind them."""
        return bool(self._failed) or self._retrying.is_set()

    @property
    def stalled(self) -> bool:
        """Whether the last retry round gave up (fetching must stay stopped)."""
        return self._stalled.is_set()

    def failed(self, output: Output, error: DeliveryError) -> None:
        """The sink's failure handler: note the output for the next retry round."""
        (topic, partition), offset = position_of(output.source)
        log.warning(
            "output not delivered topic=%s partition=%s offset=%s output=%s code=%s: %s",
            topic,
            partition,
            offset,
            output.kind,
            error.code,
            error,
        )
        if output.kind == "dead_letter":
            self._metrics.record_dead_letter_produce_failure(error.code)
        self._failed.append((output, error))

    def retry(self, sink: OutputSink) -> bool:
        """Send the failed outputs again until all are acknowledged (True) or the policy's tries
        are spent (False: the outputs stay queued for a later round)."""
        self._retrying.set()
        try:
            return self._retry(sink)
        finally:
            self._retrying.clear()

    def _retry(self, sink: OutputSink) -> bool:
        pending = self._take()

        def attempt() -> None:
            nonlocal pending
            for output in pending:
                sink.send(output)
            # librdkafka reports a failure only once message.timeout.ms has passed: wait longer.
            sink.flush(self._delivery_timeout_s + REPORT_GRACE_S)
            pending = self._take()
            if pending:
                raise TransientDeliveryError(
                    f"{len(pending)} outputs still not acknowledged", code=self._last_code
                )

        try:
            for try_ in self._policy.retrying(self._count_retry):
                with try_:
                    attempt()
        except TransientDeliveryError:
            self._failed.extendleft((o, TransientDeliveryError("retry pending")) for o in pending)
            if not self._stalled.is_set():
                log.error(
                    "outputs still not delivered after %s tries: fetching stops, nothing is "
                    "committed, retries go on every %.1fs",
                    self._policy.attempts,
                    self._policy.max_backoff_s,
                )
            self._stalled.set()
            self._metrics.set_delivery_stalled(True)
            return False
        if self._stalled.is_set():
            log.info("outputs delivered again: resuming")
        self._stalled.clear()
        self._metrics.set_delivery_stalled(False)
        return True

    def _count_retry(self, error: BaseException) -> None:
        self._metrics.record_delivery_retry(getattr(error, "code", "unknown"))

    def _take(self) -> list[Output]:
        """Drain the failed outputs; rejected records become dead letters, retriable ones stay.

        They are sent again in the order of their records, not in the order their failures
        were reported: librdkafka reports timed-out messages in no particular order, and a
        card's decisions must keep the order of its transactions.
        """
        outputs: list[Output] = []
        while self._failed:
            output, error = self._failed.popleft()
            self._last_code = error.code
            if isinstance(error, RecordRejectedError):
                output = self._reroute(output, error)
            if output.kind == "changelog":
                current = self._as_the_card_is_now(output)
                if current is None:
                    output.delivered()  # its partition went; the next owner has the state
                    continue
                output = current
            outputs.append(output)
        outputs.sort(key=lambda output: position_of(output.source))
        return outputs

    def _as_the_card_is_now(self, output: Output) -> Output | None:
        """The card state output as the card is now; None when its partition is not ours."""
        if self._current_card is None or output.partition is None or output.key is None:
            return output
        owned, state = self._current_card(output.partition, output.key.decode())
        return dataclasses.replace(output, value=state) if owned else None

    def _reroute(self, output: Output, error: RecordRejectedError) -> Output:
        found = replacement(output, error, self._router, self._max_message_bytes)
        if found is not None:
            if output.kind == "dead_letter":
                log.warning("dead letter refused (%s): sending it in a smaller form", error.code)
            return found
        if output.kind == "changelog":
            log.error(
                "%s refused (%s): check topic %s; retrying", output.kind, error.code, output.topic
            )
        else:
            log.error(
                "dead letter refused (%s) even without its value, key and original headers: "
                "raise the dead-letter topic's max.message.bytes; retrying it as it is",
                error.code,
            )
        return output
