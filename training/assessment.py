"""How a model's scores of an assessed week become figures: the protocol's metrics on the
handbook-comparable rows and on all rows, and what a threshold flags, scenario by scenario.

The handbook's recipe is fitted and scored here too, on the same rows as the candidates, since
it is only ever a baseline to assess against.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from simulator.fraud import DEFAULT_SCENARIOS
from simulator.replay import Stream
from training import handbook_recipe
from training.fold_data import training_targets
from training.protocol import Metrics, protocol_metrics
from training.results import AtReview, FoldResult, Outcomes
from training.thresholds import Chosen, flagged_shares

#: Test rows of this scenario are left out of the handbook-comparable figures.
NOT_IN_HANDBOOK = "card_testing"

_Ints = npt.NDArray[np.int64]


def fold_result(
    stream: Stream, start: int, rows: _Ints, scores: npt.NDArray[np.floating]
) -> FoldResult:
    """One model's figures on an assessed week: handbook-comparable rows, then all rows."""
    in_handbook = stream.scenario[rows] != NOT_IN_HANDBOOK
    return FoldResult(
        start,
        _metrics(stream, rows[in_handbook], scores[in_handbook]),
        _metrics(stream, rows, scores),
    )


def _metrics(stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating]) -> Metrics:
    return protocol_metrics(stream.day[rows], stream.card[rows], stream.is_fraud[rows], scores)


def handbook_recipe_fold(
    stream: Stream, start: int, train: _Ints, assessed: _Ints
) -> tuple[FoldResult, npt.NDArray[np.floating]]:
    """The handbook's recipe trained on `train`: its figures on `assessed`, and its scores."""
    model = handbook_recipe.fit(stream.features[train], training_targets(stream, start, train))
    scores = handbook_recipe.scores(model, stream.features[assessed])
    return fold_result(stream, start, assessed, scores), scores


def at_review(
    stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating], review: float
) -> AtReview:
    """What a review threshold flags on these rows."""
    flagged = scores >= review
    is_fraud = stream.is_fraud[rows]
    return AtReview(review, float(flagged[is_fraud].mean()), float(flagged[~is_fraud].mean()))


def outcomes(
    stream: Stream, rows: _Ints, scores: npt.NDArray[np.floating], chosen: Chosen
) -> Outcomes:
    """Per scenario, the shares of these rows at or above review and decline."""
    scenario = stream.scenario[rows]
    return {name: flagged_shares(scores[scenario == name], chosen) for name in DEFAULT_SCENARIOS}
