"""Decision thresholds from stated goals, measured on the validation weeks' calibrated scores.

- review: the review team's capacity. The lowest threshold at which at most
  `REVIEW_LEGIT_SHARE` of the validation weeks' legitimate transactions reach review (or
  decline).
- decline: cost. Declining a legitimate transaction costs `FALSE_DECLINE_COST`; a fraud that is
  not declined costs its amount (review is treated as a capacity, not as a catch: a reviewed
  fraud counts as lost, the cautious side). Per transaction that rule declines when
  p * amount > (1 - p) * cost, a cut that moves with the amount; one threshold cannot say that
  (and `FRAUD_RULES` expressions cannot read the score), so the decline threshold is the one, at
  or above review, with the lowest total cost over the validation weeks.

Thresholds are multiples of `STEP`, so the manifest holds readable numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

#: The review team's capacity: at most this share of legitimate transactions reaches review.
REVIEW_LEGIT_SHARE = 0.01
#: The assumed cost of declining a legitimate transaction, in the amounts' currency: the lost
#: margin, a support contact, a customer who may leave. An assumption, not a measurement: a team
#: with its own figure gets its own threshold (MODEL_CARD.md, "Thresholds").
FALSE_DECLINE_COST = 25.0
#: Other false-decline costs the model card shows the decline threshold for.
OTHER_FALSE_DECLINE_COSTS: tuple[float, ...] = (10.0, 50.0, 100.0)
STEP = 1e-4
#: Every candidate threshold, rounded as the manifest writes it.
_GRID = np.round(np.arange(1, round(1 / STEP)) * STEP, 4)

_Floats = npt.NDArray[np.floating]
_Bools = npt.NDArray[np.bool_]


class Chosen(NamedTuple):
    """The two cut-offs: from `review` a transaction is reviewed, from `decline` declined."""

    review: float
    decline: float


def review_threshold(legit_scores: _Floats, share: float = REVIEW_LEGIT_SHARE) -> float:
    """The lowest threshold at which at most `share` of these legitimate rows score at or
    above it."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be between 0 and 1, got {share}")
    if len(legit_scores) == 0:
        raise ValueError("no legitimate rows to choose the review threshold on")
    ordered = np.sort(legit_scores)
    at_or_above = len(ordered) - np.searchsorted(ordered, _GRID, side="left")
    within = np.flatnonzero(at_or_above <= share * len(ordered))
    return float(_GRID[within[0]] if len(within) else _GRID[-1])


def decline_threshold(
    scores: _Floats,
    is_fraud: _Bools,
    amount: _Floats,
    false_decline_cost: float = FALSE_DECLINE_COST,
    floor: float = 0.0,
) -> float:
    """The threshold at or above `floor` with the lowest cost on these rows: each legitimate row
    at or above it costs `false_decline_cost`, each fraud below it costs its amount."""
    if false_decline_cost <= 0.0:
        raise ValueError(f"false_decline_cost must be > 0, got {false_decline_cost}")
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    legit_below = np.concatenate(([0], np.cumsum(~is_fraud[order])))
    fraud_amount_below = np.concatenate(([0.0], np.cumsum(np.where(is_fraud, amount, 0.0)[order])))
    grid = _GRID[np.searchsorted(_GRID, floor - STEP / 2) :]
    below = np.searchsorted(ordered, grid, side="left")
    legit_declined = legit_below[-1] - legit_below[below]
    cost = false_decline_cost * legit_declined + fraud_amount_below[below]
    return float(grid[int(np.argmin(cost))])


def flagged_shares(scores: _Floats, chosen: Chosen) -> tuple[float, float]:
    """The shares of these rows at or above review, and at or above decline (NaN if none)."""
    if len(scores) == 0:
        return (float("nan"), float("nan"))
    return (float((scores >= chosen.review).mean()), float((scores >= chosen.decline).mean()))
