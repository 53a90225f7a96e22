"""Outcome groups: a set of outputs whose acknowledgement finishes a set of consumed records.

A scored batch is one group (its decisions, and dead letters for poison records, finish its
records); each dead letter of an invalid record is a group of one. Only when every output of a
group is acknowledged are its records handed to the `OffsetTracker` as finished. An output that
fails is retried (`stream/redelivery.py`) and the group simply waits: its records stay
uncommitted until then.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

from contracts.offsets import OffsetTracker, SourceOffset

#: What an output is, for the metrics: ("decision", label) or ("dead_letter", reason).
OutputLabel = tuple[str, str]


class OutcomeGroup:
    """Counts down the deliveries of some outputs, then finishes their source offsets."""

    __slots__ = ("_count", "_expected", "_on_complete", "_sources", "_tracker", "labels")

    def __init__(
        self,
        tracker: OffsetTracker,
        sources: list[SourceOffset],
        labels: Counter[OutputLabel],
        on_complete: Callable[[Counter[OutputLabel]], None],
    ) -> None:
        """`labels` counts the group's outputs by kind and label; their total is how many
        deliveries complete the group."""
        expected = labels.total()
        if expected < 1:
            raise ValueError(f"an outcome group needs at least one output, got {expected}")
        self._tracker = tracker
        self._sources = sources
        self._expected = expected
        # Delivery reports of one group may be served by both threads' polls: `next()` on a
        # counter is one C call under the GIL, where `remaining -= 1` could lose an update.
        self._count = itertools.count(1)
        self.labels = labels
        self._on_complete = on_complete

    def delivered(self) -> None:
        """One output of the group is acknowledged (called once per output, any thread)."""
        if next(self._count) == self._expected:
            self._tracker.finish_all(self._sources)
            self._on_complete(self.labels)

    @property
    def sources(self) -> list[SourceOffset]:
        """The consumed records the group is the outcome of."""
        return self._sources

    def relabel(self, old: OutputLabel, new: OutputLabel) -> None:
        """One output changed what it is (a refused decision became a dead letter)."""
        self.labels[old] -= 1
        self.labels[new] += 1
