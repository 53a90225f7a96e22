"""The feature catalogue (scorer/catalogue.py): one entry per computed column, in order, and
the generated docs page that must match it."""

from __future__ import annotations

import math
from pathlib import Path

from scorer.catalogue import BY_NAME, CATALOGUE, LOG1P_FEATURES, markdown
from scorer.features import FEATURE_NAMES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "features.md"


def test_the_catalogue_lists_every_computed_column_in_order() -> None:
    assert tuple(feature.name for feature in CATALOGUE) == FEATURE_NAMES
    assert all(feature.description and feature.group for feature in CATALOGUE)


def test_the_docs_page_is_the_generated_one() -> None:
    assert DOCS.read_text(encoding="utf-8") == markdown(), (
        "regenerate it: python -m scorer.catalogue > docs/features.md"
    )


def test_counts_and_amounts_are_said_in_their_own_units() -> None:
    row = dict.fromkeys(FEATURE_NAMES, 0.0)
    row["card_tx_1h"] = math.log1p(6)
    row["log_amount"] = math.log1p(1234.5)
    row["card_avg_amount_7d"] = math.log1p(900.0)
    row["card_avg_amount_30d"] = math.log1p(100.0)
    assert BY_NAME["card_tx_1h"].text(row) == "6 transactions on the card in the last hour"
    assert BY_NAME["log_amount"].text(row) == "amount 1,234.50"
    assert BY_NAME["card_avg_amount_7d"].text(row) == (
        "7d average spend 900.00, 9.0x the card's 30-day average"
    )
    assert {"card_tx_1h", "log_amount", "terminal_frauds_30d"} <= LOG1P_FEATURES
    assert not {"card_amount_to_mean", "terminal_risk_7d", "night"} & LOG1P_FEATURES
