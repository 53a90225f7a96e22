"""Feature construction: a batch of transactions → float32 matrix [B, F] for the model.

Everything after field extraction is vectorised numpy; there is no per-record Python beyond
reading the decoded fields into columns (`scorer/columns.py`). Three groups of columns: the
transaction's own fields (here), its card's history (`scorer/history.py`, per partition) and its
terminal's risk from confirmed outcomes (`scorer/terminal_risk.py`). Training replays its
simulated stream through the same three, so the model and the service can never disagree on
what a feature means.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scorer.columns import TINY_AMOUNT, TransactionColumns, TransactionFields, letters_index
from scorer.history import HISTORY_FEATURE_NAMES, NUM_HISTORY_FEATURES, neutral_history
from scorer.terminal_risk import (
    NEUTRAL_TERMINAL_FEATURES,
    NUM_TERMINAL_FEATURES,
    TERMINAL_FEATURE_NAMES,
)

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
#: Every column the model reads: the transaction, its card's history, its terminal's risk.
FEATURE_NAMES: tuple[str, ...] = (
    *TRANSACTION_FEATURE_NAMES,
    *HISTORY_FEATURE_NAMES,
    *TERMINAL_FEATURE_NAMES,
)
NUM_FEATURES = len(FEATURE_NAMES)
_HISTORY = slice(NUM_TRANSACTION_FEATURES, NUM_TRANSACTION_FEATURES + NUM_HISTORY_FEATURES)
_TERMINAL = slice(_HISTORY.stop, NUM_FEATURES)
_MS_PER_HOUR = 3_600_000
_MS_PER_DAY = 24 * _MS_PER_HOUR
#: 1970-01-01 was a Thursday: day numbers shifted by this start weeks on Monday.
_MONDAY_SHIFT = 3
_SATURDAY = 5
#: Hours [start, end) counted as night; event_time is read as UTC.
NIGHT_HOURS = (0, 5)

#: Settlement currency of each country the features know. A card's `currency` is its billing
#: currency, so a country whose currency differs marks a cross-border transaction.
COUNTRY_CURRENCY: dict[str, str] = {
    "US": "USD",
    "CA": "CAD",
    "MX": "MXN",
    "BR": "BRL",
    "GB": "GBP",
    "IE": "EUR",
    "FR": "EUR",
    "DE": "EUR",
    "ES": "EUR",
    "IT": "EUR",
    "NL": "EUR",
    "PL": "PLN",
    "RO": "RON",
    "UA": "UAH",
    "RU": "RUB",
    "NG": "NGN",
    "IN": "INR",
    "CN": "CNY",
    "JP": "JPY",
    "AU": "AUD",
    "ID": "IDR",
    "PH": "PHP",
}
#: Merchant countries that card-fraud reports rank high for card-not-present fraud.
HIGH_RISK_COUNTRIES: frozenset[str] = frozenset({"NG", "RU", "UA", "RO", "ID", "PH"})

#: Merchant category codes by risk family (ISO 18245); codes not listed belong to none.
MCC_FAMILIES: dict[str, tuple[int, ...]] = {
    "everyday": (5311, 5411, 5499, 5541, 5542, 5812, 5814, 5912),
    "travel": (3000, 3001, 3005, 3501, 3502, 4111, 4121, 4511, 7011, 7512),
    "digital": (4816, 5815, 5816, 5817, 5818, 5967),
    "high_value": (5045, 5094, 5732, 5944),
    "cash": (4829, 6010, 6011, 6051, 7995),
}


def _country_tables() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    currency_of_country = np.full(26 * 26, -1, np.int64)
    high_risk = np.zeros(26 * 26, np.bool_)
    countries = np.array(list(COUNTRY_CURRENCY), dtype="<U2")
    currencies = np.array(list(COUNTRY_CURRENCY.values()), dtype="<U3")
    currency_of_country[letters_index(countries, 2)] = letters_index(currencies, 3)
    high_risk[letters_index(np.array(sorted(HIGH_RISK_COUNTRIES), dtype="<U2"), 2)] = True
    return currency_of_country, high_risk


def _mcc_table() -> npt.NDArray[np.float32]:
    table = np.zeros((10_000, len(MCC_FAMILIES)), np.float32)
    for column, codes in enumerate(MCC_FAMILIES.values()):
        table[list(codes), column] = 1.0
    return table


_CURRENCY_OF_COUNTRY, _HIGH_RISK_COUNTRY = _country_tables()
_MCC_FAMILY = _mcc_table()


def build_features(
    columns: TransactionColumns,
    history: npt.NDArray[np.float32] | None = None,
    terminal: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """The float32 feature matrix [B, NUM_FEATURES] of a batch, columns in FEATURE_NAMES order.

    `history` [B, NUM_HISTORY_FEATURES] comes from the partition's `CardHistory`, `terminal`
    [B, NUM_TERMINAL_FEATURES] from the terminal-risk table. None means unknown: the history
    of a card seen for the first time, and a terminal without any record (neutral values), so
    the rules fallback and callers without state keep working.
    """
    n = len(columns.amount)
    for name, part, width in (
        ("history", history, NUM_HISTORY_FEATURES),
        ("terminal", terminal, NUM_TERMINAL_FEATURES),
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
    hour = (columns.event_time % _MS_PER_DAY) / _MS_PER_HOUR
    angle = hour * (2.0 * np.pi / 24.0)
    out[:, 7] = np.sin(angle)
    out[:, 8] = np.cos(angle)
    out[:, 9] = (hour >= NIGHT_HOURS[0]) & (hour < NIGHT_HOURS[1])
    out[:, 10:15] = _MCC_FAMILY[columns.mcc]
    country = letters_index(columns.country, 2)
    out[:, 15] = _CURRENCY_OF_COUNTRY[country] != letters_index(columns.currency, 3)
    out[:, 16] = _HIGH_RISK_COUNTRY[country]
    weekday = (columns.event_time // _MS_PER_DAY + _MONDAY_SHIFT) % 7
    out[:, 17] = weekday >= _SATURDAY
    out[:, _HISTORY] = neutral_history(columns) if history is None else history
    out[:, _TERMINAL] = NEUTRAL_TERMINAL_FEATURES if terminal is None else terminal
    return out
