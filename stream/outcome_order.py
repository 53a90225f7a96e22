"""Exactly-once: a transaction never carries an outcome past the offsets it commits.

A transaction commits, per partition, the position after the prefix of records that have their
outcomes. An outcome of a record past that prefix, in a committed transaction, would be decided
again after a crash or by the partition's next owner: a duplicate. Two things could put one
there, and `OutcomeOrder` keeps both out (the `TransactionalSink` calls it under its lock):

- the consuming thread dead-letters a malformed record at once, while the records before it may
  still be in a batch: such a dead letter is held (`hold`) until they have their outcomes, then
  released in offset order (`releasable`);
- a commit between two outputs of one batch: `covered` says whether the positions a commit
  would carry cover every output written since the last commit, and the commit waits a pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from contracts.offsets import OffsetTracker, PartitionKey, SourceOffset
from stream.sink import Output


class OutcomeOrder:
    """Held dead letters, and the highest record offset per partition with an output in the
    open transaction."""

    def __init__(self, tracker: OffsetTracker) -> None:
        self._tracker = tracker
        #: Dead letters waiting for earlier records of their partition, in offset order.
        self._held: dict[PartitionKey, deque[tuple[int, Output]]] = {}
        self._written: dict[PartitionKey, int] = {}

    def hold(self, output: Output) -> bool:
        """Hold a record's own dead letter while an earlier record of its partition (or an
        earlier held letter) waits for its outcome; True if held. A batch's poison letters
        share the batch's group and go out with it."""
        if output.kind != "dead_letter" or len(output.group.sources) != 1:
            return False
        key, offset = output.group.sources[0]
        held = self._held.get(key)
        if held is None:
            first = self._tracker.first_unfinished(key)
            if first is None or first >= offset:
                return False
            held = self._held[key] = deque()
        held.append((offset, output))
        return True

    def releasable(self) -> Iterator[Output]:
        """The held dead letters whose turn came, in offset order; each must be written before
        the next is asked for (writing it finishes its record). A letter whose record is no
        longer tracked (its partition went) is dropped: the next owner reads it again."""
        for key in list(self._held):
            held = self._held[key]
            while held:
                offset, output = held[0]
                first = self._tracker.first_unfinished(key)
                if first is not None and first < offset:
                    break
                held.popleft()
                if first == offset:
                    yield output
            if not held:
                del self._held[key]

    def written(self, sources: Iterable[SourceOffset]) -> None:
        """Outputs of these records went into the open transaction."""
        written = self._written
        for key, offset in sources:
            if offset > written.get(key, -1):
                written[key] = offset

    def covered(self) -> bool:
        """Whether the positions a commit would carry now cover every output written."""
        position = self._tracker.commit_position
        return all(
            (committed := position(key)) is not None and committed > offset
            for key, offset in self._written.items()
        )

    def committed(self) -> None:
        """The open transaction committed."""
        self._written.clear()

    def aborted(self) -> None:
        """The open transaction aborted: every record is read again after the rewind."""
        self._held.clear()
        self._written.clear()

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Drop what is held for partitions that are gone."""
        for key in partitions:
            self._held.pop(key, None)
