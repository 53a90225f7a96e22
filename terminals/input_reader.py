"""The router's reading: each record its consumer read from the transactions and labels topics,
decoded and validated (terminals/events.py) and queued with the time of its turn in the
event-time order (terminals/order.py), a run of one partition's records at a time.

Responsibilities and decisions:
- A transaction takes its turn at its event time, a label at its report time; a time past the
  event clock's bound (contracts/event_time.py), or none, takes the one before it (`NO_TIME`).
- Transactions that are invalid are skipped and counted (the scorer dead-letters them);
  records without a terminal are skipped and counted.
- An invalid label is dead-lettered in its turn: its dead letter is queued like a record, so
  its offset is committed only after the records before it, and it counts towards its
  partition's bound by the bytes it holds.
- A partition read to its end is told to the order after the records read before the end.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Message

from deadletter.router import DeadLetterRouter
from plumbing.errors import RecordError
from terminals.config import FeaturesSettings
from terminals.events import Routed, read_transaction, route_label
from terminals.metrics import WorkerMetrics
from terminals.order import NO_TIME, EventTimeOrder
from terminals.output_sender import RouterOutput, letter_output

log = logging.getLogger(__name__)

#: An input record read and decoded, waiting for its turn (terminals/order.py): its offset, and
#: its terminal event (a transaction), its terminal's and card's events (a label), its dead
#: letter (an invalid label), or nothing to route. A plain tuple: one is made per record.
QueuedRead = tuple[int, "Routed | list[Routed] | RouterOutput | None"]


class InputReader:
    """Decodes what the router's consumer read and queues it in `order` (see the module
    docstring)."""

    def __init__(
        self, config: FeaturesSettings, metrics: WorkerMetrics, order: EventTimeOrder[QueuedRead]
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._order = order
        self._dead_letters = DeadLetterRouter(config.dlq_topic, config.service)
        #: An event or report time past this clock's bound moves no mark.
        self._event_clock = config.event_clock

    def read(self, messages: list[Message], keys: Mapping[tuple[str, int], str]) -> None:
        """Decode what was read and queue it for its turn, a run of one partition's records at
        a time (dead letters too: a label's offset is committed only after the records before
        it). `keys`: each assigned input partition's name in the order ("t3", "l0")."""
        bound_ms = self._event_clock.bound_ms()
        order, transactions = self._order, self._config.input_topic
        outcomes: dict[str, int] = {}
        key: str | None = None
        times: list[int] = []
        reads: list[QueuedRead] = []
        sizes: list[int] = []
        last: tuple[str | None, int | None] = (None, None)
        for message in messages:
            error = message.error()
            topic, partition = message.topic(), message.partition()
            if (topic, partition) != last:
                if key is not None:
                    order.extend(key, times, reads, sizes)
                times, reads, sizes, last = [], [], [], (topic, partition)
                key = keys.get((topic or "", partition or 0))
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if key is not None:
                        # The records before it first: a record is not an end.
                        order.extend(key, times, reads, sizes)
                        times, reads, sizes = [], [], []
                        order.at_end(key)
                    continue
                log.error("consume error: %s", error.str())
                if error.fatal():
                    raise KafkaException(error)
                continue
            if key is None:  # revoked meanwhile: its next owner reads it
                continue
            offset = message.offset()
            assert topic is not None and partition is not None and offset is not None
            value = message.value()
            routed: Routed | list[Routed] | RouterOutput | None
            if topic == transactions:
                time_ms, routed = self._read_transaction(value, partition, offset, outcomes)
            else:
                time_ms, routed = self._read_label(message, value, partition, offset)
            # A time past the bound, or none, moves nothing: NO_TIME takes the one before.
            times.append(time_ms if time_ms is not None and time_ms <= bound_ms else NO_TIME)
            reads.append((offset, routed))
            sizes.append(_held(routed) if isinstance(routed, RouterOutput) else len(value or b""))
        if key is not None:
            order.extend(key, times, reads, sizes)
        for outcome, count in outcomes.items():
            self._metrics.transaction(outcome, count)

    def _read_transaction(
        self, value: bytes | None, partition: int, offset: int, outcomes: dict[str, int]
    ) -> tuple[int | None, Routed | None]:
        try:
            time_ms, found = read_transaction(value, partition, offset)
        except RecordError:
            outcomes["invalid"] = outcomes.get("invalid", 0) + 1  # the scorer dead-letters it
            return None, None
        outcome = "no_terminal" if found is None else "routed"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return time_ms, found

    def _read_label(
        self, message: Message, value: bytes | None, partition: int, offset: int
    ) -> tuple[int | None, list[Routed] | RouterOutput]:
        try:
            found = route_label(value, partition, offset)
        except RecordError as exc:
            letter = self._dead_letters.dead_letter(message, exc)
            self._metrics.label("dead_lettered")
            log.warning(
                "label dead-lettered reason=%s topic=%s partition=%s offset=%s: %s",
                exc.reason,
                message.topic(),
                partition,
                offset,
                exc,
            )
            return None, letter_output(letter)
        event = found[0].event
        if len(found) == 1:  # its card's event only
            self._metrics.label("no_terminal")
        else:
            self._metrics.label("fraud" if event.fraud else "legit")
        self._metrics.label_delay(event.reported_at - event.event_time)
        # A label takes its turn when it was reported: the counts it changes are those the
        # transactions up to then made.
        return event.reported_at, found


def _held(output: RouterOutput) -> int:
    """The bytes a queued dead letter holds: its record's key, value and headers."""
    headers = sum(len(name) + len(value or b"") for name, value in output.headers or ())
    return len(output.key or b"") + len(output.value or b"") + headers
