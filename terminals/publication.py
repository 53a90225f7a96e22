"""The records a publication round sends: a terminal's features and daily buckets
(`terminal-risk`), a card's confirmed frauds by day (`card-frauds`), or a tombstone.

Why a round at a time: `window_features` is vectorised over terminals, and called for one it
spends its time in numpy's per-call set-up, which made the features the largest part of a
round (docs/benchmarks.md, "A round's features at once"). One call per round computes them for
every terminal it publishes, with the same arithmetic row by row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from contracts.card_frauds import encode_card_frauds
from contracts.terminal_risk import encode_terminal_risk
from scorer.terminal_risk import window_features
from terminals.state import Publication


def encode_publications(
    publications: Sequence[tuple[str, Publication]], *, card: bool
) -> list[bytes | None]:
    """Each (key, publication)'s record value, in order: None for a tombstone. `card`: the
    entries are cards (their frauds by day), not terminals."""
    values: list[bytes | None] = [None] * len(publications)
    live = [
        (i, key, publication.as_of_day, publication.buckets)
        for i, (key, publication) in enumerate(publications)
        if publication.buckets is not None
    ]
    if card:
        for i, key, as_of_day, (days, counts) in live:
            values[i] = encode_card_frauds(key, as_of_day, days, counts[:, 1])
        return values
    if not live:
        return values
    features = window_features(
        np.stack([days for *_, (days, _counts) in live]),
        np.stack([counts for *_, (_days, counts) in live]),
        np.array([max(as_of_day, 0) for _, _, as_of_day, _ in live], np.int64),
    )
    for row, (i, key, as_of_day, buckets) in enumerate(live):
        values[i] = encode_terminal_risk(key, as_of_day, features[row], buckets)
    return values
