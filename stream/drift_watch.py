"""The drift of the served model: `DriftWatch` measures it and shows it as `fraud_score_psi` and
`fraud_feature_psi`.

A measurement compares the model's scores and drift features against its own package's [drift]
reference, so each model gets a fresh one: the model in use (stream/model_in_use.py) tells the
watch when another model serves, and the scoring stage (stream/scoring.py) feeds it the records
that model decided.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from scorer.drift import DriftWindow
from scorer.features import FEATURE_NAMES
from scorer.model import Scorer
from stream.metrics import ServiceMetrics


class DriftWatch:
    """The served model's drift measurement (none when its package has no [drift] reference),
    fed the records it decided; the PSI of each complete window goes to the metrics."""

    def __init__(self, scorer: Scorer, *, metrics: ServiceMetrics, window: int) -> None:
        """`window`: records per PSI (FRAUD_DRIFT_WINDOW)."""
        self._metrics = metrics
        self._window = window
        self._drift = _drift_of(scorer, window)

    def follow(self, scorer: Scorer) -> None:
        """`scorer` serves from now on: measure against its reference, from an empty window,
        and show no PSI until that window is complete."""
        self._drift = _drift_of(scorer, self._window)
        self._metrics.clear_drift()

    def observe(
        self,
        scores: npt.NDArray[np.floating[Any]],
        features: npt.NDArray[np.floating[Any]],
        by_model: npt.NDArray[np.bool_],
    ) -> None:
        """Count the records of a batch that the served model decided (`by_model`): their
        scores and feature rows (not copied out when there is no reference to count them for)."""
        if self._drift is None:
            return
        psi = self._drift.observe(scores[by_model], features[by_model])
        if psi is not None:
            self._metrics.set_drift(psi)


def _drift_of(scorer: Scorer, window: int) -> DriftWindow | None:
    """The drift measurement of a model whose package has a [drift] reference."""
    package = getattr(scorer, "package", None)
    reference = None if package is None else package.manifest.drift
    if reference is None:
        return None
    return DriftWindow(
        reference, {name: FEATURE_NAMES.index(name) for name in reference.features}, window
    )
