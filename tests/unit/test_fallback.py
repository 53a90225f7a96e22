"""The fallback rules used when the model cannot answer in time, against the shipped thresholds."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from scorer.decisions import classify
from scorer.fallback import (
    BASE_LOG_ODDS,
    CUTOFFS,
    RED_FLAG_WEIGHTS,
    fallback_scores,
    red_flags,
)
from scorer.features import FEATURE_NAMES, TransactionColumns, build_features
from scorer.model_package import load_model_package
from stream.startup.config import SHIPPED_MODEL_PATH

#: The fallback's score is read against the same thresholds as the model's.
THRESHOLDS = load_model_package(SHIPPED_MODEL_PATH).thresholds


def columns(**overrides: list[object]) -> TransactionColumns:
    base: dict[str, list[object]] = {
        "amount": [40.0],
        "currency": ["USD"],
        "mcc": [5411],
        "country": ["US"],
        "channel": ["pos"],
        "card_present": [True],
        "event_time": [12 * 3_600_000],
        "card_id": ["c-1"],
        "merchant_id": ["m-1"],
        "terminal_id": ["t-1"],
    }
    base.update(overrides)
    columns: dict[str, Any] = {field: np.array(values) for field, values in base.items()}
    return TransactionColumns(**columns)


def ordinary(**features: float) -> npt.NDArray[np.float32]:
    """An ordinary purchase's feature row, with these features set."""
    row = build_features(columns())
    for name, value in features.items():
        row[:, FEATURE_NAMES.index(name)] = value
    return row


def test_an_ordinary_purchase_is_approved() -> None:
    row = ordinary()
    assert not any(hit[0] for hit in red_flags(row).values())
    score = fallback_scores(row)[0]
    assert score == pytest.approx(1.0 / (1.0 + np.exp(-BASE_LOG_ODDS)))
    assert classify(np.array([score]), THRESHOLDS) == ["approve"]


@pytest.mark.parametrize(
    ("flag", "row"),
    [
        ("large_amount", build_features(columns(amount=[CUTOFFS.large_amount + 5.0]))),
        # Compromised card: five times the card's usual amount.
        ("amount_spike", ordinary(card_amount_to_mean=np.log(5.0))),
        # A skimmer: frauds at the terminal confirmed this week.
        ("terminal_recent_frauds", ordinary(terminal_fresh_frauds_7d=np.log1p(3.0))),
        # Card testing: the third tiny online purchase in a few minutes.
        (
            "card_testing_burst",
            ordinary(tiny_amount=1.0, channel_ecom=1.0, card_testing_velocity=np.log1p(3.0)),
        ),
    ],
)
def test_each_red_flag_alone_is_declined(flag: str, row: npt.NDArray[np.float32]) -> None:
    flags = red_flags(row)
    assert [name for name, hit in flags.items() if hit[0]] == [flag]
    assert classify(fallback_scores(row), THRESHOLDS) == ["decline"]


def test_the_flags_start_at_their_cut_offs() -> None:
    rows = np.repeat(ordinary(), 2, axis=0)
    amounts = np.array([CUTOFFS.large_amount - 0.5, CUTOFFS.large_amount + 0.5])
    rows[:, FEATURE_NAMES.index("log_amount")] = np.log1p(amounts)
    counts = np.log1p(np.array([1.0, 2.0], np.float32))  # 1 and 2, as the features store them
    rows[:, FEATURE_NAMES.index("terminal_fresh_frauds_7d")] = counts
    rows[:, FEATURE_NAMES.index("card_testing_velocity")] = counts
    flags = red_flags(rows)
    assert CUTOFFS.terminal_recent_frauds == CUTOFFS.card_testing_burst == 2
    assert flags["large_amount"].tolist() == [False, True]
    assert flags["terminal_recent_frauds"].tolist() == [False, True]
    assert flags["card_testing_burst"].tolist() == [False, True]


def test_every_flag_raises_the_score_and_scores_stay_probabilities() -> None:
    assert all(weight > 0.0 for weight in RED_FLAG_WEIGHTS.values())
    worst = build_features(
        columns(
            amount=[999_999.0],
            country=["RU"],
            channel=["ecom"],
            card_present=[False],
            event_time=[2 * 3_600_000],
        )
    )
    for name in ("card_amount_to_mean", "terminal_fresh_frauds_7d", "card_testing_velocity"):
        worst[:, FEATURE_NAMES.index(name)] = 20.0
    assert all(hit[0] for hit in red_flags(worst).values())
    scores = fallback_scores(np.concatenate([ordinary(), worst]))
    assert scores.dtype == np.float32
    assert 0.0 <= scores[0] < scores[1] <= 1.0
