"""The cold-start check: the shipped model, day by day, on the first days of a new stream it
never saw, when every card and terminal is new.

The service meets cards without history at start-up and for every new card; every fold trains
on the stream's first days for that (`COLD_START_DAYS`, training/fold_data.py), and this check,
reported in the model card, shows how the shipped model treats such cards.
"""

from __future__ import annotations

import math

from simulator.label_regimes import LabelRegime
from simulator.replay import simulate
from training.onnx_export import score_with_onnxruntime
from training.results import ColdStartDay
from training.thresholds import Chosen

#: The cold-check streams COLD_START_DAYS was chosen on: the card says their columns are not
#: held out.
COLD_START_CHOSEN_ON = (107, 108)
#: The stream that checks cold start in the model card: another seed, COLD_CHECK_DAYS long.
COLD_CHECK_SEED_OFFSET = 100
COLD_CHECK_DAYS = 10


def check_cold_start(
    model: bytes,
    seed: int,
    cards: int,
    thresholds: Chosen,
    regime: LabelRegime,
    audit_share: float,
) -> list[ColdStartDay]:
    """The shipped model on a new stream's first COLD_CHECK_DAYS days, day by day."""
    stream = simulate(seed + COLD_CHECK_SEED_OFFSET, COLD_CHECK_DAYS, cards, regime, audit_share)
    scores = score_with_onnxruntime(model, stream.features)
    days = []
    for day in range(COLD_CHECK_DAYS):
        legit = scores[(stream.day == day) & ~stream.is_fraud]
        fraud = scores[(stream.day == day) & stream.is_fraud]
        days.append(
            ColdStartDay(
                float((legit >= thresholds.review).mean()),
                float((legit >= thresholds.decline).mean()),
                float((fraud >= thresholds.review).mean()) if len(fraud) else math.nan,
            )
        )
    return days
