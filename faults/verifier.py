"""The verifier: what a fault scenario left in the topics, checked against the guarantees.

It takes the input topic, the decisions (as a read_committed consumer sees them) and the dead
letters, each read to its end (`faults/reading.py`), plus the faults the scenario injected, and
checks:

- every input record has exactly one outcome, a decision (matched by `transaction_id`) or a dead
  letter (matched by `dlq.original.partition`/`offset`), never both; no outcome belongs to no
  input record;
- duplicates: none at all in exactly-once mode; in at-least-once mode only among records in
  flight at a fault (at or past the group's committed offset when the fault began, and produced
  before it ended), and every duplicate identical to the first outcome (`decided_at` aside). With
  card history (`rescoring_allowed`) a duplicate may carry another score and verdict, everything
  else identical: the record was read again after a crash against a history that already counts
  it (its card state reached the changelog, its offset commit did not). Such duplicates are
  counted, not violations; exactly-once has none, and without history they are identical;
- per-card order: a card's decisions, in the order of the decision topic, first appear in the
  order of its transactions in their input partition;
- time to recover, per fault: from the fault until the last record that waited longer than
  `recovered_latency_ms` for its first outcome got it (0 when no record waited that long).

Plain logic over in-memory records, so each check is unit-tested by injecting its violation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

#: A record waiting longer than this for its outcome counts as not yet recovered: the service's
#: own decision deadline (FRAUD_DECISION_DEADLINE_MS' default).
RECOVERED_LATENCY_MS = 1_000
#: Concrete examples kept per kind of violation, for the log.
EXAMPLES_PER_CHECK = 3


class InputRecord(NamedTuple):
    """A record of the input topic; `transaction_id` is None when it could not be read."""

    partition: int
    offset: int
    timestamp_ms: int
    transaction_id: str | None
    card_id: str | None


class Decision(NamedTuple):
    """A decision as a read_committed consumer sees it, at its place in the decision topic."""

    partition: int
    offset: int
    transaction_id: str
    card_id: str
    #: What a duplicate must repeat exactly (everything but `decided_at` and `verdict`).
    content: Hashable
    decided_at_ms: int
    #: When a live read_committed reader first saw it (None: not observed, `decided_at` stands
    #: in).
    visible_at_ms: int | None = None
    #: When its producer produced it (the record's timestamp), where known.
    produced_ms: int | None = None
    #: Score and decision: what a duplicate repeats unless rescoring is allowed.
    verdict: Hashable = None
    #: The transaction's event time, copied into the decision (None: not read).
    event_time_ms: int | None = None


class DeadLetter(NamedTuple):
    """A dead letter and the input position it names."""

    partition: int
    offset: int
    source_partition: int
    source_offset: int
    #: What a duplicate must repeat exactly (reason, original value).
    content: Hashable
    failed_at_ms: int


class FaultWindow(NamedTuple):
    """One injected fault: when it began and ended, and the group's committed input offsets
    (partition → offset) sampled just before it began."""

    name: str
    started_ms: int
    ended_ms: int
    committed: Mapping[int, int]


@dataclass(frozen=True)
class Report:
    """What the verifier found. `violations()` lists what breaks the guarantee in force."""

    exactly_once: bool
    inputs: int
    decided: int
    dead_lettered: int
    lost: int
    #: Input records with both a decision and a dead letter.
    both: int
    #: Outcomes beyond the first of their record (decisions and dead letters).
    duplicates: int
    #: Of those, duplicates of records in no fault's in-flight window.
    duplicates_outside_faults: int
    duplicates_not_identical: int
    #: Duplicates identical but for their score and verdict (allowed with card history).
    duplicates_rescored: int
    order_violations: int
    #: Outcomes that name no input record (an unknown transaction id or input position).
    unexpected: int
    #: Transaction ids the input holds more than once (the checks cannot attribute them).
    input_repeats: int
    #: Seconds from each fault to recovery, in the order of the faults.
    recovery_s: tuple[float, ...]
    max_latency_s: float
    examples: tuple[str, ...] = field(default=())

    def violations(self) -> list[str]:
        """Each broken property, as one line."""
        found = []
        if self.lost:
            found.append(f"{self.lost} input records have no outcome")
        if self.both:
            found.append(f"{self.both} input records have a decision and a dead letter")
        if self.unexpected:
            found.append(f"{self.unexpected} outcomes belong to no input record")
        if self.input_repeats:
            found.append(f"the input holds {self.input_repeats} transaction ids more than once")
        if self.exactly_once and self.duplicates:
            found.append(f"exactly-once: {self.duplicates} duplicate outcomes visible")
        if not self.exactly_once and self.duplicates_outside_faults:
            found.append(
                f"{self.duplicates_outside_faults} duplicates of records not in flight at a fault"
            )
        if self.duplicates_not_identical:
            found.append(f"{self.duplicates_not_identical} duplicates differ from the first")
        if self.order_violations:
            found.append(f"{self.order_violations} decisions out of their card's input order")
        return found


class _Outcome(NamedTuple):
    content: Hashable
    visible_at_ms: int
    #: Where it is, for the examples: "decisions 3/1234", "dead letters 0/12".
    where: str
    verdict: Hashable = None


def verify(
    inputs: Sequence[InputRecord],
    decisions: Sequence[Decision],
    dead_letters: Sequence[DeadLetter],
    faults: Sequence[FaultWindow],
    *,
    exactly_once: bool,
    rescoring_allowed: bool = False,
    recovered_latency_ms: int = RECOVERED_LATENCY_MS,
) -> Report:
    """Check the outcomes of `inputs`; see the module docstring for what is checked."""
    examples: defaultdict[str, list[str]] = defaultdict(list)

    def note(kind: str, text: str) -> None:
        if len(examples[kind]) < EXAMPLES_PER_CHECK:
            examples[kind].append(f"{kind}: {text}")

    by_id: dict[str, InputRecord] = {}
    input_repeats = 0
    for record in inputs:
        if record.transaction_id is None:
            continue
        if record.transaction_id in by_id:
            input_repeats += 1
            note("input repeat", record.transaction_id)
        by_id[record.transaction_id] = record
    by_position = {(r.partition, r.offset): r for r in inputs}

    decided: defaultdict[tuple[int, int], list[_Outcome]] = defaultdict(list)
    lettered: defaultdict[tuple[int, int], list[_Outcome]] = defaultdict(list)
    unexpected = 0
    for d in sorted(decisions, key=lambda d: (d.partition, d.offset)):
        source = by_id.get(d.transaction_id)
        if source is None:
            unexpected += 1
            note("unexpected decision", d.transaction_id)
            continue
        visible = d.visible_at_ms if d.visible_at_ms is not None else d.decided_at_ms
        where = f"decisions {d.partition}/{d.offset}"
        outcome = _Outcome(d.content, visible, where, d.verdict)
        decided[source.partition, source.offset].append(outcome)
    for letter in sorted(dead_letters, key=lambda x: (x.partition, x.offset)):
        key = (letter.source_partition, letter.source_offset)
        if key not in by_position:
            unexpected += 1
            note("unexpected dead letter", f"input {key}")
            continue
        where = f"dead letters {letter.partition}/{letter.offset}"
        lettered[key].append(_Outcome(letter.content, letter.failed_at_ms, where))

    lost = both = duplicates = outside = not_identical = rescored = 0
    first_outcome_ms: dict[tuple[int, int], int] = {}
    for record in inputs:
        key = (record.partition, record.offset)
        outcomes = decided.get(key, []) + lettered.get(key, [])
        if not outcomes:
            lost += 1
            note("lost", f"input {key} {record.transaction_id}")
            continue
        first_outcome_ms[key] = min(o.visible_at_ms for o in outcomes)
        if key in decided and key in lettered:
            both += 1
            note("decision and dead letter", f"input {key} {record.transaction_id}")
        if len(outcomes) > 1:
            extra = len(outcomes) - 1
            duplicates += extra
            seen = f"input {key} {record.transaction_id} at {', '.join(o.where for o in outcomes)}"
            note("duplicate", seen)
            if not _in_flight(record, faults):
                outside += extra
                note("duplicate outside faults", seen)
            first = outcomes[0]
            differing = sum(o.content != first.content for o in outcomes[1:])
            rescores = sum(
                o.content == first.content and o.verdict != first.verdict for o in outcomes[1:]
            )
            if rescoring_allowed:
                rescored += rescores
            else:
                differing += rescores
            if differing:
                not_identical += differing
                note("duplicate not identical", seen)

    order_violations = _order_violations(by_id, decisions, note)
    recovery = tuple(
        _recovery_s(inputs, first_outcome_ms, faults, i, recovered_latency_ms)
        for i in range(len(faults))
    )
    latencies = [
        first_outcome_ms[r.partition, r.offset] - r.timestamp_ms
        for r in inputs
        if (r.partition, r.offset) in first_outcome_ms
    ]
    return Report(
        exactly_once=exactly_once,
        inputs=len(inputs),
        decided=len(decided),
        dead_lettered=len(lettered),
        lost=lost,
        both=both,
        duplicates=duplicates,
        duplicates_outside_faults=outside,
        duplicates_not_identical=not_identical,
        duplicates_rescored=rescored,
        order_violations=order_violations,
        unexpected=unexpected,
        input_repeats=input_repeats,
        recovery_s=recovery,
        max_latency_s=max(latencies, default=0) / 1000.0,
        examples=tuple(line for lines in examples.values() for line in lines),
    )


def _in_flight(record: InputRecord, faults: Sequence[FaultWindow]) -> bool:
    """Whether a record was in flight at one of the faults: not committed when the fault began,
    and produced before it ended."""
    return any(
        record.offset >= fault.committed.get(record.partition, 0)
        and record.timestamp_ms <= fault.ended_ms
        for fault in faults
    )


def _order_violations(
    by_id: Mapping[str, InputRecord],
    decisions: Sequence[Decision],
    note: Callable[[str, str], None],
) -> int:
    """Decisions that first appear after a later transaction of the same card, in the order of
    the decision topic (a card's decisions share a key, so one partition holds them all)."""
    latest: dict[str, tuple[int, int, int]] = {}  # card → (output partition, input position)
    seen: set[str] = set()
    violations = 0
    for d in sorted(decisions, key=lambda d: (d.partition, d.offset)):
        source = by_id.get(d.transaction_id)
        if source is None or d.transaction_id in seen:
            continue
        seen.add(d.transaction_id)
        here = (d.partition, source.partition, source.offset)
        before = latest.get(d.card_id)
        if before is not None and (before[0] != here[0] or before[1:] > here[1:]):
            violations += 1
            note(
                "order",
                f"card {d.card_id}: {d.transaction_id} (input {source.partition}/"
                f"{source.offset}) at decisions {d.partition}/{d.offset}, after the decision "
                f"of input {before[1]}/{before[2]} (decisions partition {before[0]})",
            )
        if before is None or here[1:] > before[1:]:
            latest[d.card_id] = here
    return violations


def _recovery_s(
    inputs: Sequence[InputRecord],
    first_outcome_ms: Mapping[tuple[int, int], int],
    faults: Sequence[FaultWindow],
    index: int,
    recovered_latency_ms: int,
) -> float:
    """Seconds from fault `index` until the last late record (its first outcome after this
    fault began) got its outcome. A record sent less than `recovered_latency_ms` before the
    next fault began was not late yet when it did: it counts for that one."""
    start = faults[index].started_ms
    until = faults[index + 1].started_ms if index + 1 < len(faults) else None
    recovered = start
    for record in inputs:
        outcome = first_outcome_ms.get((record.partition, record.offset))
        if outcome is None or outcome < start:
            continue
        if until is not None and record.timestamp_ms >= until - recovered_latency_ms:
            continue
        if outcome - record.timestamp_ms > recovered_latency_ms:
            recovered = max(recovered, outcome)
    return (recovered - start) / 1000.0
