"""What to send instead of an output the broker refused for itself (too large).

Both sinks meet such refusals: the at-least-once one in its retry rounds (`stream/redelivery.py`),
the exactly-once one when a record is read again after the abort its refusal caused
(`stream/transactional_sink.py`). They agree on the replacement, and differ only in what to do when
there is none: the at-least-once sink retries the output as it is, the exactly-once one stops.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from contracts.offsets import PartitionKey, SourceOffset, position_of
from deadletter.router import DeadLetterRouter, shrink
from plumbing.errors import RecordRejectedError
from plumbing.kafka_errors import translate_kafka_error
from stream.sink import Output


def replacement(
    output: Output, error: RecordRejectedError, router: DeadLetterRouter, max_message_bytes: int
) -> Output | None:
    """The output to send instead of `output`, refused for `error`: a decision becomes its
    record's dead letter (reason `produce`), a dead letter a smaller form of itself
    (`deadletter.router.shrink`). None when nothing smaller can go: a card state (small, so
    its topic is at fault) or a dead letter refused even in its smallest form (the dead-letter
    topic's `max.message.bytes` is at fault)."""
    if output.kind == "changelog":
        return None
    if output.kind == "decision":
        output.group.relabel(("decision", output.label), ("dead_letter", error.reason))
        letter = router.dead_letter(output.source, error)
        return Output.dead_letter(letter, output.source, output.group)
    smaller = shrink(output.as_dead_letter(), max_message_bytes)
    return None if smaller is None else Output.dead_letter(smaller, output.source, output.group)


class RefusedOutputs:
    """The exactly-once sink's memory of refusals. A refused output fails its transaction, so
    its record is read again after the abort, and its replacement is sent that time. A refusal
    is kept until a transaction holding its replacement commits: after an abort librdkafka may
    fail the next transaction too (an epoch bump), and the record comes once more. The refused
    output is kept, not only the error, so a replacement refused in turn is shrunk further. No
    replacement is fatal: the topic, not the record, must change."""

    def __init__(self, router: DeadLetterRouter, max_message_bytes: int) -> None:
        self._router = router
        self._max_message_bytes = max_message_bytes
        self._by_source: dict[SourceOffset, tuple[Output, RecordRejectedError]] = {}
        #: Records whose replacement went into the open transaction.
        self._replaced: set[SourceOffset] = set()

    def __bool__(self) -> bool:
        return bool(self._by_source)

    def remember(self, output: Output, error: RecordRejectedError) -> None:
        """`output` was refused after it went into a transaction (a delivery report)."""
        self._by_source[position_of(output.source)] = (output, error)

    def instead_of_remembered(self, output: Output) -> Output:
        """What to send for `output`, of a record read again: itself, or, when an output of
        this record was refused before, a replacement of that refused output, counted in
        `output`'s group (that of this read). Card states are sent as they are: they name a
        record as their source (the batch's last of its partition) but are not its outcome."""
        if output.kind == "changelog":
            return output
        source = position_of(output.source)
        refusal = self._by_source.get(source)
        if refusal is None:
            return output
        refused, error = refusal
        letter = self.instead(refused, error).as_dead_letter()
        self._replaced.add(source)
        if output.kind == "decision":
            output.group.relabel(("decision", output.label), ("dead_letter", error.reason))
        return Output.dead_letter(letter, output.source, output.group)

    def instead_of_refused(self, output: Output, refused: KafkaError) -> Output:
        """What to send for `output`, refused by produce() itself; an error other than a
        refusal of the record raises."""
        error = translate_kafka_error(refused, output.topic)
        if not isinstance(error, RecordRejectedError):
            raise KafkaException(refused)
        return self.instead(output, error)

    def instead(self, output: Output, error: RecordRejectedError) -> Output:
        found = replacement(output, error, self._router, self._max_message_bytes)
        if found is not None:
            return found
        if output.kind == "changelog":
            reason = f"card state refused: {error}; check the changelog topic"
        else:
            reason = (
                "a dead letter is refused even without its value, key and original headers: "
                "raise the dead-letter topic's max.message.bytes"
            )
        raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, reason, fatal=True))

    def committed(self) -> None:
        """The open transaction committed: its replacements are durable."""
        for source in self._replaced:
            self._by_source.pop(source, None)
        self._replaced.clear()

    def aborted(self) -> None:
        """The open transaction was aborted: its records, replaced or not, come again."""
        self._replaced.clear()

    def forget(self, partitions: set[PartitionKey]) -> None:
        """Partitions gone to another replica, which learns their refusals for itself."""
        for source in [s for s in self._by_source if s[0] in partitions]:
            del self._by_source[source]
        self._replaced -= {s for s in self._replaced if s[0] in partitions}
