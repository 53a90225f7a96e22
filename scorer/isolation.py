"""Poison isolation: when a batch breaks the model, find the records to blame by bisection.

A batch whose model call raises is split in halves, recursively, until the failing records are
single rows; their batch-mates keep their scores. A row whose score is not a probability (NaN,
infinite, outside [0, 1]) is to blame by itself. Before a lone row is blamed, a known-good
canary row is scored: if the canary fails too, the model is broken for every input and no
record is at fault (`ModelUnavailableError`). Cost: about 2·k·log2(B) extra calls for k poison
rows in a batch of B, and nothing at all while the model behaves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scorer.decisions import valid_scores
from scorer.features import NUM_FEATURES
from scorer.model import Scorer
from stream.errors import ModelUnavailableError, ScoreError

#: An all-zero row: every feature at a value the training data contains.
_CANARY = np.zeros((1, NUM_FEATURES), np.float32)


def score_isolating_poison(
    scorer: Scorer, features: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.float32], dict[int, ScoreError]]:
    """Score every row; return the scores and, per poison row index, why it failed.

    Scores of poison rows are NaN. Raises ModelUnavailableError when even the canary fails.
    """
    scores = np.full(len(features), np.nan, np.float32)
    poison: dict[int, ScoreError] = {}
    _score_range(scorer, features, 0, len(features), scores, poison)
    return scores, poison


def _score_range(
    scorer: Scorer,
    features: npt.NDArray[np.float32],
    start: int,
    stop: int,
    scores: npt.NDArray[np.float32],
    poison: dict[int, ScoreError],
) -> None:
    try:
        part = scorer.score(features[start:stop])
        if len(part) != stop - start:
            raise ScoreError(f"model returned {len(part)} scores for {stop - start} rows")
    except ScoreError as exc:
        if stop - start == 1:
            _blame(scorer, start, exc, poison)
            return
        middle = (start + stop) // 2
        _score_range(scorer, features, start, middle, scores, poison)
        _score_range(scorer, features, middle, stop, scores, poison)
        return
    scores[start:stop] = part
    invalid = np.flatnonzero(~valid_scores(part))
    if len(invalid):
        _check_canary(scorer, ScoreError(f"model returned score {float(part[invalid[0]])!r}"))
    for row in invalid:
        poison[start + int(row)] = ScoreError(f"model returned score {float(part[row])!r}")
        scores[start + row] = np.nan


def _blame(scorer: Scorer, row: int, error: ScoreError, poison: dict[int, ScoreError]) -> None:
    _check_canary(scorer, error)
    poison[row] = error


def _check_canary(scorer: Scorer, error: ScoreError) -> None:
    """Raise ModelUnavailableError unless the model scores the canary row properly."""
    try:
        canary = scorer.score(_CANARY)
    except ScoreError as canary_error:
        raise ModelUnavailableError(
            f"the model fails on a known-good row: {canary_error}"
        ) from error
    if not valid_scores(canary).all():
        raise ModelUnavailableError(f"the model scores a known-good row {canary!r}") from error
