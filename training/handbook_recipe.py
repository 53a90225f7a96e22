"""The handbook's own recipe on our data: its 15 features and its tuned XGBoost.

Le Borgne et al., *Reproducible Machine Learning for Credit Card Fraud Detection*: the features
of chapter 3 ("Baseline feature transformation") and the XGBoost that chapter 5 ("Model
selection") chose on its validation folds for average precision: 50 trees, learning rate 0.3,
depth 3, its other parameters at the library's defaults of the time. Trained on the same
training weeks and scored on the same rows as our model, it is the baseline the card compares
with; the handbook's published figures (its data, not ours) are context only.

The handbook's columns map onto the catalogue's (`scorer/catalogue.py`), which differ in how
they are computed (the card lists it): amounts and counts are stored as log(1 + x), which
changes nothing for trees (a split on log(1 + x) is a split on x); windows are exponentially
decayed, not sliding; the night is 00-05h, not 00-06h; terminal risk counts the frauds confirmed
by the `labels` feedback before the transaction, not every fraud of the window.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import xgboost

from scorer.features import FEATURE_NAMES

#: (the handbook's column, the catalogue column that stands for it), in the handbook's order.
FEATURES: tuple[tuple[str, str], ...] = (
    ("TX_AMOUNT", "log_amount"),
    ("TX_DURING_WEEKEND", "weekend"),
    ("TX_DURING_NIGHT", "night"),
    *(
        pair
        for w in (1, 7, 30)
        for pair in (
            (f"CUSTOMER_ID_NB_TX_{w}DAY_WINDOW", f"card_tx_{w}d"),
            (f"CUSTOMER_ID_AVG_AMOUNT_{w}DAY_WINDOW", f"card_avg_amount_{w}d"),
        )
    ),
    *(
        pair
        for w in (1, 7, 30)
        for pair in (
            (f"TERMINAL_ID_NB_TX_{w}DAY_WINDOW", f"terminal_tx_{w}d"),
            (f"TERMINAL_ID_RISK_{w}DAY_WINDOW", f"terminal_risk_{w}d"),
        )
    ),
)
COLUMNS = np.array([FEATURE_NAMES.index(ours) for _, ours in FEATURES], np.intp)
#: Chapter 5's choice for average precision (its grid: depth 3, 6, 9; 25, 50, 100 trees;
#: learning rate 0.1, 0.3). `tree_method="exact"` and `base_score=0.5` are what XGBoost 1.x, the
#: handbook's, did by default at this size; single-threaded for a repeatable model.
PARAMS: dict[str, Any] = {
    "n_estimators": 50,
    "learning_rate": 0.3,
    "max_depth": 3,
    "tree_method": "exact",
    "base_score": 0.5,
    "random_state": 0,
    "n_jobs": 1,
}


def fit(
    features: npt.NDArray[np.float32], is_fraud: npt.NDArray[np.bool_]
) -> xgboost.XGBClassifier:
    """The handbook's XGBoost trained on its 15 columns of these feature rows."""
    model = xgboost.XGBClassifier(**PARAMS)
    model.fit(features[:, COLUMNS], is_fraud.astype(np.int8))
    return model


def scores(
    model: xgboost.XGBClassifier, features: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Its fraud scores of these feature rows."""
    probability: npt.NDArray[np.float32] = model.predict_proba(features[:, COLUMNS])[:, 1]
    return probability.astype(np.float32)
