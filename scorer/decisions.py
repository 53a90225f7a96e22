"""Scores → decisions: the thresholds and what a valid score is."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.decision import APPROVE, DECLINE, REVIEW

#: Cut-offs for a package that was given none of its own (made in code, or `fraud-model import`
#: without --review/--decline); the shipped package states its own in model.toml, chosen on its
#: validation weeks (MODEL_CARD.md).
DEFAULT_REVIEW_THRESHOLD = 0.5
DEFAULT_DECLINE_THRESHOLD = 0.8
_DECISIONS = np.array([APPROVE, REVIEW, DECLINE], dtype=object)


class Thresholds(NamedTuple):
    """Score cut-offs: below `review` approve, from `review` review, from `decline` decline."""

    review: float
    decline: float


def classify(scores: npt.NDArray[np.float32], thresholds: Thresholds) -> list[str]:
    """The decision of each score, vectorised."""
    index = (scores >= thresholds.review).astype(np.intp) + (scores >= thresholds.decline)
    decisions: list[str] = _DECISIONS[index].tolist()
    return decisions


def valid_scores(scores: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    """Which scores are probabilities (finite, within [0, 1])."""
    return np.isfinite(scores) & (scores >= 0.0) & (scores <= 1.0)


#: What packages made in code (tests, benchmarks) state.
DEFAULT_THRESHOLDS = Thresholds(DEFAULT_REVIEW_THRESHOLD, DEFAULT_DECLINE_THRESHOLD)
