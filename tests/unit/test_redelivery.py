"""Retries of outputs the broker did not acknowledge, with an in-memory sink."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from contracts.offsets import OffsetTracker
from deadletter.policy import RetryPolicy
from deadletter.router import DeadLetterRouter
from plumbing.errors import DeliveryError, RecordRejectedError, TransientDeliveryError
from stream.metrics import ServiceMetrics
from stream.outcomes import OutcomeGroup
from stream.redelivery import Redelivery
from stream.sink import Headers, Output
from tests.unit.fakes import message

FAST = RetryPolicy(attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
MAX_MESSAGE_BYTES = 100_000
TOO_LARGE = RecordRejectedError("too large", "MSG_SIZE_TOO_LARGE")


class FlakySink:
    """Fails every output through the redelivery until `failures` is used up."""

    def __init__(self, failures: int, error: DeliveryError) -> None:
        self.failures = failures
        self.error = error
        self.redelivery: Redelivery | None = None
        self.delivered: list[Output] = []

    def send(self, output: Output) -> None:
        assert self.redelivery is not None
        if self.failures > 0:
            self.failures -= 1
            self.redelivery.failed(output, self.error)
        else:
            self.delivered.append(output)
            output.delivered()

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
        """Each output goes through `send` (the redelivery retries one at a time)."""
        for i in range(len(values)):
            self.send(output_of(i))

    def poll(self) -> None:
        """Deliveries are reported inside send."""

    def flush(self, timeout_s: float) -> int:
        return 0


def setup(
    failures: int, error: DeliveryError
) -> tuple[FlakySink, Redelivery, OffsetTracker, Output]:
    sink = FlakySink(failures, error)
    redelivery = Redelivery(
        FAST,
        DeadLetterRouter("tx.dlq", "g/i"),
        delivery_timeout_s=1.0,
        max_message_bytes=MAX_MESSAGE_BYTES,
        metrics=ServiceMetrics(CollectorRegistry()),
    )
    sink.redelivery = redelivery
    tracker = OffsetTracker()
    tracker.track(("tx", 0), 7)
    completed: list[Counter[tuple[str, str]]] = []
    group = OutcomeGroup(
        tracker, [(("tx", 0), 7)], Counter({("decision", "approve"): 1}), completed.append
    )
    output = Output(
        kind="decision",
        topic="decisions",
        key=b"card",
        value=b"{}",
        headers=None,
        source=message(7),
        group=group,
        label="approve",
    )
    return sink, redelivery, tracker, output


def test_a_transient_failure_is_retried_until_delivered() -> None:
    sink, redelivery, tracker, output = setup(2, TransientDeliveryError("down", "_TRANSPORT"))
    sink.send(output)  # first try fails
    assert redelivery.pending and tracker.take_commit_positions() == {}
    assert redelivery.retry(sink) is True
    assert not redelivery.pending and not redelivery.stalled
    assert [o.kind for o in sink.delivered] == ["decision"]
    assert tracker.take_commit_positions() == {("tx", 0): 8}


def test_exhausted_retries_stall_and_keep_the_output() -> None:
    sink, redelivery, tracker, output = setup(100, TransientDeliveryError("no topic", "UNKNOWN"))
    sink.send(output)
    assert redelivery.retry(sink) is False
    assert redelivery.stalled and redelivery.pending
    assert tracker.take_commit_positions() == {}, "nothing is committed while it lasts"
    sink.failures = 0  # the broker is back
    assert redelivery.retry(sink) is True
    assert not redelivery.stalled
    assert tracker.take_commit_positions() == {("tx", 0): 8}


def test_a_decision_the_broker_rejects_becomes_a_produce_dead_letter() -> None:
    sink, redelivery, tracker, output = setup(
        1, RecordRejectedError("too large", "MSG_SIZE_TOO_LARGE")
    )
    sink.send(output)
    assert redelivery.retry(sink) is True
    (letter,) = sink.delivered
    assert letter.kind == "dead_letter" and letter.topic == "tx.dlq"
    headers = dict(letter.headers or [])
    assert headers["dlq.reason"] == b"produce" and headers["dlq.error"] == b"RecordRejectedError"
    assert tracker.take_commit_positions() == {("tx", 0): 8}


def dead_letter(decision: Output, *, key: bytes = b"card", value: bytes = b"x" * 5_000) -> Output:
    source = message(7, value=value, key=key)
    letter = DeadLetterRouter("tx.dlq", "g/i").dead_letter(source, RecordRejectedError("x"))
    return Output.dead_letter(letter, source, decision.group)


def test_a_dead_letter_too_large_for_the_broker_goes_without_its_value() -> None:
    sink, redelivery, tracker, decision = setup(1, TOO_LARGE)
    sink.send(dead_letter(decision))
    assert redelivery.retry(sink) is True
    (sent,) = sink.delivered
    assert sent.value is None and sent.key == b"card", "the key fits: it stays"
    headers = dict(sent.headers or [])
    assert headers["dlq.value.dropped"] == b"5000"
    assert "dlq.key.dropped" not in headers
    assert tracker.take_commit_positions() == {("tx", 0): 8}


def test_a_dead_letter_whose_key_alone_is_too_large_goes_without_its_key() -> None:
    sink, redelivery, tracker, decision = setup(1, TOO_LARGE)
    sink.send(dead_letter(decision, key=b"k" * (MAX_MESSAGE_BYTES + 100), value=b"x"))
    assert redelivery.retry(sink) is True
    (sent,) = sink.delivered
    assert sent.key is None and sent.value is None
    headers = dict(sent.headers or [])
    assert headers["dlq.key.dropped"] == str(MAX_MESSAGE_BYTES + 100).encode()
    assert headers["dlq.original.offset"] == b"7", "it still says where the record was"
    assert tracker.take_commit_positions() == {("tx", 0): 8}


def test_refusals_shrink_a_dead_letter_at_most_twice_and_never_grow_its_headers() -> None:
    sink, redelivery, tracker, decision = setup(1_000, TOO_LARGE)
    sink.send(dead_letter(decision))
    assert redelivery.retry(sink) is False, "the dead-letter topic refuses everything"
    assert redelivery.retry(sink) is False
    (stuck, _error) = redelivery._failed[0]
    names = [name for name, _ in stuck.headers or []]
    assert len(names) == len(set(names)), "no header is added twice"
    assert stuck.key is None and stuck.value is None
    assert {"dlq.value.dropped", "dlq.key.dropped"} <= set(names)
    assert redelivery.stalled and tracker.take_commit_positions() == {}


def test_failed_outputs_are_sent_again_in_the_order_of_their_records() -> None:
    # Found by the fault suite (broker killed, at-least-once): librdkafka reported the timed-out
    # decisions of one card in another order than they were produced, and the retry sent
    # them in that order, so the card's decisions came out of order.
    sink, redelivery, tracker, first = setup(0, TransientDeliveryError("down", "_TRANSPORT"))
    outputs = [first]
    for offset in (8, 9, 10):
        tracker.track(("tx", 0), offset)
        group = OutcomeGroup(
            tracker, [(("tx", 0), offset)], Counter({("decision", "approve"): 1}), lambda _: None
        )
        outputs.append(dataclasses.replace(first, source=message(offset), group=group))
    timed_out = TransientDeliveryError("timed out", "_MSG_TIMED_OUT")
    for output in (outputs[0], outputs[3], outputs[1], outputs[2]):
        redelivery.failed(output, timed_out)
    assert redelivery.retry(sink) is True
    assert [o.source.offset() for o in sink.delivered] == [7, 8, 9, 10]
    assert tracker.take_commit_positions() == {("tx", 0): 11}
