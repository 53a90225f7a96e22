"""The flywheel's settings (`python -m flywheel -h` explains each)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from simulator.label_regimes import REVIEWS_PER_DAY, LabelRegime


class FlywheelSettings(NamedTuple):
    """One run: the broker, the simulated world and its drift, how outcomes are reported, the
    scorer's metrics port and where the run writes."""

    bootstrap: str = "127.0.0.1:9092"
    #: The simulator's seed and population.
    seed: int = 17
    cards: int = 5_000
    #: Days of v1 alone: the new pattern switches on after `drift_day` of them.
    train_days: int = 40
    drift_day: int = 20
    #: Days scored in shadow (the late window), then days served by v2.
    late_days: int = 10
    served_days: int = 2
    #: Event-time transactions per second: how compressed simulated time is.
    rate: float = 2_000.0
    #: Packages, logs and summary.json.
    out: Path = Path(".kafka/flywheel")
    #: The scorer replica's metrics port.
    metrics_port: int = 9104
    #: How outcomes are reported (simulator/label_regimes.py).
    regime: LabelRegime = LabelRegime.CAPACITY
    #: Capacity regime: approved transactions audited (`audit_sample`), and the reviews a day.
    audit_share: float = 0.0
    #: What each audited fraud weighs in v2's training (`fraud-train from-topics --audit-weight`).
    audit_weight: float = 1.0
    reviews_per_day: int = REVIEWS_PER_DAY
    #: v2's rows for calibration and thresholds, and the most recent for its comparison with v1
    #: (`fraud-train from-topics`): v2 trains on none of them.
    validation_share: float = 0.2
    evaluation_share: float = 0.2
