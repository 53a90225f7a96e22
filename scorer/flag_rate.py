"""The flag rate a model package expects: the share of decisions at review or decline that its
thresholds gave on the data it was validated on, as a range live traffic should stay within.

A model put on traffic it does not fit (another country mix, other amounts, a broken field)
can flag several times the share its thresholds were chosen for, or almost nothing, while its
scores look fine to a PSI that follows only the score's shape. The manifest's
`[thresholds] expected_flag_rate = [low, high]` states the range, the service exports it
(`fraud_model_expected_flag_ratio`), and `FraudFlagRateUnexpected` compares the live share with
it. The range is the validation days' lowest and highest daily share, divided and multiplied by
FLAG_RATE_MARGIN: days differ, and a margin that tight days never leave would fire on a busy
Saturday.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scorer.decisions import Thresholds
from scorer.model_package import ModelPackage

#: The daily range seen on validation, widened this many times each way.
FLAG_RATE_MARGIN = 2.0
#: Days with fewer rows do not bound the range (their share is mostly noise).
MIN_DAY_ROWS = 1_000


def expected_flag_rate(
    scores: npt.NDArray[np.floating], day: npt.NDArray[np.integer], review: float
) -> list[float]:
    """[low, high]: the lowest and highest daily share of `scores` at or above `review` (the
    flagged: review or decline), over the days of `day` with MIN_DAY_ROWS rows or more (all rows
    as one day when none has), widened by FLAG_RATE_MARGIN and kept within [0, 1]."""
    scores = np.asarray(scores, np.float64)
    day = np.asarray(day)
    if len(scores) != len(day) or not len(scores):
        raise ValueError(f"need one day per score, and scores: {len(scores)} and {len(day)}")
    days, inverse, rows = np.unique(day, return_inverse=True, return_counts=True)
    flagged = np.bincount(inverse, weights=scores >= review, minlength=len(days))
    full = rows >= MIN_DAY_ROWS
    shares = flagged[full] / rows[full] if full.any() else [float(flagged.sum()) / len(scores)]
    low, high = float(np.min(shares)), float(np.max(shares))
    return [round(low / FLAG_RATE_MARGIN, 6), round(min(1.0, high * FLAG_RATE_MARGIN), 6)]


def range_in_use(
    package: ModelPackage | None, thresholds: Thresholds
) -> tuple[float, float] | None:
    """The range `package` states, when `thresholds` (those in use) are its own: the flag rate of
    thresholds set by FRAUD_REVIEW_THRESHOLD or FRAUD_DECLINE_THRESHOLD was never measured.
    None: no package, none stated, or overridden."""
    if package is None or thresholds != package.thresholds:
        return None
    stated = package.manifest.thresholds.expected_flag_rate
    return (stated[0], stated[1]) if stated else None
