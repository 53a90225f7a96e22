"""The fallback rules used when the model cannot answer in time."""

from __future__ import annotations

import numpy as np

from scorer.fallback import BASE_SCORE, fallback_scores
from scorer.features import TransactionColumns, build_features


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
    return TransactionColumns(*(np.array(base[f]) for f in TransactionColumns._fields))


def test_an_ordinary_purchase_scores_the_base() -> None:
    assert fallback_scores(build_features(columns()))[0] == np.float32(BASE_SCORE)


def test_red_flags_add_up_to_a_decline() -> None:
    cash_out = columns(amount=[5_000.0], country=["NG"], channel=["ecom"], card_present=[False])
    score = fallback_scores(build_features(cash_out))[0]
    assert score >= 0.8


def test_card_testing_probe_is_flagged_for_review() -> None:
    probe = columns(amount=[0.99], mcc=[5816], channel=["ecom"], card_present=[False])
    assert 0.5 <= fallback_scores(build_features(probe))[0] < 0.8


def test_scores_stay_probabilities() -> None:
    worst = columns(
        amount=[999_999.0],
        country=["RU"],
        channel=["ecom"],
        card_present=[False],
        currency=["USD"],
        event_time=[2 * 3_600_000],
    )
    assert 0.0 <= fallback_scores(build_features(worst))[0] <= 1.0
