"""The one decision path: labels, lateness, poison isolation and the broken-model fallback."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pytest

from contracts.transaction import Transaction, decode_transaction
from scorer.decide import DecisionPolicy, LatePolicy, decide_batch
from scorer.decisions import Thresholds
from simulator.transactions import TransactionSimulator
from tests.unit.fakes import FakeScorer

POLICY = DecisionPolicy(Thresholds(0.5, 0.8), decision_deadline_ms=1_000.0, late_policy="score")
HUGE_AMOUNT = 999_999.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def transactions(
    n: int, *, poison: frozenset[int] = frozenset(), event_time: int = 0
) -> list[Transaction]:
    import msgspec

    out = []
    for i, record in enumerate(TransactionSimulator(5).generate(n).records):
        record = {**record, "event_time": event_time or now_ms()}
        if i in poison:
            record["amount"] = HUGE_AMOUNT
        out.append(decode_transaction(msgspec.json.encode(record)))
    return out


def huge(features: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    return features[:, 0] > np.log1p(HUGE_AMOUNT - 1)


def test_every_record_gets_a_decision_from_its_score() -> None:
    verdicts = decide_batch(transactions(32), FakeScorer(), POLICY, now_ms())
    assert not verdicts.failed
    expected = np.where(
        verdicts.scores >= 0.8, "decline", np.where(verdicts.scores >= 0.5, "review", "approve")
    )
    assert verdicts.decisions == expected.tolist()
    assert not verdicts.degraded.any()


@pytest.mark.parametrize("poison", [frozenset({0}), frozenset({4, 31}), frozenset({39})])
def test_records_that_break_the_model_fail_alone(poison: frozenset[int]) -> None:
    scorer = FakeScorer(raises_on=huge)
    verdicts = decide_batch(transactions(40, poison=poison), scorer, POLICY, now_ms())
    assert set(verdicts.failed) == poison
    clean = [i for i in range(40) if i not in poison]
    assert np.isfinite(verdicts.scores[clean]).all()
    assert all(verdicts.decisions[i] == "" for i in poison)


def test_scores_that_are_not_probabilities_fail_their_records_without_bisection() -> None:
    scorer = FakeScorer(rule=lambda f: np.where(huge(f), np.nan, 0.5).astype(np.float32))
    verdicts = decide_batch(transactions(16, poison=frozenset({3})), scorer, POLICY, now_ms())
    assert list(verdicts.failed) == [3] and "nan" in str(verdicts.failed[3])
    assert scorer.calls == [16, 1], "one batch call, then the canary"


class Odd(NamedTuple):
    """A transaction-shaped value whose event_time no int64 column can hold."""

    amount: float
    currency: str
    mcc: int
    country: str
    channel: str
    card_present: bool
    event_time: int
    card_id: str = "card-odd"
    merchant_id: str = "merchant-odd"
    terminal_id: str | None = None
    utc_offset_minutes: int | None = None


def test_any_exception_a_record_provokes_is_isolated_like_a_poison_score() -> None:
    batch: list[Transaction | Odd] = list(transactions(9))
    batch[5] = Odd(10.0, "EUR", 5411, "DE", "pos", True, 2**63)
    verdicts = decide_batch(batch, FakeScorer(), POLICY, now_ms())
    assert list(verdicts.failed) == [5]
    assert "OverflowError" in str(verdicts.failed[5])
    assert sum(1 for label in verdicts.decisions if label) == 8


@pytest.mark.parametrize(("late_policy", "degraded"), [("score", False), ("fallback", True)])
def test_late_records_follow_the_late_policy(late_policy: LatePolicy, degraded: bool) -> None:
    policy = POLICY._replace(late_policy=late_policy)
    scorer = FakeScorer()
    hour_ago = now_ms() - 3_600_000
    verdicts = decide_batch(transactions(10, event_time=hour_ago), scorer, policy, now_ms())
    assert verdicts.late == 10
    assert verdicts.degraded.tolist() == [degraded] * 10
    assert verdicts.by_rules_late == (10 if degraded else 0)
    assert scorer.calls == ([] if degraded else [10]), "fallback rows never reach the model"


def test_a_zero_deadline_never_counts_records_late() -> None:
    policy = POLICY._replace(decision_deadline_ms=0.0)
    verdicts = decide_batch(transactions(5, event_time=1), FakeScorer(), policy, now_ms())
    assert verdicts.late == 0


def test_a_broken_model_decides_every_record_by_rules() -> None:
    verdicts = decide_batch(transactions(12), FakeScorer(broken=True), POLICY, now_ms())
    assert not verdicts.failed
    assert verdicts.degraded.all() and verdicts.by_rules_model_unavailable == 12
    assert ((verdicts.scores >= 0) & (verdicts.scores <= 1)).all()


def test_nan_for_every_row_is_a_broken_model_not_poison() -> None:
    scorer = FakeScorer(rule=lambda f: np.full(len(f), np.nan, np.float32))
    verdicts = decide_batch(transactions(8), scorer, POLICY, now_ms())
    assert not verdicts.failed and verdicts.degraded.all()


def test_history_and_terminal_columns_follow_their_records_through_isolation() -> None:
    from contracts.terminal_risk import NUM_TERMINAL_FEATURES
    from scorer.card_history import NUM_HISTORY_FEATURES
    from scorer.features import FEATURE_NAMES, NUM_TRANSACTION_FEATURES

    n = 24
    history = np.zeros((n, NUM_HISTORY_FEATURES), np.float32)
    history[:, 0] = np.arange(n) / 100.0  # each row's own marker
    terminal = np.full((n, NUM_TERMINAL_FEATURES), 0.5, np.float32)
    marker = NUM_TRANSACTION_FEATURES
    seen = FakeScorer(rule=lambda f: f[:, marker].copy(), raises_on=huge)
    verdicts = decide_batch(
        transactions(n, poison=frozenset({5, 17})),
        seen,
        POLICY,
        now_ms(),
        history=history,
        terminal=terminal,
    )
    assert set(verdicts.failed) == {5, 17}
    decided = [i for i in range(n) if i not in (5, 17)]
    assert np.allclose(verdicts.scores[decided], history[decided, 0])
    assert FEATURE_NAMES[marker] == "card_tx_1h"
