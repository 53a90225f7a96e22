"""Poison isolation by bisection: only the items that fail are blamed, at a logarithmic cost."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from plumbing.errors import ModelUnavailableError, ScoreError
from scorer.isolation import as_score_error, bisect_failures, check_canary, score_rows
from tests.unit.fakes import FakeScorer

POISON = -1


def doubles(items: Sequence[int]) -> list[int]:
    """The attempt: fails on any part holding the poison value."""
    if POISON in items:
        raise OverflowError("Python int too large to convert to C long")
    return [2 * i for i in items]


def model_ok() -> None:
    """A canary check that passes."""


@pytest.mark.parametrize("poison_at", [[0], [63], [5, 6], [1, 17, 40, 62], []])
def test_only_the_failing_items_are_blamed_and_the_rest_are_done(poison_at: list[int]) -> None:
    items = [POISON if i in poison_at else i for i in range(64)]

    parts, failed = bisect_failures(items, doubles, model_ok)

    assert sorted(failed) == poison_at
    done = {start + j: value for start, result in parts for j, value in enumerate(result)}
    assert done == {i: 2 * i for i in range(64) if i not in poison_at}
    assert all(isinstance(e, ScoreError) for e in failed.values())


def test_bisection_cost_grows_with_log_of_the_batch() -> None:
    calls: list[int] = []

    def counting(items: Sequence[int]) -> list[int]:
        calls.append(len(items))
        return doubles(items)

    bisect_failures([POISON if i == 700 else i for i in range(1024)], counting, model_ok)
    # one failed full call, then two halves per level (10 levels)
    assert len(calls) <= 1 + 2 * 10


def test_the_blamed_item_keeps_its_original_error_and_traceback() -> None:
    _, failed = bisect_failures([1, POISON, 3], doubles, model_ok)
    error = failed[1]
    assert "OverflowError" in str(error)
    assert isinstance(error.__cause__, OverflowError)
    assert error.__traceback__ is not None


def test_a_score_error_is_kept_as_it_is() -> None:
    original = ScoreError("Gather: index out of bounds")
    assert as_score_error(original) is original


def test_a_broken_model_blames_no_item() -> None:
    def broken_model() -> None:
        raise ModelUnavailableError("the model fails on a known-good row")

    with pytest.raises(ModelUnavailableError):
        bisect_failures([1, POISON, 3], doubles, broken_model)


def test_the_canary_tells_a_broken_model_from_a_bad_record() -> None:
    check_canary(FakeScorer())
    with pytest.raises(ModelUnavailableError):
        check_canary(FakeScorer(broken=True))
    with pytest.raises(ModelUnavailableError):
        check_canary(FakeScorer(rule=lambda f: np.full(len(f), np.nan, np.float32)))


def test_score_rows_reports_each_row_the_model_fails_and_why() -> None:
    """The one function the sanity check (all rows) and the canary (most rows) both judge by."""
    rows = np.zeros((6, 4), np.float32)
    rows[[1, 4], 0] = 5.0  # the rows a call raises for
    rows[2, 0] = -1.0  # scored NaN
    raising = FakeScorer(
        rule=lambda f: np.where(f[:, 0] < 0, np.nan, 0.5).astype(np.float32),
        raises_on=lambda f: f[:, 0] > 1,
    )
    scored = score_rows(raising, rows)
    assert scored.failed.tolist() == [False, True, True, False, True, False]
    assert scored.failures == 3 and "index out of bounds" in scored.why
    assert isinstance(scored.cause, ScoreError)

    nan_only = score_rows(FakeScorer(rule=raising._rule), rows)
    assert nan_only.failed.tolist() == [False, False, True, False, False, False]
    assert "nan, not a probability" in nan_only.why and nan_only.cause is None

    short = score_rows(FakeScorer(rule=lambda f: np.zeros(1, np.float32)), rows)
    assert short.failed.all() and "one score per row" in short.why
    assert not score_rows(FakeScorer(), np.abs(rows)).failed.any()
