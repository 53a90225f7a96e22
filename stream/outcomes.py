"""Outcome groups: a set of outputs whose acknowledgement finishes a set of consumed records.

A scored batch is one group (its decisions finish its records); each dead letter is a group of
one. Only when every output of a group is acknowledged are its records handed to the
`OffsetTracker` as finished; a failed output stops the group from ever finishing them, so they
are never committed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from stream.errors import DeliveryError
from stream.offsets import OffsetTracker, PartitionKey

log = logging.getLogger(__name__)

SourceOffset = tuple[PartitionKey, int]


class OutcomeGroup:
    """Counts down the deliveries of some outputs, then finishes their source offsets."""

    __slots__ = ("_labels", "_on_complete", "_on_failure", "_remaining", "_sources", "_tracker")

    def __init__(
        self,
        tracker: OffsetTracker,
        sources: list[SourceOffset],
        expected_outputs: int,
        on_complete: Callable[[Counter[str]], None],
        on_failure: Callable[[DeliveryError, list[SourceOffset]], None],
    ) -> None:
        if expected_outputs < 1:
            raise ValueError(f"an outcome group needs at least one output, got {expected_outputs}")
        self._tracker = tracker
        self._sources = sources
        self._remaining = expected_outputs
        self._labels: Counter[str] = Counter()
        self._on_complete = on_complete
        self._on_failure = on_failure

    def expect(self, label: str) -> Callable[[DeliveryError | None], None]:
        """The delivery callback of one output; `label` is counted when the group completes."""
        self._labels[label] += 1
        return self._delivered

    def _delivered(self, error: DeliveryError | None) -> None:
        if error is not None:
            if self._remaining > 0:
                self._remaining = -1  # never finishes: its offsets stay uncommitted
                self._on_failure(error, self._sources)
            return
        if self._remaining <= 0:
            return
        self._remaining -= 1
        if self._remaining == 0:
            for partition, offset in self._sources:
                self._tracker.finish(partition, offset)
            self._on_complete(self._labels)
