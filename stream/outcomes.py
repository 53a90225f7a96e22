"""Outcome groups: a set of outputs whose acknowledgement finishes a set of consumed records.

A scored batch is one group (its decisions finish its records); each dead letter is a group of
one. Only when every output of a group is acknowledged are its records handed to the
`OffsetTracker` as finished. An output that fails is retried (`stream/redelivery.py`) and the
group simply waits: its records stay uncommitted until then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from stream.offsets import OffsetTracker, SourceOffset


class OutcomeGroup:
    """Counts down the deliveries of some outputs, then finishes their source offsets."""

    __slots__ = ("_labels", "_on_complete", "_remaining", "_sources", "_tracker")

    def __init__(
        self,
        tracker: OffsetTracker,
        sources: list[SourceOffset],
        expected_outputs: int,
        on_complete: Callable[[Counter[tuple[str, str]]], None],
    ) -> None:
        if expected_outputs < 1:
            raise ValueError(f"an outcome group needs at least one output, got {expected_outputs}")
        self._tracker = tracker
        self._sources = sources
        self._remaining = expected_outputs
        self._labels: Counter[tuple[str, str]] = Counter()
        self._on_complete = on_complete

    def delivered(self, kind: str, label: str) -> None:
        """One output of the group is acknowledged (called once per output): its kind
        ("decision" or "dead_letter") and label (the decision, or the dead letter's reason)."""
        self._labels[kind, label] += 1
        self._remaining -= 1
        if self._remaining == 0:
            self._tracker.finish_all(self._sources)
            self._on_complete(self._labels)
