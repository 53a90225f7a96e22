"""What the decisions' times say about a run: the longest silence of each input partition, and
the event→decision latency.

A partition's gap is the time between two consecutive decisions of its records, by `decided_at`
(the service's clock when it decided): scenario 6 checks that the partitions a replica keeps go
on being decided while other partitions' card state is restored. The gaps of the input itself
(the records' timestamps) come with it, so a silence of the load is not taken for one of the
service, and so does the service's share of each gap: counted from the later of the decision
before it and the production of the first record decided after it (its timestamp), so the time
the load itself sent nothing is left out. Plain logic over in-memory records, unit-tested.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from faults.verifier import Decision, InputRecord


class PartitionGap(NamedTuple):
    """The longest time (ms) between consecutive decisions of one input partition's records,
    when it ended (epoch ms), the longest between consecutive records of its input, and the
    longest time a record of it waited, produced, while the partition had no decision."""

    partition: int
    decisions_ms: int
    ended_at_ms: int
    input_ms: int
    waited_ms: int


class Silence(NamedTuple):
    """A stretch (epoch ms) with no decision of an input partition's records."""

    partition: int
    from_ms: int
    to_ms: int


class Latency(NamedTuple):
    """Event→decision latency (ms) of the decided transactions: each one's first decision."""

    decided: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def longest_gaps(
    inputs: Sequence[InputRecord], decisions: Iterable[Decision], partitions: Collection[int]
) -> list[PartitionGap]:
    """The longest decision gap of each of `partitions` (input partitions), over every decision
    of their records (duplicates too: a repeat is a sign of life all the same). A partition
    with fewer than two decisions has a gap of 0."""
    decisions = list(decisions)
    decided = _decided_at(inputs, decisions, partitions)
    first = _first_decided(decisions)
    sent: defaultdict[int, list[int]] = defaultdict(list)
    answered: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in inputs:
        if r.partition in partitions:
            sent[r.partition].append(r.timestamp_ms)
            at = first.get(r.transaction_id) if r.transaction_id is not None else None
            if at is not None:
                answered[r.partition].append((at, r.timestamp_ms))
    gaps = []
    for partition in sorted(partitions):
        gap_ms, ended_ms = _longest_gap(decided[partition])
        gaps.append(
            PartitionGap(
                partition,
                gap_ms,
                ended_ms,
                _longest_gap(sent[partition])[0],
                _longest_wait(decided[partition], answered[partition]),
            )
        )
    return gaps


def silences(
    inputs: Sequence[InputRecord],
    decisions: Iterable[Decision],
    partitions: Collection[int],
    longer_than_ms: int,
) -> list[Silence]:
    """Every gap longer than `longer_than_ms` between consecutive decisions of the records of
    each of `partitions`, by partition and time."""
    found = []
    for partition, times in sorted(_decided_at(inputs, decisions, partitions).items()):
        ordered = np.sort(np.asarray(times, np.int64))
        for at in np.flatnonzero(np.diff(ordered) > longer_than_ms).tolist():
            found.append(Silence(partition, int(ordered[at]), int(ordered[at + 1])))
    return found


def latency(decisions: Iterable[Decision]) -> Latency:
    """Percentiles of decided_at - event_time over each transaction's first decision (the
    decisions whose event time was read)."""
    first: dict[str, int] = {}
    for d in decisions:
        if d.event_time_ms is None:
            continue
        waited = d.decided_at_ms - d.event_time_ms
        if d.transaction_id not in first or waited < first[d.transaction_id]:
            first[d.transaction_id] = waited
    if not first:
        return Latency(0, 0.0, 0.0, 0.0)
    values = np.fromiter(first.values(), np.float64, len(first))
    p50, p99 = np.percentile(values, [50, 99])
    return Latency(len(first), float(p50), float(p99), float(values.max()))


def _decided_at(
    inputs: Sequence[InputRecord], decisions: Iterable[Decision], partitions: Collection[int]
) -> defaultdict[int, list[int]]:
    """The `decided_at` of every decision of the records of each of `partitions`."""
    partition_of = {
        r.transaction_id: r.partition
        for r in inputs
        if r.transaction_id is not None and r.partition in partitions
    }
    decided: defaultdict[int, list[int]] = defaultdict(list)
    for d in decisions:
        partition = partition_of.get(d.transaction_id)
        if partition is not None:
            decided[partition].append(d.decided_at_ms)
    return decided


def _first_decided(decisions: Iterable[Decision]) -> dict[str, int]:
    """Each transaction's first `decided_at`."""
    first: dict[str, int] = {}
    for d in decisions:
        if d.transaction_id not in first or d.decided_at_ms < first[d.transaction_id]:
            first[d.transaction_id] = d.decided_at_ms
    return first


def _longest_wait(decided_ms: list[int], answered: list[tuple[int, int]]) -> int:
    """The service's longest share of a gap between consecutive decisions (`decided_ms`, every
    sign of life): from the later of the decision before and the earliest production time of the
    records first decided after the gap (`answered`: (first decided_at, produced) per record)."""
    if len(decided_ms) < 2 or not answered:
        return 0
    ordered = np.sort(np.asarray(decided_ms, np.int64))
    by_decision = sorted(answered)
    first_at = np.asarray([at for at, _ in by_decision], np.int64)
    # The earliest production time among the records first decided at or after each position.
    produced = np.minimum.accumulate(np.asarray([p for _, p in by_decision], np.int64)[::-1])[::-1]
    starts = np.searchsorted(first_at, ordered[1:], side="left")
    valid = starts < len(first_at)
    waiting_since = np.where(valid, produced[np.minimum(starts, len(first_at) - 1)], ordered[1:])
    waits = ordered[1:] - np.maximum(ordered[:-1], waiting_since)
    return int(max(0, waits.max()))


def _longest_gap(times_ms: list[int]) -> tuple[int, int]:
    """The longest step between consecutive times (sorted here), and the time it ended."""
    if len(times_ms) < 2:
        return 0, times_ms[0] if times_ms else 0
    ordered = np.sort(np.asarray(times_ms, np.int64))
    steps = np.diff(ordered)
    at = int(np.argmax(steps))
    return int(steps[at]), int(ordered[at + 1])
