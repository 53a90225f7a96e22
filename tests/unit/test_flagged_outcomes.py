"""Observed precision (stream/observed_precision.py): flagged transactions are counted once,
when the label clock has passed them by the maturity, by the label that came for them."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry

from contracts.event_time import EventClock
from stream.metrics import ServiceMetrics
from stream.observed_precision import MS_PER_DAY, ObservedPrecision

T0 = 1_800_000_000_000
DAY = MS_PER_DAY


def tracker(max_pending: int = 100, wall_ms: int = T0 + 365 * DAY):
    registry = CollectorRegistry()
    observed = ObservedPrecision(
        ServiceMetrics(registry),
        maturity_days=7,
        time_scale=1.0,
        max_pending=max_pending,
        clock=EventClock(300_000, 1.0, wall_ms=lambda: wall_ms),
    )

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    return observed, sample


def outcomes(sample) -> dict[str, float | None]:
    return {
        kind: sample("fraud_flagged_outcomes_total", outcome=kind)
        for kind in ("fraud", "legit", "unreported")
    }


def test_each_flagged_transaction_counts_once_by_its_label_after_the_maturity():
    observed, sample = tracker()
    observed.note_flagged(["a", "b", "c", "d"], np.array([T0, T0, T0 + DAY, T0 + 20 * DAY]))
    observed.note_flagged(["a"], np.array([T0]))  # decided again after a rewind: still one
    observed.label("a", True, T0 + 2 * DAY)
    observed.label("b", False, T0 + 3 * DAY)
    observed.label("b", True, T0 + 3 * DAY)  # a later fraud label overrules a legitimate one
    observed.label("a", False, T0 + 3 * DAY)  # a fraud label is not undone
    observed.label("unflagged", True, T0 + 4 * DAY)  # not flagged here: nothing to count
    assert outcomes(sample) == {"fraud": 0, "legit": 0, "unreported": 0}
    assert sample("fraud_flagged_outcomes_pending") == 4

    # The label clock passes T0 + 7 days: a and b mature (both fraud); c, a day younger, not.
    observed.label("other", False, T0 + 7 * DAY)
    assert outcomes(sample) == {"fraud": 2, "legit": 0, "unreported": 0}
    observed.label("other", False, T0 + 8 * DAY)
    assert outcomes(sample) == {"fraud": 2, "legit": 0, "unreported": 1}
    assert sample("fraud_flagged_outcomes_pending") == 1
    # A label from the past does not move the clock back.
    observed.label("d", False, T0)
    observed.label("other", False, T0 + 27 * DAY)
    assert outcomes(sample) == {"fraud": 2, "legit": 1, "unreported": 1}


def test_a_future_dated_label_moves_the_clock_only_to_the_host_clock_plus_the_skew():
    now = T0 + 2 * DAY
    observed, sample = tracker(wall_ms=now)
    observed.note_flagged(["old", "new"], np.array([T0 - 10 * DAY, T0]))
    observed.label("x", True, 253402300799000)  # 9999-12-31: trusted as of now + 5 minutes
    assert outcomes(sample) == {"fraud": 0, "legit": 0, "unreported": 1}
    assert sample("fraud_flagged_outcomes_pending") == 1


def test_beyond_max_pending_flagged_transactions_are_not_followed_and_counted():
    observed, sample = tracker(max_pending=2)
    observed.note_flagged(["a", "b", "c"], np.array([T0, T0, T0]))
    assert sample("fraud_flagged_outcomes_untracked_total") == 1
    observed.label("c", True, T0 + 8 * DAY)  # not followed: its label counts nothing
    assert outcomes(sample) == {"fraud": 0, "legit": 0, "unreported": 2}


def test_the_maturity_is_history_time_shrunk_by_the_time_scale():
    registry = CollectorRegistry()
    observed = ObservedPrecision(
        ServiceMetrics(registry),
        maturity_days=7,
        time_scale=1_000.0,
        max_pending=10,
        clock=EventClock(300_000, 1_000.0, wall_ms=lambda: T0 + DAY),
    )
    observed.note_flagged(["a"], np.array([T0]))
    observed.label("a", True, T0 + 7 * DAY // 1_000 - 1)
    assert registry.get_sample_value("fraud_flagged_outcomes_pending") == 1
    observed.label("b", True, T0 + 7 * DAY // 1_000)
    assert registry.get_sample_value("fraud_flagged_outcomes_total", {"outcome": "fraud"}) == 1


def test_a_far_future_flagged_transaction_does_not_stop_later_ones_from_maturing():
    wall = [T0 + 30 * DAY]
    registry = CollectorRegistry()
    observed = ObservedPrecision(
        ServiceMetrics(registry),
        maturity_days=7,
        time_scale=1.0,
        max_pending=10,
        clock=EventClock(300_000, 1.0, wall_ms=lambda: wall[0]),
    )

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    # Flagged first, dated 9999-12-31: it counts as of the host's clock plus the skew.
    observed.note_flagged(["future"], np.array([253402300799000]))
    observed.note_flagged(["a", "b"], np.array([T0, T0 + DAY]))
    observed.label("a", True, T0 + 8 * DAY + 1)
    assert outcomes(sample) == {"fraud": 1, "legit": 0, "unreported": 1}
    assert sample("fraud_flagged_outcomes_pending") == 1
    # Once the host's clock and the labels have moved on by the maturity, it matures too.
    wall[0] += 7 * DAY
    observed.label("future", False, wall[0] + 300_000)
    assert outcomes(sample) == {"fraud": 1, "legit": 1, "unreported": 1}
    assert sample("fraud_flagged_outcomes_pending") == 0


def test_flagged_transactions_mature_by_event_time_whatever_order_they_were_flagged_in():
    observed, sample = tracker()
    observed.note_flagged(["late"], np.array([T0 + 5 * DAY]))
    observed.note_flagged(["early"], np.array([T0]))
    observed.label("early", True, T0 + 7 * DAY)
    assert outcomes(sample) == {"fraud": 1, "legit": 0, "unreported": 0}
    assert sample("fraud_flagged_outcomes_pending") == 1
