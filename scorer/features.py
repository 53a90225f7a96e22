"""Feature construction: a batch of transactions → float32 matrix [B, F] for the model.

Everything after field extraction is vectorised numpy; there is no per-record Python beyond
reading the decoded fields into columns (`scorer/columns.py`). Four groups of columns: the
transaction's own fields (here), its card's history (`scorer/card_history.py`, per partition), its
terminal's risk from confirmed outcomes (`scorer/terminal_risk.py`) and its card's confirmed
frauds known so far (`scorer/card_frauds.py`). Training replays its simulated stream through the
same code, so the model and the service can never disagree on what a feature means.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contracts.card_frauds import CARD_FRAUD_FEATURE_NAMES, NUM_CARD_FRAUD_FEATURES
from contracts.reference_data import COUNTRY_CURRENCIES, HIGH_RISK_COUNTRIES, MCC_FAMILIES
from contracts.terminal_risk import NUM_TERMINAL_FEATURES, TERMINAL_FEATURE_NAMES
from scorer.card_history import HISTORY_FEATURE_NAMES, NUM_HISTORY_FEATURES, neutral_history
from scorer.columns import TINY_AMOUNT, TransactionColumns, TransactionFields, letters_index
from scorer.terminal_risk import NEUTRAL_TERMINAL_FEATURES

__all__ = [
    "FEATURE_NAMES",
    "NUM_FEATURES",
    "TINY_AMOUNT",
    "TRANSACTION_FEATURE_NAMES",
    "TransactionColumns",
    "TransactionFields",
    "build_features",
]

#: Features of the transaction alone.
TRANSACTION_FEATURE_NAMES: tuple[str, ...] = (
    "log_amount",
    "tiny_amount",
    "round_amount",
    "channel_pos",
    "channel_ecom",
    "channel_atm",
    "card_present",
    "hour_sin",
    "hour_cos",
    "night",
    "mcc_everyday",
    "mcc_travel",
    "mcc_digital",
    "mcc_high_value",
    "mcc_cash",
    "cross_border",
    "high_risk_country",
    "weekend",
)
NUM_TRANSACTION_FEATURES = len(TRANSACTION_FEATURE_NAMES)
#: Every column the service computes: the transaction, its card's history, its terminal's risk,
#: its card's confirmed frauds.
FEATURE_NAMES: tuple[str, ...] = (
    *TRANSACTION_FEATURE_NAMES,
    *HISTORY_FEATURE_NAMES,
    *TERMINAL_FEATURE_NAMES,
    *CARD_FRAUD_FEATURE_NAMES,
)
NUM_FEATURES = len(FEATURE_NAMES)
_HISTORY = slice(NUM_TRANSACTION_FEATURES, NUM_TRANSACTION_FEATURES + NUM_HISTORY_FEATURES)
_TERMINAL = slice(_HISTORY.stop, _HISTORY.stop + NUM_TERMINAL_FEATURES)
_CARD_FRAUDS = slice(_TERMINAL.stop, NUM_FEATURES)
_MS_PER_HOUR = 3_600_000
_MS_PER_DAY = 24 * _MS_PER_HOUR
#: 1970-01-01 was a Thursday: day numbers shifted by this start weeks on Monday.
_MONDAY_SHIFT = 3
_SATURDAY = 5
#: Hours [start, end) counted as night, of the local time (`utc_offset_minutes`), else UTC.
NIGHT_HOURS = (0, 5)


def _country_tables() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The (country, currency) pairs of legal tender, as sorted `_pair` numbers, and whether
    each country (by `letters_index`) is high-risk."""
    countries = np.array(
        [c for c, currencies in COUNTRY_CURRENCIES.items() for _ in currencies], dtype="<U2"
    )
    currencies = np.array(
        [currency for all_of in COUNTRY_CURRENCIES.values() for currency in all_of], dtype="<U3"
    )
    pairs = np.unique(_pair(letters_index(countries, 2), letters_index(currencies, 3)))
    high_risk = np.zeros(26 * 26, np.bool_)
    high_risk[letters_index(np.array(sorted(HIGH_RISK_COUNTRIES), dtype="<U2"), 2)] = True
    return pairs, high_risk


def _pair(country: npt.NDArray[np.int64], currency: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """One number per (country, currency) pair of `letters_index` values."""
    pair: npt.NDArray[np.int64] = country * 26**3 + currency
    return pair


def _legal_tender(
    country: npt.NDArray[np.int64], currency: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Whether each currency is legal tender in its country (False in a country CLDR does not
    know): a vectorised lookup in the sorted pairs."""
    pair = _pair(country, currency)
    at = np.minimum(np.searchsorted(_TENDER_PAIRS, pair), len(_TENDER_PAIRS) - 1)
    found: npt.NDArray[np.bool_] = _TENDER_PAIRS[at] == pair
    return found


def _mcc_table() -> npt.NDArray[np.float32]:
    table = np.zeros((10_000, len(MCC_FAMILIES)), np.float32)
    for column, codes in enumerate(MCC_FAMILIES.values()):
        table[list(codes), column] = 1.0
    return table


_TENDER_PAIRS, _HIGH_RISK_COUNTRY = _country_tables()
_MCC_FAMILY = _mcc_table()


def build_features(
    columns: TransactionColumns,
    history: npt.NDArray[np.float32] | None = None,
    terminal: npt.NDArray[np.float32] | None = None,
    card_frauds: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """The float32 feature matrix [B, NUM_FEATURES] of a batch, columns in FEATURE_NAMES order.

    `history` [B, NUM_HISTORY_FEATURES] comes from the partition's `CardHistory`, `terminal`
    [B, NUM_TERMINAL_FEATURES] from the terminal-risk table, `card_frauds`
    [B, NUM_CARD_FRAUD_FEATURES] from the card-frauds table. None means unknown: the history
    of a card seen for the first time, a terminal without any record (neutral values) and a
    card without a confirmed fraud, so the rules fallback and callers without state keep
    working.
    """
    n = len(columns.amount)
    for name, part, width in (
        ("history", history, NUM_HISTORY_FEATURES),
        ("terminal", terminal, NUM_TERMINAL_FEATURES),
        ("card_frauds", card_frauds, NUM_CARD_FRAUD_FEATURES),
    ):
        if part is not None and part.shape != (n, width):
            raise ValueError(f"{name} features must be [{n}, {width}], got {list(part.shape)}")
    out = np.empty((n, NUM_FEATURES), np.float32)
    amount = columns.amount
    out[:, 0] = np.log1p(amount)
    out[:, 1] = amount < TINY_AMOUNT
    out[:, 2] = np.mod(amount, 10.0) == 0.0
    out[:, 3] = columns.channel == "pos"
    out[:, 4] = columns.channel == "ecom"
    out[:, 5] = columns.channel == "atm"
    out[:, 6] = columns.card_present
    local_time = columns.local_time()
    hour = (local_time % _MS_PER_DAY) / _MS_PER_HOUR
    angle = hour * (2.0 * np.pi / 24.0)
    out[:, 7] = np.sin(angle)
    out[:, 8] = np.cos(angle)
    out[:, 9] = (hour >= NIGHT_HOURS[0]) & (hour < NIGHT_HOURS[1])
    out[:, 10:15] = _MCC_FAMILY[columns.mcc]
    country = letters_index(columns.country, 2)
    out[:, 15] = ~_legal_tender(country, letters_index(columns.currency, 3))
    out[:, 16] = _HIGH_RISK_COUNTRY[country]
    weekday = (local_time // _MS_PER_DAY + _MONDAY_SHIFT) % 7
    out[:, 17] = weekday >= _SATURDAY
    out[:, _HISTORY] = neutral_history(columns) if history is None else history
    out[:, _TERMINAL] = NEUTRAL_TERMINAL_FEATURES if terminal is None else terminal
    out[:, _CARD_FRAUDS] = 0.0 if card_frauds is None else card_frauds
    return out
