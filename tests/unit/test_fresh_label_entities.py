import numpy as np

from contracts.terminal_risk import MS_PER_DAY
from training.fresh_label_entities import fresh_fraud_counts


def test_a_fraud_counts_for_its_entity_only_once_reported_and_until_the_window_ends():
    day = MS_PER_DAY
    entity = ["a", "a", "a", "a", "b", "a"]
    times = np.array([10, 50, 51, day + 9, 60, day + 11], np.int64)
    labels: list[dict[str, object]] = [
        {"fraud": True, "event_time": 10, "reported_at": 50},
        {"fraud": False, "event_time": 10, "reported_at": 20},  # not a fraud: never counted
        {"fraud": True, "event_time": 11, "reported_at": 55},
    ]

    counts = fresh_fraud_counts(entity, times, labels, ["a", "a", "a"], window_days=1)

    # t=50: reported at 50, not before it; t=51: one known; day+9: both known, both in the
    # window; b: another entity; day+11: the first fraud (event 10) left the window.
    assert np.expm1(counts).round().tolist() == [0, 0, 1, 2, 0, 1]
