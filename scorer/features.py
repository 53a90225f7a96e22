"""Feature construction: a batch of transactions → float32 matrix [B, F] for the model.

Everything after field extraction is vectorised numpy; there is no per-record Python beyond
reading the decoded fields into columns. The same function builds the training matrix, so the
model and the service can never disagree on what a feature means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

FEATURE_NAMES: tuple[str, ...] = (
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
)
NUM_FEATURES = len(FEATURE_NAMES)

#: Amounts below this are typical of card-testing probes.
TINY_AMOUNT = 2.0
_MS_PER_HOUR = 3_600_000
_MS_PER_DAY = 24 * _MS_PER_HOUR
#: Hours [start, end) counted as night; event_time is read as UTC.
NIGHT_HOURS = (0, 5)

#: Settlement currency of each country the features know. A card's `currency` is its billing
#: currency, so a country whose currency differs marks a cross-border transaction.
COUNTRY_CURRENCY: dict[str, str] = {
    "US": "USD", "CA": "CAD", "MX": "MXN", "BR": "BRL", "GB": "GBP", "IE": "EUR",
    "FR": "EUR", "DE": "EUR", "ES": "EUR", "IT": "EUR", "NL": "EUR", "PL": "PLN",
    "RO": "RON", "UA": "UAH", "RU": "RUB", "NG": "NGN", "IN": "INR", "CN": "CNY",
    "JP": "JPY", "AU": "AUD", "ID": "IDR", "PH": "PHP",
}  # fmt: skip
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


class TransactionFields(Protocol):
    """The fields of a decoded transaction that features read."""

    @property
    def amount(self) -> float: ...
    @property
    def currency(self) -> str: ...
    @property
    def mcc(self) -> int: ...
    @property
    def country(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def card_present(self) -> bool: ...
    @property
    def event_time(self) -> int: ...


class TransactionColumns(NamedTuple):
    """A batch of transactions as columns (one numpy array per field)."""

    amount: npt.NDArray[np.float64]
    currency: npt.NDArray[np.str_]  # 3 upper-case letters
    mcc: npt.NDArray[np.int64]
    country: npt.NDArray[np.str_]  # 2 upper-case letters
    channel: npt.NDArray[np.str_]
    card_present: npt.NDArray[np.bool_]
    event_time: npt.NDArray[np.int64]

    @classmethod
    def from_transactions(cls, batch: Sequence[TransactionFields]) -> TransactionColumns:
        """Read decoded transactions into columns (the only per-record step)."""
        n = len(batch)
        return cls(
            amount=np.fromiter((t.amount for t in batch), np.float64, n),
            currency=np.array([t.currency for t in batch], dtype="<U3"),
            mcc=np.fromiter((t.mcc for t in batch), np.int64, n),
            country=np.array([t.country for t in batch], dtype="<U2"),
            channel=np.array([t.channel for t in batch], dtype="<U4"),
            card_present=np.fromiter((t.card_present for t in batch), np.bool_, n),
            event_time=np.fromiter((t.event_time for t in batch), np.int64, n),
        )


def _letters_index(codes: npt.NDArray[np.str_], width: int) -> npt.NDArray[np.int64]:
    """Map fixed-width upper-case codes ("US", "EUR") to 0 … 26**width - 1, vectorised."""
    letters = codes.astype(f"<U{width}").view(np.uint32).reshape(-1, width).astype(np.int64) - 65
    index = np.zeros(len(codes), np.int64)
    for position in range(width):
        index = index * 26 + letters[:, position]
    return index


def _country_tables() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    currency_of_country = np.full(26 * 26, -1, np.int64)
    high_risk = np.zeros(26 * 26, np.bool_)
    countries = np.array(list(COUNTRY_CURRENCY), dtype="<U2")
    currencies = np.array(list(COUNTRY_CURRENCY.values()), dtype="<U3")
    currency_of_country[_letters_index(countries, 2)] = _letters_index(currencies, 3)
    high_risk[_letters_index(np.array(sorted(HIGH_RISK_COUNTRIES), dtype="<U2"), 2)] = True
    return currency_of_country, high_risk


def _mcc_table() -> npt.NDArray[np.float32]:
    table = np.zeros((10_000, len(MCC_FAMILIES)), np.float32)
    for column, codes in enumerate(MCC_FAMILIES.values()):
        table[list(codes), column] = 1.0
    return table


_CURRENCY_OF_COUNTRY, _HIGH_RISK_COUNTRY = _country_tables()
_MCC_FAMILY = _mcc_table()


def build_features(columns: TransactionColumns) -> npt.NDArray[np.float32]:
    """The float32 feature matrix [B, NUM_FEATURES] of a batch, columns in FEATURE_NAMES order."""
    n = len(columns.amount)
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
    country = _letters_index(columns.country, 2)
    out[:, 15] = _CURRENCY_OF_COUNTRY[country] != _letters_index(columns.currency, 3)
    out[:, 16] = _HIGH_RISK_COUNTRY[country]
    return out
