"""Reason codes: why the model flagged a transaction, for the flagged rows of a batch only.

The method is occlusion against a reference row. For a flagged row x and each feature j the
model reads, x with feature j set to the reference row's value is scored; the contribution of j
is score(x) - score(x with j at its reference), 0 where x_j already is the reference value. The
rows of every flagged transaction go to the model in one extra batched call of at most (flagged
rows x features read) rows, so the cost grows with what is flagged, not with the batch, and
runs wherever the model runs (the GPU where there is one). The reasons are the `top` features
with the largest contributions, each named in words by the feature catalogue
(`scorer/catalogue.py`).

The reference row is the package's (`model.toml` `reference`; the shipped model's is the median
of its training week's legitimate rows): a reason says how this transaction differs from a
typical legitimate one. Limits (docs/reasons.md): one feature is moved at a time, so two
features that only matter together (an interaction) each get part of the credit, or none; and
the contributions need not add up to the score, as TreeSHAP's do.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contracts.decision import Reason
from scorer.catalogue import CATALOGUE
from scorer.model import Scorer

#: Reasons per flagged decision.
TOP_REASONS = 3


class Explainer:
    """Reason codes for flagged rows, from one extra model call per batch."""

    def __init__(
        self,
        scorer: Scorer,
        columns: npt.NDArray[np.intp],
        reference: npt.NDArray[np.float32],
        top: int = TOP_REASONS,
    ) -> None:
        """`columns`: the catalogue columns the model reads; `reference`: the reference row in
        that order."""
        if len(columns) != len(reference):
            raise ValueError(f"{len(reference)} reference values for {len(columns)} columns")
        self._scorer = scorer
        self._columns = np.asarray(columns, np.intp)
        self._reference = np.asarray(reference, np.float32)
        self._top = min(top, len(columns))

    def explain(
        self, features: npt.NDArray[np.float32], scores: npt.NDArray[np.float32]
    ) -> list[tuple[Reason, ...]]:
        """The top reasons of each row of `features` [k, NUM_FEATURES] scored `scores` [k].

        Raises what the model raises (the caller decides without reasons then)."""
        k, width = len(features), len(self._columns)
        if k == 0:
            return []
        # Only the features that differ from the reference are scored again: the others
        # contribute exactly 0 (most flags and one-hot columns sit at their reference).
        moved = features[:, self._columns] != self._reference
        row, column = np.nonzero(moved)
        occluded = features[row]
        occluded[np.arange(len(row)), self._columns[column]] = self._reference[column]
        contribution = np.zeros((k, width), np.float64)
        if len(row):
            without = self._scorer.score(occluded)
            contribution[row, column] = scores[row].astype(np.float64) - without
        order = np.argsort(-contribution, axis=1, kind="stable")
        return [self._reasons(features[i], contribution[i], order[i]) for i in range(k)]

    def _reasons(
        self,
        row: npt.NDArray[np.float32],
        contribution: npt.NDArray[np.float64],
        order: npt.NDArray[np.intp],
    ) -> tuple[Reason, ...]:
        values = dict(zip(_NAMES, row.tolist(), strict=True))
        reasons: list[Reason] = []
        said: set[str] = set()
        for j in order.tolist():
            feature = CATALOGUE[int(self._columns[j])]
            label = feature.label(values)
            if label in said:  # hour_sin and hour_cos say the same thing
                continue
            said.add(label)
            reasons.append(Reason(feature.name, label, round(float(contribution[j]), 6)))
            if len(reasons) == self._top:
                break
        return tuple(reasons)


_NAMES = tuple(feature.name for feature in CATALOGUE)
