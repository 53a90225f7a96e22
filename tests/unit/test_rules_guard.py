"""The guard of the rules topic (stream/rules_guard.py, issue 43, finding 14): an update that
would flag more than a share of the last minute's traffic is held; one that flags little, or no
more than the rules in force, is not; the sample stays bounded and cheap to feed."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import numpy as np
import pytest
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from contracts.transaction import Transaction, decode_transaction
from plumbing.errors import RulesUpdateError
from scorer.columns import TransactionColumns
from scorer.decisions import Thresholds
from scorer.features import NUM_FEATURES
from scorer.rules import Rules
from simulator.transactions import TransactionSimulator
from stream import rules_table
from stream.metrics import ServiceMetrics
from stream.rules_guard import MIN_SAMPLE_ROWS, ROWS_PER_SECOND, SAMPLE_ROWS, RulesGuard
from stream.rules_table import RulesTable
from tests.support.budget import MIB, Budget, within
from tests.unit.fakes import message

THRESHOLDS = Thresholds(review=0.5, decline=0.8)
TRANSACTIONS = [
    decode_transaction(msgspec.json.encode(record))
    for record in TransactionSimulator(5, id_prefix="guard").generate(4_000).records
]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def fed(
    guard: RulesGuard,
    clock: Clock,
    seconds: int,
    batch: int = 200,
    rows_of: list[Transaction] = TRANSACTIONS,
) -> list[Transaction]:
    """Feed `seconds` of traffic, a batch a second, all scored low (approved by the model);
    return what the guard kept."""
    fed: list[Transaction] = []
    for s in range(seconds):
        rows = rows_of[(s * batch) % 3_000 :][:batch]
        features = np.zeros((len(rows), NUM_FEATURES), np.float32)
        guard.observe(rows, features, np.full(len(rows), 0.01, np.float32), THRESHOLDS)
        kept = np.unique(np.linspace(0, len(rows) - 1, ROWS_PER_SECOND).astype(np.intp))
        fed.extend(rows[i] for i in kept.tolist())
        clock.now += 1.0
    return fed


def rule(when: str, then: str = "decline") -> bytes:
    return json.dumps({"when": when, "then": then}).encode()


def check(guard: RulesGuard, current: Rules, key: str, value: bytes | None) -> object:
    return guard.check(key, value is not None, current, current.with_update(key, value))


def test_a_rule_that_declines_everything_is_held_and_a_narrow_one_is_not() -> None:
    clock = Clock()
    guard = RulesGuard(0.5, clock)
    fed(guard, clock, 10)
    held = check(guard, Rules.EMPTY, "rule:everything", rule("amount > 0"))
    assert held is not None
    assert held.share_new == 1.0 and held.share_now == 0.0  # type: ignore[attr-defined]
    assert held.rows == 10 * ROWS_PER_SECOND  # type: ignore[attr-defined]
    assert check(guard, Rules.EMPTY, "rule:big", rule("amount > 900")) is None


def test_an_update_that_flags_no_more_than_before_is_never_held() -> None:
    clock = Clock()
    guard = RulesGuard(0.5, clock)
    fed(guard, clock, 10)
    everything = Rules.EMPTY.with_update("rule:everything", rule("amount > 0"))
    # Removing it, or replacing it by another that flags as much, lowers nothing: fine.
    assert check(guard, everything, "rule:everything", None) is None
    assert check(guard, everything, "rule:other", rule("amount > 0", "review")) is None


def test_a_deny_entry_is_judged_by_the_rows_of_its_id_alone() -> None:
    clock = Clock()
    guard = RulesGuard(0.2, clock)
    # A third of the traffic goes to one merchant.
    big = [
        msgspec.structs.replace(t, merchant_id="m-big") if i % 3 == 0 else t
        for i, t in enumerate(TRANSACTIONS)
    ]
    sampled = fed(guard, clock, 10, rows_of=big)
    assert check(guard, Rules.EMPTY, "deny:card:nobody", b"{}") is None
    assert check(guard, Rules.EMPTY, f"deny:card:{sampled[1].card_id}", b"{}") is None
    held = check(guard, Rules.EMPTY, "deny:merchant:m-big", b"{}")
    assert held is not None and 0.25 < held.share_new < 0.45  # type: ignore[attr-defined]
    # Allowing it approves: never held. Its tombstone, once denied, flags less: never held.
    assert check(guard, Rules.EMPTY, "allow:merchant:m-big", b"{}") is None
    denied = Rules.EMPTY.with_update("deny:merchant:m-big", b"{}")
    assert check(guard, denied, "deny:merchant:m-big", None) is None


def test_too_little_traffic_is_not_judged() -> None:
    clock = Clock()
    guard = RulesGuard(0.5, clock)
    fed(guard, clock, 1)
    assert guard.rows() < MIN_SAMPLE_ROWS
    assert check(guard, Rules.EMPTY, "rule:everything", rule("amount > 0")) is None
    clock.now += 120  # a minute later, what was fed is gone
    fed(guard, clock, 0)
    assert guard.rows() == 0


def test_the_sample_is_bounded_and_a_full_second_costs_next_to_nothing() -> None:
    clock = Clock()
    guard = RulesGuard(0.5, clock)
    rows = TRANSACTIONS[:512]
    features = np.zeros((len(rows), NUM_FEATURES), np.float32)
    scores = np.full(len(rows), 0.01, np.float32)
    with within(Budget(peak_bytes=4 * MIB, seconds=5.0), "two minutes of batches"):
        for _ in range(120):
            for _ in range(20):  # 20 batches of 512 a second: 10,240 tx/s
                guard.observe(rows, features, scores, THRESHOLDS)
            clock.now += 1.0
    assert guard.rows() <= SAMPLE_ROWS
    started = time.perf_counter()
    for _ in range(1_000):
        guard.observe(rows, features, scores, THRESHOLDS)  # this second's slot is full
    per_batch_s = (time.perf_counter() - started) / 1_000
    assert per_batch_s < 50e-6, f"{per_batch_s * 1e6:.1f} µs a batch"


def test_the_share_must_be_a_share() -> None:
    with pytest.raises(ValueError, match="share"):
        RulesGuard(0.0)


# --- the rules table with a guard: the catch-up at start, and updates read before the sample
# --- fills (the review of issue 43: the guard protected nothing past the next restart or a
# --- replica's first minute) ----------------------------------------------------------------

CONFIRM = [("fraud.rules.confirm", b"yes")]
EVERYTHING = rule("amount > 0")
NARROW = rule("amount > 900")


class Table(RulesTable):
    """A rules table whose reader is never started: the test says which records were the
    catch-up at start (`catch_up` offsets of partition 0), hands it records as the reader would,
    and keeps its dead letters."""

    def __init__(self, catch_up: int, share: float = 0.5) -> None:
        self.clock = Clock()
        self.guard = RulesGuard(share, self.clock)
        self.registry = CollectorRegistry()
        super().__init__(
            Rules.EMPTY, ServiceMetrics(self.registry), kafka={}, topic="rules", guard=self.guard
        )
        assert self._reader is not None
        self.reader = self._reader
        self.reader._catch_up_ends = {0: catch_up}
        self.letters: list[str] = []
        self.offset = 0

    def _dead_letter(self, message: Message, error: RulesUpdateError, where: str) -> None:
        self.letters.append(str(error))

    def read(self, key: str, value: bytes | None, headers: Any = None) -> None:
        """The next record of partition 0, then what the reader does after a read."""
        record = message(self.offset, b"", topic="rules", key=key.encode(), headers=headers)
        record.set_value(value)  # None: a tombstone
        self.reader._apply(record)
        self.offset += 1
        if self.offset == self.reader._catch_up_ends[0]:
            self.loaded.set()
        self.reader._after_read(True)

    def traffic(self, seconds: int) -> None:
        """`seconds` of decided traffic for the guard's sample; then a read with nothing."""
        fed(self.guard, self.clock, seconds)
        self.clock.now += 1.0  # the sample in columns is made again
        self.reader._after_read(False)

    def flagged(self) -> float:
        """The share of a batch of ordinary traffic the rules in force flag."""
        columns = TransactionColumns.from_transactions(TRANSACTIONS[:500])
        features = np.zeros((500, NUM_FEATURES), np.float32)
        scores = np.full(500, 0.01, np.float32)
        labels = self.current.decide(columns, features, scores, THRESHOLDS).decisions
        return sum(label != "approve" for label in labels) / len(labels)

    def counted(self, result: str) -> float:
        sample = {"result": result}
        return self.registry.get_sample_value("fraud_rules_updates_total", sample) or 0.0


def test_an_update_read_at_start_unconfirmed_is_judged_once_the_sample_fills() -> None:
    # It stayed the latest of its key after a replica held it: every replica that started
    # applied it at its catch-up, unjudged, for good.
    table = Table(catch_up=3)
    table.read("rule:r", NARROW, CONFIRM)
    table.read("deny:card:c-1", b"{}")
    table.read("rule:r", EVERYTHING)
    assert table.loaded.is_set() and table.flagged() == 1.0, "applied at start, unjudged"
    table.traffic(10)
    assert table.flagged() < 0.1, "back to the value before it"
    assert table.counted("held") == 1
    table.traffic(10)
    assert table.counted("held") == 1, "judged once"


def test_unconfirmed_updates_read_at_start_are_judged_in_order_from_the_last_confirmed() -> None:
    table = Table(catch_up=4)
    table.read("rule:a", NARROW)  # judged fine: stays
    table.read("rule:a", EVERYTHING)  # held: back to NARROW
    table.read("rule:b", EVERYTHING)
    table.read("rule:b", rule("amount >= 0"))  # both held: rule b removed
    table.traffic(10)
    assert table.counted("held") == 3
    assert table.flagged() < 0.1
    assert table.current.summary().endswith(" 1 rule")


def test_a_rule_read_live_before_the_sample_fills_waits_for_it() -> None:
    # A new replica applied every live update unjudged for about its first minute.
    table = Table(catch_up=0)
    table.loaded.set()
    table.read("rule:everything", EVERYTHING)
    assert table.flagged() == 0.0, "not applied unjudged"
    assert table.counted("waiting") == 1 and table.counted("applied") == 0
    table.read("deny:card:c-1", b"{}")
    assert table.counted("applied") == 1, "a list entry is applied at once"
    table.read("rule:narrow", NARROW)
    table.traffic(10)
    assert table.counted("held") == 1 and table.counted("applied") == 2
    assert table.flagged() < 0.1
    table.read("rule:everything", EVERYTHING, CONFIRM)
    assert table.flagged() == 1.0, "confirmed: applied at once"


def test_updates_that_wait_are_bounded_the_oldest_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(rules_table, "MAX_WAITING", 2)
    table = Table(catch_up=0)
    table.loaded.set()
    for i in range(4):
        table.read(f"rule:r{i}", rule(f"amount > {900 + i}"))
    assert table.counted("dropped") == 2
    assert "rules update rule:r0 dropped" in caplog.text
    table.traffic(10)
    assert table.counted("applied") == 2
    assert table.current.summary().endswith("2 rules")


def test_a_confirmed_update_overtakes_what_waits_of_its_key() -> None:
    table = Table(catch_up=0)
    table.loaded.set()
    table.read("rule:r", EVERYTHING)
    table.read("rule:r", NARROW, CONFIRM)
    table.traffic(10)
    assert table.flagged() < 0.1 and table.counted("held") == 0
    assert table.counted("applied") == 1
