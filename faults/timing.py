"""How long each fault scenario's phases last, and the load under them: the full suite (`make
faults`), or the short one CI runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """How long each phase lasts, and the load: the full suite, or the short one CI runs."""

    rate: float
    warm_s: float
    tail_s: float
    kills: int
    kill_every_s: float
    broker_down_s: float
    storm_s: float
    storm_every_s: float
    dlq_gone_s: float
    #: Scenario 6: cards whose state the first replica holds, and how long the second stays.
    held_cards: int
    joined_s: float
    #: Scenario 7: past transactions written before the release starts.
    history_records: int


FULL = Timing(
    rate=5_000,
    warm_s=10,
    tail_s=10,
    kills=3,
    kill_every_s=15,
    broker_down_s=10,
    storm_s=60,
    storm_every_s=4,
    dlq_gone_s=10,
    held_cards=1_000_000,
    joined_s=20,
    history_records=40_000,
)
#: CI's version: a fifth of the load, one kill, a 12 s storm, 50,000 cards held, shorter windows.
SHORT = Timing(
    rate=1_000,
    warm_s=3,
    tail_s=3,
    kills=1,
    kill_every_s=3,
    broker_down_s=10,
    storm_s=12,
    storm_every_s=3,
    dlq_gone_s=4,
    held_cards=50_000,
    joined_s=5,
    history_records=20_000,
)
