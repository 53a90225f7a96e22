"""When a batch may be scored with FRAUD_WAIT_FOR_WORKER=on (stream/worker_alignment.py): only
once the worker's progress reaches its newest transaction and the scorer's copies of its tables
are read up to their ends as of after that progress was seen; a transaction dated past the
host's clock counts as of that bound; the wait is counted. The tables are scripted here; the
real ones, the worker and a replay are in tests/integration/test_replay_alignment.py."""

from __future__ import annotations

from typing import cast

from prometheus_client import CollectorRegistry

from contracts.event_time import EventClock
from stream.metrics import ServiceMetrics
from stream.worker_alignment import WorkerAlignment
from stream.worker_tables import CardFraudsTable, TerminalRiskTable

WALL_MS = 1_800_000_000_000
SKEW_MS = 60_000


class ScriptedTable:
    """A table copy whose progress and reads the test moves."""

    def __init__(self) -> None:
        self.progress = -1
        self.asked = 0
        self.read_up_to = 0

    def counted_to_ms(self) -> int:
        return self.progress

    def ask_read_to_end(self) -> int:
        self.asked += 1
        return self.asked

    def read_to_end(self, asked: int) -> bool:
        return self.read_up_to >= asked


class Setup:
    def __init__(self) -> None:
        self.terminals, self.cards = ScriptedTable(), ScriptedTable()
        self.now = 100.0
        self.metrics = ServiceMetrics(CollectorRegistry())
        self.alignment = WorkerAlignment(
            cast(TerminalRiskTable, self.terminals),
            cast(CardFraudsTable, self.cards),
            EventClock(SKEW_MS, 1.0, wall_ms=lambda: WALL_MS),
            self.metrics,
            now=lambda: self.now,
        )

    def read_all(self) -> None:
        self.terminals.read_up_to, self.cards.read_up_to = self.terminals.asked, self.cards.asked

    def waited_s(self) -> float:
        value = self.metrics.registry.get_sample_value("fraud_worker_wait_seconds_total")
        return 0.0 if value is None else value


def test_a_batch_waits_until_the_progress_reaches_it_and_the_tables_are_read_after_it() -> None:
    s = Setup()
    newest = WALL_MS - 86_400_000
    assert not s.alignment.allows(newest)  # no progress yet
    s.terminals.progress = newest - 1
    s.now += 1.0
    assert not s.alignment.allows(newest)  # short of the batch
    s.read_all()
    s.terminals.progress = newest
    s.now += 1.0
    assert not s.alignment.allows(newest)  # reached, but the tables not read after it yet
    assert s.terminals.asked == s.cards.asked == 2
    s.read_all()
    s.now += 0.5
    assert s.alignment.allows(newest)
    assert s.waited_s() == 2.5


def test_a_read_that_ends_before_the_request_does_not_count() -> None:
    s = Setup()
    s.terminals.progress = WALL_MS - 1_000
    assert not s.alignment.allows(WALL_MS - 1_000)
    s.terminals.read_up_to = s.terminals.asked  # card-frauds not read yet
    assert not s.alignment.allows(WALL_MS - 1_000)
    s.cards.read_up_to = s.cards.asked
    assert s.alignment.allows(WALL_MS - 1_000)


def test_batches_within_the_progress_already_confirmed_pass_without_asking_again() -> None:
    s = Setup()
    s.terminals.progress = WALL_MS - 1_000
    s.alignment.allows(WALL_MS - 1_000)
    s.read_all()
    assert s.alignment.allows(WALL_MS - 5_000)
    asked = s.terminals.asked
    assert s.alignment.allows(WALL_MS - 1_000) and s.alignment.allows(WALL_MS - 9_000)
    assert s.terminals.asked == asked
    assert s.waited_s() == 0.0  # never held


def test_a_transaction_dated_past_the_clock_waits_only_for_the_bound() -> None:
    s = Setup()
    s.terminals.progress = WALL_MS + SKEW_MS
    s.alignment.allows(WALL_MS + 10 * SKEW_MS)
    s.read_all()
    assert s.alignment.allows(WALL_MS + 10 * SKEW_MS)
