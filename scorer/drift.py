"""Drift: how far live traffic has moved from the data a model was validated on, as a population
stability index (PSI) of its score and of its most used features.

A package's manifest may carry a drift reference (`model.toml` `[drift]`): for the score and
each of a few features, the edges of the reference data's deciles and the share of rows in each
bin. `DriftWindow` counts live values into the same bins and, every `window` rows, gives each
one's PSI over that window:

    PSI = sum over bins of (live share - reference share) * ln(live share / reference share)

with shares floored at 1e-4, so an empty bin counts without dividing by zero. The usual reading:
below 0.1 no shift, 0.1 to 0.25 a moderate one, above 0.25 a shift worth a look (the alert's
threshold).

A value that holds a large share of the reference (0 for a count that is mostly 0) gets a bin
of its own, from it to the next float32 above it: with deciles alone its edges coincide, its rows
share a bin with the values above it, and a count whose non-zero share goes from 5 % to 50 %
keeps a PSI of 0. The other values are split at their own deciles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

#: Bins of a reference histogram (deciles).
REFERENCE_BINS = 10
#: A value holding at least this share of the reference rows gets a bin of its own.
ATOM_SHARE = 1 / REFERENCE_BINS
#: Features a reference follows besides the score (those the model splits on most).
DRIFT_FEATURES = 5
#: No share is taken below this (an empty bin would make PSI infinite).
MIN_SHARE = 1e-4
#: Live rows per PSI: a window long enough that sampling noise stays well under 0.1.
DEFAULT_WINDOW = 10_000
#: Rows the most influential features are measured on.
INFLUENCE_ROWS = 20_000


class Histogram(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Inner bin edges, increasing, and the reference share of each of the len(edges) + 1 bins
    (a value equal to an edge falls in the bin above it)."""

    edges: list[float]
    shares: list[float]


class DriftReference(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[drift]` of a manifest: what the live score and features are compared with."""

    #: What the reference data was, in words.
    data: str
    score: Histogram
    #: By feature name (a name from the manifest's features).
    features: dict[str, Histogram] = msgspec.field(default_factory=dict)


def histogram(values: npt.NDArray[np.floating]) -> Histogram:
    """The reference histogram of `values`: a bin for each value holding ATOM_SHARE or more of
    them, and the deciles of the rest."""
    values = np.asarray(values, np.float32).astype(np.float64)
    if not len(values):
        raise ValueError("a reference histogram needs values")
    distinct, counts = np.unique(values, return_counts=True)
    atoms = distinct[counts >= ATOM_SHARE * len(values)].astype(np.float32)
    rest = values[~np.isin(values, atoms)]
    quantiles = (
        np.quantile(rest, np.arange(1, REFERENCE_BINS) / REFERENCE_BINS) if len(rest) else []
    )
    # Decile edges are rounded for a readable manifest; an atom's two edges are exact, so that
    # the atom's bin holds its value and nothing else.
    deciles = np.round(np.asarray(quantiles, np.float32), 7).astype(np.float64)
    above = np.nextafter(atoms, np.float32(np.inf))
    edges = np.unique(np.concatenate([deciles, atoms, above]).astype(np.float64))
    counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
    return Histogram([float(e) for e in edges], [round(float(c), 6) for c in counts / len(values)])


def drift_reference(
    data: str,
    scores: npt.NDArray[np.floating],
    features: npt.NDArray[np.floating],
    names: Sequence[str],
    followed: Sequence[str],
) -> DriftReference:
    """The reference of scores and rows (`features` columns named by `names`), following the
    features `followed`."""
    column = {name: i for i, name in enumerate(names)}
    return DriftReference(
        data,
        histogram(scores),
        {name: histogram(features[:, column[name]]) for name in followed},
    )


def most_influential(
    score: Callable[[npt.NDArray[np.float32]], npt.NDArray[np.floating]],
    rows: npt.NDArray[np.float32],
    names: Sequence[str],
    count: int = DRIFT_FEATURES,
    seed: int = 0,
) -> list[str]:
    """The `count` features whose shuffling moves the scores most (mean absolute change over
    at most INFLUENCE_ROWS rows): what the model uses, measured without labels, so it works
    for any graph. `rows`: columns named by `names`, as `score` reads them."""
    rng = np.random.default_rng(seed)
    sample = rows[rng.permutation(len(rows))[:INFLUENCE_ROWS]]
    base = np.asarray(score(sample), np.float64)
    influence = []
    for column in range(sample.shape[1]):
        shuffled = sample.copy()
        shuffled[:, column] = rng.permutation(shuffled[:, column])
        influence.append(float(np.mean(np.abs(np.asarray(score(shuffled), np.float64) - base))))
    order = np.argsort(influence, kind="stable")[::-1][:count]
    return [names[i] for i in order if influence[i] > 0]


def psi(reference: Histogram, counts: npt.NDArray[np.int64]) -> float:
    """The PSI of live bin `counts` against `reference`."""
    expected = np.maximum(np.asarray(reference.shares, np.float64), MIN_SHARE)
    live = np.maximum(counts / max(int(counts.sum()), 1), MIN_SHARE)
    return float(np.sum((live - expected) * np.log(live / expected)))


class DriftWindow:
    """Counts live scores and feature values into a reference's bins; a PSI per window."""

    def __init__(
        self,
        reference: DriftReference,
        feature_index: dict[str, int],
        window: int = DEFAULT_WINDOW,
    ) -> None:
        """`feature_index`: each followed feature's column in the rows `observe` gets."""
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._reference = reference
        self._window = window
        self._score_edges = np.asarray(reference.score.edges, np.float64)
        self._features = [
            (name, feature_index[name], np.asarray(h.edges, np.float64), h)
            for name, h in reference.features.items()
        ]
        self._score_counts = np.zeros(len(self._score_edges) + 1, np.int64)
        self._feature_counts = [
            np.zeros(len(edges) + 1, np.int64) for _, _, edges, _ in self._features
        ]
        self._rows = 0

    def observe(
        self, scores: npt.NDArray[np.floating], rows: npt.NDArray[np.floating]
    ) -> dict[str, float] | None:
        """Count one batch (scores and their feature rows); at the end of a window, the PSI of
        the score (key "score") and of each followed feature, and the counts start again."""
        self._score_counts += _binned(self._score_edges, scores, len(self._score_counts))
        for counts, (_, column, edges, _) in zip(self._feature_counts, self._features, strict=True):
            counts += _binned(edges, rows[:, column], len(counts))
        self._rows += len(scores)
        if self._rows < self._window:
            return None
        result = {"score": psi(self._reference.score, self._score_counts)}
        for counts, (name, _, _, reference) in zip(
            self._feature_counts, self._features, strict=True
        ):
            result[name] = psi(reference, counts)
            counts[:] = 0
        self._score_counts[:] = 0
        self._rows = 0
        return result


def _binned(
    edges: npt.NDArray[np.float64], values: npt.NDArray[np.floating], bins: int
) -> npt.NDArray[np.int64]:
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=bins)
