"""Calibration: the model's log-odds mapped to a fraud probability, and how well that holds.

Platt scaling (Platt, 1999): p = sigmoid(a·z + b) on the model's log-odds z, with a and b fitted
by maximum likelihood on rows the model was not trained on (the validation weeks). Two numbers,
strictly increasing in z when a > 0, so rankings (ROC-AUC, average precision, Card
Precision@100) do not change, and it bakes into the exported graph for free: the trees' leaves
(or the MLP's last layer) are multiplied by a and b is added, so the graph still ends in the
same Sigmoid and runs on the same CUDA kernels. Isotonic regression would fit any monotone
shape but turns the score into a step function: ties between rows that the trees ranked apart,
which costs ranking quality, and extra operators in the graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

_Floats = npt.NDArray[np.float64]
_Bools = npt.NDArray[np.bool_]

#: Newton's method on two parameters converges in a handful of steps; this bounds a bad start.
_MAX_NEWTON_STEPS = 50
_TOLERANCE = 1e-10
#: Score bins of the reliability table: finer at the low end, where nearly every row falls.
RELIABILITY_EDGES: tuple[float, ...] = (0.0, 0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.0)


class Platt(NamedTuple):
    """p = sigmoid(a·z + b) on the model's log-odds z."""

    a: float
    b: float

    def apply(self, logits: _Floats) -> _Floats:
        """The calibrated probabilities of these log-odds."""
        return sigmoid(self.a * logits + self.b)


def sigmoid(x: _Floats) -> _Floats:
    """1 / (1 + e^-x), written through tanh, which cannot overflow for large |x|."""
    result: _Floats = 0.5 * (1.0 + np.tanh(0.5 * x))
    return result


def fit_platt(logits: _Floats, is_fraud: _Bools) -> Platt:
    """The maximum-likelihood (a, b) of these held-out log-odds and outcomes.

    Raises ValueError unless both classes are present (the fit would run off to infinity).
    """
    positives = int(is_fraud.sum())
    if positives == 0 or positives == len(is_fraud):
        raise ValueError(
            f"Platt scaling needs frauds and legitimate rows, got {positives} of {len(is_fraud)}"
        )
    design = np.stack([logits.astype(np.float64), np.ones(len(logits))], axis=1)
    target = is_fraud.astype(np.float64)
    params = np.array([1.0, 0.0])
    loss = _log_loss(design @ params, target)
    for _ in range(_MAX_NEWTON_STEPS):
        probability = sigmoid(design @ params)
        gradient = design.T @ (probability - target)
        weight = probability * (1.0 - probability)
        hessian = (design * weight[:, None]).T @ design
        step = np.linalg.solve(hessian, gradient)
        # Newton's full step can overshoot far from the optimum: halve it until the loss drops.
        while (new_loss := _log_loss(design @ (params - step), target)) > loss:
            step /= 2.0
        params -= step
        loss = new_loss
        if float(np.abs(step).max()) < _TOLERANCE:
            break
    return Platt(float(params[0]), float(params[1]))


def _log_loss(log_odds: _Floats, target: _Floats) -> float:
    # log(1 + e^z) - y z: the negative log-likelihood, stable for any z.
    return float((np.logaddexp(0.0, log_odds) - target * log_odds).sum())


class Bin(NamedTuple):
    """One row of a reliability table."""

    low: float
    high: float
    rows: int
    frauds: int
    mean_score: float
    fraud_rate: float


def reliability(
    scores: npt.NDArray[np.floating], is_fraud: _Bools, edges: Sequence[float] = RELIABILITY_EDGES
) -> list[Bin]:
    """Rows, frauds, mean score and observed fraud rate per score bin [low, high); the last bin
    includes 1.0."""
    which = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, len(edges) - 2)
    bins = []
    for k in range(len(edges) - 1):
        rows = which == k
        count = int(rows.sum())
        frauds = int(is_fraud[rows].sum())
        bins.append(
            Bin(
                edges[k],
                edges[k + 1],
                count,
                frauds,
                float(scores[rows].mean()) if count else math.nan,
                frauds / count if count else math.nan,
            )
        )
    return bins
