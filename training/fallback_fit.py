"""The fallback rules' cut-offs and weights (`scorer/fallback.py`), fitted on validation weeks.

The rules are a logistic model on a few yes/no red flags: log-odds = base + the weights of the
flags raised. For given cut-offs the weights are the maximum-likelihood fit with a small ridge
penalty (a flag that only frauds raise, as amounts above 220 are in the simulator, would
otherwise get an infinite weight). Each cut-off is chosen from a short list of round values by
the penalised likelihood, one flag at a time with the others held, twice over. The shipped
constants are this fit on seed 7's validation weeks, rounded; the model card prints the fit of
its own run beside them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scorer.fallback import CUTOFFS, Cutoffs, red_flags

#: Candidate cut-offs per flag: round values a reader can check against the data.
CANDIDATES: dict[str, tuple[float, ...]] = {
    "large_amount": (150.0, 200.0, 220.0, 250.0, 300.0, 500.0, 1000.0),
    "amount_spike": (1.5, 2.0, 2.5, 3.0, 4.0, 5.0),
    "terminal_recent_frauds": (1.0, 2.0, 3.0, 4.0, 5.0),
    "card_testing_burst": (2.0, 3.0, 4.0, 5.0),
}
#: Ridge penalty on the weights (not the base), in units of the log-likelihood.
RIDGE = 1.0
_PASSES = 2
_NEWTON_STEPS = 100
_TOLERANCE = 1e-9

_Bools = npt.NDArray[np.bool_]


class FallbackFit(NamedTuple):
    """Cut-offs, base log-odds and the log-odds each flag adds."""

    cutoffs: Cutoffs
    base_log_odds: float
    weights: dict[str, float]


def fit_fallback(features: npt.NDArray[np.float32], is_fraud: _Bools) -> FallbackFit:
    """The rules fitted on these labelled feature rows."""
    cutoffs = CUTOFFS
    for _ in range(_PASSES):
        for name, candidates in CANDIDATES.items():
            fits = {
                value: _fit_weights(
                    red_flags(features, cutoffs._replace(**{name: value})), is_fraud
                )
                for value in candidates
            }
            cutoffs = cutoffs._replace(**{name: max(fits, key=lambda value: fits[value][1])})
    (base, *weights), _ = _fit_weights(red_flags(features, cutoffs), is_fraud)
    names = list(red_flags(features[:0], cutoffs))
    return FallbackFit(cutoffs, base, dict(zip(names, weights, strict=True)))


def _fit_weights(flags: dict[str, _Bools], is_fraud: _Bools) -> tuple[list[float], float]:
    """[base, *weights] and the penalised log-likelihood, by Newton's method.

    Rows with the same flags are one pattern: the fit runs on at most 2^flags patterns with
    their row and fraud counts, not on every row.
    """
    bits = 1 << np.arange(len(flags))
    code = np.stack(list(flags.values()), axis=1) @ bits  # each row's flags as one number
    rows = np.bincount(code, minlength=1 << len(flags)).astype(np.float64)
    frauds = np.bincount(code, is_fraud, minlength=len(rows))
    seen = np.flatnonzero(rows)
    rows, frauds = rows[seen], frauds[seen]
    patterns = (seen[:, None] & bits) > 0
    design = np.hstack([np.ones((len(seen), 1)), patterns.astype(np.float64)])
    penalty = np.full(design.shape[1], RIDGE)
    penalty[0] = 0.0

    def objective(params: npt.NDArray[np.float64]) -> float:
        """The penalised log-likelihood, log(1 + e^z) written stably for any z."""
        log_odds = design @ params
        likelihood = float((frauds * log_odds - rows * np.logaddexp(0.0, log_odds)).sum())
        return likelihood - 0.5 * float((penalty * params**2).sum())

    params = np.zeros(design.shape[1])
    params[0] = np.log((frauds.sum() + 0.5) / (rows.sum() - frauds.sum() + 0.5))
    value = objective(params)
    for _ in range(_NEWTON_STEPS):
        probability = 0.5 * (1.0 + np.tanh(0.5 * (design @ params)))
        gradient = design.T @ (frauds - rows * probability) - penalty * params
        hessian = (design * (rows * probability * (1.0 - probability))[:, None]).T @ design
        step = np.linalg.solve(hessian + np.diag(penalty), gradient)
        # Newton's full step can overshoot far from the optimum: halve it until it gains.
        while (new_value := objective(params + step)) < value and np.abs(step).max() > _TOLERANCE:
            step /= 2.0
        params += step
        value = new_value
        if float(np.abs(step).max()) < _TOLERANCE:
            break
    return [float(p) for p in params], value
