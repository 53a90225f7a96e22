"""Scores → decisions: thresholds, and the decision record of the `decisions` topic."""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

APPROVE, REVIEW, DECLINE = "approve", "review", "decline"
#: Default cut-offs; the shipped model's training weighs fraud so that these fit (MODEL_CARD.md).
DEFAULT_REVIEW_THRESHOLD = 0.5
DEFAULT_DECLINE_THRESHOLD = 0.8
_LABELS = np.array([APPROVE, REVIEW, DECLINE], dtype=object)


class Thresholds(NamedTuple):
    """Score cut-offs: below `review` approve, from `review` review, from `decline` decline."""

    review: float
    decline: float


class Decision(msgspec.Struct, frozen=True, gc=False):
    """One decision as produced to the `decisions` topic (field order is the wire order)."""

    transaction_id: str
    card_id: str
    score: float
    decision: str
    model_version: str
    degraded: bool
    event_time: int
    decided_at: int


def classify(scores: npt.NDArray[np.float32], thresholds: Thresholds) -> list[str]:
    """The decision label of each score, vectorised."""
    index = (scores >= thresholds.review).astype(np.intp) + (scores >= thresholds.decline)
    labels: list[str] = _LABELS[index].tolist()
    return labels


def valid_scores(scores: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    """Which scores are probabilities (finite, within [0, 1])."""
    return np.isfinite(scores) & (scores >= 0.0) & (scores <= 1.0)


encode_decision = msgspec.json.Encoder().encode
