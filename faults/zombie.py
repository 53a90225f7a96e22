"""Scenario 3's zombie: when it was frozen and thawed, and which of its writes showed late."""

from __future__ import annotations

from dataclasses import dataclass

from faults.verifier import Decision, InputRecord


@dataclass(frozen=True)
class Freeze:
    """Scenario 3's zombie: when it was frozen and thawed (epoch ms), and the input partitions
    it owned when frozen."""

    stopped_ms: int
    thawed_ms: int
    partitions: frozenset[int]

    def late_writes(
        self, inputs: list[InputRecord], decisions: list[Decision]
    ) -> tuple[int, int, int]:
        """Decisions produced before the freeze and first visible after the thaw.

        Returns the zombie's (decisions for its inputs), how many of those repeat another
        decision, and the others'. A zombie frozen inside its commit, its offsets already sent
        under the old generation, completes that transaction at the thaw: Kafka lets it, and
        the new owner's offset fetch waits for it (KIP-447), so those writes appear late but
        once. Fencing must stop any other: a late write that repeats a decision. The others'
        are the second replica's, committed in time but held behind the zombie's open
        transaction on a shared output partition until it ended: read_committed at work."""
        zombie_ids = {r.transaction_id for r in inputs if r.partition in self.partitions}
        decided: dict[str, int] = {}
        for d in decisions:
            decided[d.transaction_id] = decided.get(d.transaction_id, 0) + 1
        late = duplicated = released = 0
        for d in decisions:
            visible = d.visible_at_ms or d.decided_at_ms
            if d.produced_ms is None or d.produced_ms > self.stopped_ms or visible < self.thawed_ms:
                continue
            if d.transaction_id in zombie_ids:
                late += 1
                duplicated += decided[d.transaction_id] > 1
            else:
                released += 1
        return late, duplicated, released
