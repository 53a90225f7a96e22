"""Poison isolation by bisection, with a scorer that breaks on marked rows."""

from __future__ import annotations

import numpy as np
import pytest

from scorer.features import NUM_FEATURES
from scorer.isolation import score_isolating_poison
from stream.errors import ModelUnavailableError
from tests.unit.fakes import FakeScorer

POISON = 666.0


def batch(size: int, poison_rows: list[int]) -> np.ndarray:
    features = np.tile(np.arange(size, dtype=np.float32)[:, None], (1, NUM_FEATURES)) / size
    features[poison_rows, 1] = POISON
    return features


def breaks_on_marker(features: np.ndarray) -> np.ndarray:
    return features[:, 1] == POISON


@pytest.mark.parametrize("poison_rows", [[0], [63], [5, 6], [1, 17, 40, 62], []])
def test_only_the_poison_rows_are_blamed_and_their_mates_keep_their_scores(poison_rows):
    scorer = FakeScorer(raises_on=breaks_on_marker)
    features = batch(64, poison_rows)

    scores, poison = score_isolating_poison(scorer, features)

    assert sorted(poison) == poison_rows
    clean = np.setdiff1d(np.arange(64), poison_rows)
    expected = FakeScorer().score(features[clean])
    assert np.array_equal(scores[clean], expected)
    assert np.isnan(scores[poison_rows]).all()


def test_bisection_cost_grows_with_log_of_the_batch():
    scorer = FakeScorer(raises_on=breaks_on_marker)
    score_isolating_poison(scorer, batch(1024, [700]))
    # one failed full call, two halves per level (10 levels), one canary
    assert len(scorer.calls) <= 2 * 10 + 2


def test_scores_that_are_not_probabilities_are_poison_without_bisection():
    scorer = FakeScorer(rule=lambda f: np.where(f[:, 1] == POISON, np.nan, 0.5).astype(np.float32))
    scores, poison = score_isolating_poison(scorer, batch(16, [3]))
    assert list(poison) == [3] and "nan" in str(poison[3])
    assert (scores[np.arange(16) != 3] == 0.5).all()


def test_out_of_range_scores_are_poison():
    scorer = FakeScorer(rule=lambda f: np.where(f[:, 1] == POISON, 1.5, 0.1).astype(np.float32))
    _, poison = score_isolating_poison(scorer, batch(8, [7]))
    assert list(poison) == [7]


def test_a_model_broken_for_every_input_blames_no_record():
    with pytest.raises(ModelUnavailableError):
        score_isolating_poison(FakeScorer(broken=True), batch(8, []))


def test_nan_everywhere_is_a_broken_model_not_poison():
    scorer = FakeScorer(rule=lambda f: np.full(len(f), np.nan, np.float32))
    with pytest.raises(ModelUnavailableError):
        score_isolating_poison(scorer, batch(8, []))
