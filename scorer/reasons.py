"""Reason codes: why the model flagged a transaction, for the flagged rows of a batch only.

The method is occlusion against a reference row, by reason group: features that say the same
thing (a card's four velocity windows, a terminal's risk, count and frauds over one window, the
one-hot channel) move together (`REASON_GROUPS` in `scorer/catalogue.py`; every other feature is
a group of its own). For a flagged row x and each group g, x with g's features set to the
reference row's values is scored; the contribution of g is score(x) - score(x with g at its
reference), 0 where g's features already are the reference values. The rows of every flagged
transaction go to the model in one extra batched call of at most (flagged rows x groups) rows,
so the cost grows with what is flagged, not with the batch, and runs wherever the model runs
(the GPU where there is one). The reasons are the `top` groups with the largest contributions,
each named by its first feature away from the reference, in words from the feature catalogue.

The reference row is the package's (`model.toml` `reference`; the shipped model's is the median
of its training week's legitimate rows): a reason says how this transaction differs from a
typical legitimate one. Limits (docs/reasons.md): one group is moved at a time, so two groups
that only matter together (an interaction) each get part of the credit, or none; and the
contributions need not add up to the score, as TreeSHAP's do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from contracts.decision import Reason
from scorer.catalogue import CATALOGUE, REASON_GROUPS
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
        self._groups = _reason_groups(self._columns)
        #: [groups, columns]: which of the model's inputs each reason group moves.
        self._members = np.zeros((len(self._groups), len(self._columns)), np.bool_)
        for g, members in enumerate(self._groups):
            self._members[g, members] = True
        self._top = min(top, len(self._groups))

    def explain(
        self, features: npt.NDArray[np.float32], scores: npt.NDArray[np.float32]
    ) -> list[tuple[Reason, ...]]:
        """The top reasons of each row of `features` [k, NUM_FEATURES] scored `scores` [k].

        Raises what the model raises (the caller decides without reasons then)."""
        k = len(features)
        if k == 0:
            return []
        inputs = features[:, self._columns]
        # Only the groups with a feature away from the reference are scored again: the others
        # contribute exactly 0 (most flags and one-hot columns sit at their reference).
        moved = inputs != self._reference
        row, group = np.nonzero(moved.astype(np.uint8) @ self._members.T.astype(np.uint8))
        occluded = features[row]
        occluded[:, self._columns] = np.where(self._members[group], self._reference, inputs[row])
        contribution = np.zeros((k, len(self._groups)), np.float64)
        if len(row):
            without = self._scorer.score(occluded)
            contribution[row, group] = scores[row].astype(np.float64) - without
        order = np.argsort(-contribution, axis=1, kind="stable")[:, : self._top]
        return [self._reasons(features[i], moved[i], contribution[i], order[i]) for i in range(k)]

    def _reasons(
        self,
        row: npt.NDArray[np.float32],
        moved: npt.NDArray[np.bool_],
        contribution: npt.NDArray[np.float64],
        order: npt.NDArray[np.intp],
    ) -> tuple[Reason, ...]:
        values = _Row(row.tolist())
        reasons = []
        for g in order.tolist():
            members = self._groups[g]
            lead = next((j for j in members if moved[j]), members[0])
            feature = CATALOGUE[int(self._columns[lead])]
            reasons.append(
                Reason(
                    feature=feature.name,
                    text=feature.text(values),
                    contribution=round(float(contribution[g]), 6),
                )
            )
        return tuple(reasons)


def _reason_groups(columns: npt.NDArray[np.intp]) -> list[npt.NDArray[np.intp]]:
    """The model's inputs (positions in `columns`) by reason group, each in the order its
    reason names them by (`REASON_GROUPS`)."""
    position = {CATALOGUE[int(c)].name: j for j, c in enumerate(columns)}
    groups: dict[str, list[int]] = {}
    for j, c in enumerate(columns):
        groups.setdefault(CATALOGUE[int(c)].reason, []).append(j)
    ordered = []
    for reason, members in groups.items():
        preferred = [position[n] for n in REASON_GROUPS.get(reason, ()) if n in position]
        ordered.append(np.array(preferred or members, np.intp))
    return ordered


class _Row(Mapping[str, float]):
    """A catalogue row read by feature name, without building a dict per row."""

    __slots__ = ("_values",)

    def __init__(self, values: list[float]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> float:
        return self._values[_INDEX[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(_INDEX)

    def __len__(self) -> int:
        return len(_INDEX)


_INDEX = {feature.name: i for i, feature in enumerate(CATALOGUE)}
