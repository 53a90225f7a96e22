"""Seeded, repeatable simulator of card transactions with labelled fraud scenarios.

A fixed population of cards (home country, billing currency, spending profile, channel mix,
hours of activity) and merchants (merchant category code, country, channel, terminals) produces
one continuing stream of transactions on a simulated clock. Most of it is legitimate traffic,
which deliberately overlaps the fraud patterns (travel abroad, big-ticket purchases, small app
purchases, night owls); the rest is fraud from one of four named scenarios:

- ``large_amount``: one unusually large purchase on a card, often at a high-value merchant.
- ``card_testing``: a burst of consecutive tiny (< 2.0) e-commerce purchases on one card, mostly
  at digital-goods merchants.
- ``compromised_terminal``: cloned cards used at a fixed set of compromised terminals; amounts
  are only mildly inflated, so a single transaction looks almost ordinary.
- ``compromised_card``: stolen card details used abroad, often in high-risk countries, mostly
  card-not-present, with inflated amounts and more often at night.

The same seed and the same sequence of `TransactionSimulator.generate` calls give the same
transactions. Hours of the day are UTC, which the features treat as local time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.transaction import MAX_AMOUNT, MAX_ID_CHARS
from scorer.features import (
    COUNTRY_CURRENCY,
    HIGH_RISK_COUNTRIES,
    MCC_FAMILIES,
    NIGHT_HOURS,
    TINY_AMOUNT,
    TransactionColumns,
)

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]

SCENARIOS: tuple[str, ...] = (
    "legit",
    "large_amount",
    "card_testing",
    "compromised_terminal",
    "compromised_card",
)
_LEGIT, _LARGE_AMOUNT, _CARD_TESTING, _COMPROMISED_TERMINAL, _COMPROMISED_CARD = range(
    len(SCENARIOS)
)
#: Share of the fraudulent rows that each fraud scenario produces.
FRAUD_SCENARIO_SHARES: dict[str, float] = {
    "large_amount": 0.25,
    "card_testing": 0.25,
    "compromised_terminal": 0.20,
    "compromised_card": 0.30,
}

#: 2026-01-05 00:00:00 UTC, a Monday.
DEFAULT_START_TIME_MS = 1_767_571_200_000
MAX_FRAUD_RATE = 0.5
#: Room left in a transaction_id for "-" and the counter (at most 20 digits, as a uint64).
MAX_ID_PREFIX_CHARS = MAX_ID_CHARS - 21

CHANNELS: tuple[str, ...] = ("pos", "ecom", "atm")
_POS, _ECOM, _ATM = range(len(CHANNELS))

_COUNTRIES: tuple[str, ...] = tuple(COUNTRY_CURRENCY)
#: Where cards are issued: most in a few big markets, a small tail everywhere else.
_HOME_COUNTRY_WEIGHTS: dict[str, float] = {
    "US": 0.30, "GB": 0.10, "DE": 0.09, "FR": 0.07, "ES": 0.05, "IT": 0.05, "BR": 0.04,
    "IN": 0.04, "CA": 0.04, "NL": 0.03, "PL": 0.03, "MX": 0.03, "JP": 0.03, "AU": 0.03,
    "CN": 0.02,
}  # fmt: skip
_MINOR_COUNTRY_WEIGHT = 0.007
#: Foreign destinations (travel, foreign web shops) are spread more evenly than card issuance.
_DESTINATION_FLATTENING = 0.5

# Merchant families: the keys of MCC_FAMILIES, then "other" for codes in no family.
_FAMILIES: tuple[str, ...] = (*MCC_FAMILIES, "other")
_DIGITAL, _HIGH_VALUE, _CASH = (_FAMILIES.index(name) for name in ("digital", "high_value", "cash"))
_ATM_MCC = 6011
#: Common category codes that belong to no risk family (clothing, books, utilities, …).
_UNLISTED_MCCS: tuple[int, ...] = (
    4899, 4900, 5200, 5399, 5651, 5691, 5942, 5964, 5977, 5999, 7230, 7299, 7832, 8011, 8099,
)  # fmt: skip
#: Category codes a merchant of each family draws from; every ATM has `_ATM_MCC`.
_FAMILY_MCCS: tuple[tuple[int, ...], ...] = (
    *(tuple(code for code in codes if code != _ATM_MCC) for codes in MCC_FAMILIES.values()),
    _UNLISTED_MCCS,
)
#: Share of merchants by channel (pos, ecom, atm).
_MERCHANT_CHANNEL_MIX = np.array([0.60, 0.30, 0.10])
#: Share of each family among the merchants of a channel (pos, ecom, atm).
_MERCHANT_FAMILY_MIX: dict[str, tuple[float, float, float]] = {
    "everyday": (0.55, 0.12, 0.0),
    "travel": (0.08, 0.15, 0.0),
    "digital": (0.0, 0.30, 0.0),
    "high_value": (0.07, 0.10, 0.0),
    "cash": (0.02, 0.03, 1.0),
    "other": (0.28, 0.30, 0.0),
}
_MERCHANT_FAMILY_CDF = np.cumsum([_MERCHANT_FAMILY_MIX[name] for name in _FAMILIES], axis=0).T
#: Typical ticket of a family relative to the card's typical amount.
_FAMILY_AMOUNT_SCALE: _Floats = np.array(
    [
        {"everyday": 0.6, "travel": 3.0, "digital": 0.35, "high_value": 4.0, "cash": 2.0}.get(
            name, 1.0
        )
        for name in _FAMILIES
    ]
)
_MAX_TERMINALS_PER_MERCHANT = 6
#: Lower-indexed merchants of a group get more traffic: a pick is u**skew of the group.
_MERCHANT_POPULARITY_SKEW = 2.0

# Card profiles.
_TYPICAL_AMOUNT = 35.0
_TYPICAL_AMOUNT_SPREAD = 0.45  # log-normal spread of card typical amounts around _TYPICAL_AMOUNT
_CARD_SIGMA_RANGE = (0.5, 0.9)  # log-normal spread of one card's amounts
_CHANNEL_MIX_CONCENTRATION = np.array([6.0, 3.0, 1.0])  # Dirichlet, pos/ecom/atm
_PEAK_HOUR_MEAN, _PEAK_HOUR_SPREAD = 14.5, 3.0
_ACTIVE_HOURS_RANGE = (3.0, 5.0)  # std-dev in hours of a card's activity around its peak
#: Keeps every card able to transact at any hour (insomniacs exist).
_ACTIVITY_FLOOR = 0.02
_TRAVELLER_SHARE = 0.08
_TRAVELLER_FOREIGN_SHARE = 0.25
_HOMEBODY_FOREIGN_SHARE = 0.01
_ECOM_FOREIGN_SHARE = 0.08

# Legitimate traffic that overlaps the fraud patterns.
_LEGIT_MICRO_SHARE = 0.12  # of digital purchases: app and in-game purchases below TINY_AMOUNT
_LEGIT_SPLURGE_SHARE = 0.006
_SPLURGE_FACTOR_RANGE = (5.0, 25.0)
_POS_ROUND_SHARE = 0.05
_ROUND_TO = 10.0
_ATM_NOTE = 20.0
_MICRO_AMOUNT_RANGE = (0.3, TINY_AMOUNT)
_MIN_AMOUNT = 0.01

# Fraud scenarios.
_LARGE_FACTOR_RANGE = (6.0, 40.0)
_LARGE_HIGH_VALUE_SHARE = 0.6
_LARGE_ECOM_SHARE = 0.6
_LARGE_ROUND_SHARE = 0.3
_LARGE_ROUND_TO = 50.0
_BURST_LENGTH_RANGE = (3, 12)  # inclusive
_CARD_TESTING_DIGITAL_SHARE = 0.8
_CARD_TESTING_DOMESTIC_SHARE = 0.5
_COMPROMISED_TERMINAL_SHARE = 0.01  # of all pos/atm terminals
_TERMINAL_FACTOR_RANGE = (1.2, 2.5)
_STOLEN_HIGH_RISK_SHARE = 0.6
_STOLEN_CHANNEL_CDF = np.cumsum([0.1, 0.8, 0.1])  # pos/ecom/atm
#: Merchant family of compromised-card frauds; -1: any merchant of the place.
_STOLEN_FAMILIES = np.array([_HIGH_VALUE, _DIGITAL, _CASH, -1])
_STOLEN_FAMILY_CDF = np.cumsum([0.30, 0.20, 0.15, 0.35])
_STOLEN_FACTOR_RANGE = (1.5, 6.0)
#: How much likelier a compromised-card fraud is per transaction at night than by day.
_STOLEN_NIGHT_FACTOR = 4.0
_NIGHT_HOURS = range(*NIGHT_HOURS)

_MS_PER_S = 1000.0
_MS_PER_HOUR = 3_600_000
_HOURS_PER_DAY = 24


class SimulatedBatch(NamedTuple):
    """The next transactions of a simulated stream, as columns and as contract records."""

    columns: TransactionColumns
    #: JSON-ready dicts with exactly the contract fields; `terminal_id` only where there is one.
    records: list[dict[str, object]]
    is_fraud: npt.NDArray[np.bool_]
    #: One of SCENARIOS per row.
    scenario: npt.NDArray[np.str_]


class _Rows(NamedTuple):
    """What a scenario chose for its rows: indices into the population, and amounts."""

    card: _Ints
    merchant: _Ints
    terminal: _Ints  # -1: none (e-commerce)
    amount: _Floats


class _Groups:
    """Members grouped by an integer key, for vectorised picks within a group."""

    def __init__(self, keys: _Ints, num_keys: int) -> None:
        self._members = np.argsort(keys, kind="stable")
        self._counts = np.bincount(keys, minlength=num_keys)
        self._starts = np.concatenate(([0], np.cumsum(self._counts)[:-1]))

    def pick(self, keys: _Ints, u: _Floats) -> _Ints:
        """One member of each key's group (chosen by u in [0, 1)); -1 where the group is empty."""
        counts = self._counts[keys]
        offset = np.minimum((u * counts).astype(np.int64), np.maximum(counts - 1, 0))
        position = np.minimum(self._starts[keys] + offset, len(self._members) - 1)
        return np.where(counts > 0, self._members[position], -1)


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float], size: int) -> _Floats:
    return np.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]), size))


def _choose(rng: np.random.Generator, cdf: _Floats, size: int) -> _Ints:
    """Indices drawn from a discrete distribution given as its cumulative sums."""
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(cdf) - 1)


def _round_up(amount: _Floats, step: float) -> _Floats:
    return np.maximum(np.round(amount / step), 1.0) * step


def _validate_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


class TransactionSimulator:
    """A continuing stream of simulated transactions from a fixed, seeded population.

    Each call of `generate` returns the next transactions of the same stream: the clock, the
    transaction counter and the random state carry on from the previous call.
    """

    def __init__(
        self,
        seed: int,
        *,
        fraud_rate: float = 0.02,
        num_cards: int = 20_000,
        num_merchants: int = 2_000,
        start_time_ms: int = DEFAULT_START_TIME_MS,
        id_prefix: str = "tx",
    ) -> None:
        """Build the population of cards and merchants.

        Args:
            seed: seeds every random choice of the population and the stream.
            fraud_rate: expected share of fraudulent transactions over whole days, 0 to
                MAX_FRAUD_RATE (compromised-card fraud is likelier at night than by day).
            num_cards: number of cards (customers), at least 1.
            num_merchants: number of merchants; at least one per country and channel.
            start_time_ms: event_time (epoch ms) of the first transaction.
            id_prefix: transaction ids are f"{id_prefix}-{counter}".

        Raises:
            TypeError: an argument has the wrong type.
            ValueError: an argument is out of range.
        """
        _validate_int("seed", seed, 0)
        if isinstance(fraud_rate, bool) or not isinstance(fraud_rate, int | float):
            raise TypeError(f"fraud_rate must be a number, got {fraud_rate!r}")
        if not 0.0 <= fraud_rate <= MAX_FRAUD_RATE:
            raise ValueError(f"fraud_rate must be in [0, {MAX_FRAUD_RATE}], got {fraud_rate!r}")
        _validate_int("num_cards", num_cards, 1)
        _validate_int("num_merchants", num_merchants, len(_COUNTRIES) * len(CHANNELS))
        _validate_int("start_time_ms", start_time_ms, 0)
        if not isinstance(id_prefix, str):
            raise TypeError(f"id_prefix must be a str, got {id_prefix!r}")
        if not 1 <= len(id_prefix) <= MAX_ID_PREFIX_CHARS:
            raise ValueError(
                f"id_prefix must be 1 to {MAX_ID_PREFIX_CHARS} characters, got {id_prefix!r}"
            )

        self._rng = np.random.default_rng(seed)
        self._fraud_rate = float(fraud_rate)
        self._id_prefix = id_prefix
        self._counter = 0
        self._start_time_ms = start_time_ms
        self._clock_s = 0.0  # simulated seconds from start_time_ms to the next record

        home_weights = np.array(
            [_HOME_COUNTRY_WEIGHTS.get(c, _MINOR_COUNTRY_WEIGHT) for c in _COUNTRIES]
        )
        destination_weights = home_weights**_DESTINATION_FLATTENING
        self._destination_cdf = np.cumsum(destination_weights) / destination_weights.sum()
        self._high_risk = np.array([c in HIGH_RISK_COUNTRIES for c in _COUNTRIES])
        self._country_names = np.array(_COUNTRIES, dtype="<U2")
        self._currency_names = np.array([COUNTRY_CURRENCY[c] for c in _COUNTRIES], dtype="<U3")
        self._build_cards(num_cards, np.cumsum(home_weights) / home_weights.sum())
        self._build_merchants(num_merchants)
        self._build_scenario_mix()

    # Population.

    def _build_cards(self, num_cards: int, home_cdf: _Floats) -> None:
        rng = self._rng
        self._card_ids = [f"card-{i:06d}" for i in range(num_cards)]
        self._card_home = _choose(rng, home_cdf, num_cards)
        self._cards_by_home = _Groups(self._card_home, len(_COUNTRIES))
        self._card_mu = rng.normal(math.log(_TYPICAL_AMOUNT), _TYPICAL_AMOUNT_SPREAD, num_cards)
        self._card_sigma = rng.uniform(*_CARD_SIGMA_RANGE, num_cards)
        channel_mix = rng.dirichlet(_CHANNEL_MIX_CONCENTRATION, num_cards)
        self._card_channel_cdf = np.cumsum(channel_mix, axis=1)
        self._card_foreign_share = np.where(
            rng.random(num_cards) < _TRAVELLER_SHARE,
            _TRAVELLER_FOREIGN_SHARE,
            _HOMEBODY_FOREIGN_SHARE,
        )
        peak = rng.normal(_PEAK_HOUR_MEAN, _PEAK_HOUR_SPREAD, num_cards)
        spread = rng.uniform(*_ACTIVE_HOURS_RANGE, num_cards)
        hours = np.arange(float(_HOURS_PER_DAY))[:, None]
        half_day = _HOURS_PER_DAY / 2.0
        distance = np.abs((hours - peak[None, :] + half_day) % _HOURS_PER_DAY - half_day)
        activity = np.exp(-0.5 * (distance / spread[None, :]) ** 2) + _ACTIVITY_FLOOR
        cdf = np.cumsum(activity, axis=1)
        cdf /= cdf[:, -1:]
        # Offsetting hour h's CDF by h makes all of them one increasing array, so a single
        # searchsorted picks the cards of rows at any mix of hours.
        self._card_activity_cdf = (cdf + hours).ravel()

    def _build_merchants(self, num_merchants: int) -> None:
        rng = self._rng
        num_places = len(_COUNTRIES) * len(CHANNELS)
        # One merchant for every (country, channel) first, so every place can be picked.
        place = np.concatenate(
            (
                np.arange(num_places),
                _choose(rng, self._destination_cdf, num_merchants - num_places) * len(CHANNELS)
                + _choose(rng, np.cumsum(_MERCHANT_CHANNEL_MIX), num_merchants - num_places),
            )
        )
        country, channel = np.divmod(place, len(CHANNELS))
        family_u = rng.random(num_merchants)
        family = np.minimum(
            (family_u[:, None] > _MERCHANT_FAMILY_CDF[channel]).sum(axis=1), len(_FAMILIES) - 1
        )
        mcc = np.empty(num_merchants, np.int64)
        for index, codes in enumerate(_FAMILY_MCCS):
            members = family == index
            mcc[members] = rng.choice(np.array(codes), int(members.sum()))
        mcc[channel == _ATM] = _ATM_MCC
        self._merchant_ids = [f"merch-{i:05d}" for i in range(num_merchants)]
        self._merchant_country = country
        self._merchant_channel = channel
        self._merchant_family = family
        self._merchant_mcc = mcc
        self._merchants_by_place = _Groups(place, num_places)
        self._merchants_by_family = _Groups(
            place * len(_FAMILIES) + family, num_places * len(_FAMILIES)
        )

        terminal_count = np.where(
            channel == _ECOM, 0, rng.integers(1, _MAX_TERMINALS_PER_MERCHANT + 1, num_merchants)
        )
        self._terminal_start = np.concatenate(([0], np.cumsum(terminal_count)[:-1]))
        self._terminal_count = terminal_count
        terminal_merchant = np.repeat(np.arange(num_merchants), terminal_count)
        terminal_number = (
            np.arange(len(terminal_merchant)) - self._terminal_start[terminal_merchant]
        )
        self._terminal_ids = [
            f"{self._merchant_ids[m]}-t{k}"
            for m, k in zip(terminal_merchant.tolist(), terminal_number.tolist(), strict=True)
        ]
        # Compromised terminals are where cloned cards of local customers get used, so only
        # countries that have cards qualify.
        has_cards = np.bincount(self._card_home, minlength=len(_COUNTRIES)) > 0
        candidates = np.flatnonzero(has_cards[country[terminal_merchant]])
        num_compromised = max(1, round(_COMPROMISED_TERMINAL_SHARE * len(terminal_merchant)))
        self._compromised_terminals = np.sort(
            rng.choice(candidates, min(num_compromised, len(candidates)), replace=False)
        )
        self._terminal_merchant = terminal_merchant

    def _build_scenario_mix(self) -> None:
        shares = {name: self._fraud_rate * share for name, share in FRAUD_SCENARIO_SHARES.items()}
        low, high = _BURST_LENGTH_RANGE
        mean_burst = (low + high) / 2.0
        testing_rows = shares["card_testing"]
        # Probability that an event is a burst, so that bursts fill `testing_rows` of all rows.
        self._burst_probability = testing_rows / (mean_burst - testing_rows * (mean_burst - 1.0))
        night = np.isin(np.arange(_HOURS_PER_DAY), _NIGHT_HOURS)
        stolen_weight = np.where(night, _STOLEN_NIGHT_FACTOR, 1.0)
        # Every hour holds as many rows as any other, so a mean weight of 1 keeps the share.
        stolen_weight /= stolen_weight.mean()
        single_rows = 1.0 - testing_rows
        # Columns: legit, large_amount, compromised_terminal, compromised_card.
        mix = np.zeros((_HOURS_PER_DAY, 4))
        mix[:, 1] = shares["large_amount"] / single_rows
        mix[:, 2] = shares["compromised_terminal"] / single_rows
        mix[:, 3] = shares["compromised_card"] * stolen_weight / single_rows
        mix[:, 0] = 1.0 - mix[:, 1:].sum(axis=1)
        self._single_scenario_cdf = np.cumsum(mix, axis=1)
        self._single_scenarios = np.array(
            [_LEGIT, _LARGE_AMOUNT, _COMPROMISED_TERMINAL, _COMPROMISED_CARD]
        )

    # Stream.

    def generate(self, n: int, *, rate_per_s: float = 1000.0) -> SimulatedBatch:
        """Return the next `n` transactions of the stream.

        The simulated clock advances by 1/`rate_per_s` seconds per record, so a stream produced
        at `rate_per_s` from `start_time_ms` = now keeps event times close to the wall clock.

        Raises:
            TypeError: an argument has the wrong type.
            ValueError: `n` is negative or `rate_per_s` is not a positive finite number.
        """
        _validate_int("n", n, 0)
        if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float):
            raise TypeError(f"rate_per_s must be a number, got {rate_per_s!r}")
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a positive finite number, got {rate_per_s!r}")

        elapsed_s = self._clock_s + np.arange(n) / rate_per_s
        self._clock_s += n / rate_per_s
        event_time = self._start_time_ms + np.floor(elapsed_s * _MS_PER_S).astype(np.int64)
        hour = event_time // _MS_PER_HOUR % _HOURS_PER_DAY

        scenario, burst = self._layout(n, hour)
        card = np.empty(n, np.int64)
        merchant = np.empty(n, np.int64)
        terminal = np.empty(n, np.int64)
        amount = np.empty(n, np.float64)
        for code, fill in (
            (_LEGIT, self._legit),
            (_LARGE_AMOUNT, self._large_amount),
            (_CARD_TESTING, self._card_testing),
            (_COMPROMISED_TERMINAL, self._compromised_terminal),
            (_COMPROMISED_CARD, self._compromised_card),
        ):
            index = np.flatnonzero(scenario == code)
            picked = fill(hour[index], burst[index])
            card[index], merchant[index] = picked.card, picked.merchant
            terminal[index], amount[index] = picked.terminal, picked.amount
        rows = _Rows(
            card, merchant, terminal, np.clip(np.round(amount, 2), _MIN_AMOUNT, MAX_AMOUNT)
        )
        channel = self._merchant_channel[merchant]
        columns = TransactionColumns(
            amount=rows.amount,
            currency=self._currency_names[self._card_home[card]],
            mcc=self._merchant_mcc[merchant],
            country=self._country_names[self._merchant_country[merchant]],
            channel=np.array(CHANNELS, dtype="<U4")[channel],
            card_present=channel != _ECOM,
            event_time=event_time,
        )
        records = self._records(columns, rows)
        self._counter += n
        labels = np.array(SCENARIOS)[scenario]
        return SimulatedBatch(columns, records, scenario != _LEGIT, labels)

    def _layout(self, n: int, hour: _Ints) -> tuple[_Ints, _Ints]:
        """Scenario of each row, and the burst number of card-testing rows (-1 elsewhere)."""
        rng = self._rng
        low, high = _BURST_LENGTH_RANGE
        # Events are single rows or card-testing bursts; n events always cover n rows.
        is_burst = rng.random(n) < self._burst_probability
        length = np.where(is_burst, rng.integers(low, high + 1, n), 1)
        starts = np.cumsum(length) - length
        num_events = int(np.searchsorted(starts, n))
        event = np.repeat(np.arange(num_events), length[:num_events])[:n]
        burst = np.where(is_burst[event], event, -1)
        u = rng.random(n)
        single = (u[:, None] > self._single_scenario_cdf[hour]).sum(axis=1)
        single = self._single_scenarios[np.minimum(single, len(self._single_scenarios) - 1)]
        return np.where(burst >= 0, _CARD_TESTING, single), burst

    # Scenarios: each picks cards, merchants, terminals and amounts for its rows.

    def _legit(self, hour: _Ints, burst: _Ints) -> _Rows:
        rng = self._rng
        size = len(hour)
        num_cards = len(self._card_ids)
        position = np.searchsorted(self._card_activity_cdf, hour + rng.random(size), side="right")
        card = np.clip(position - hour * num_cards, 0, num_cards - 1)
        channel = (rng.random(size)[:, None] > self._card_channel_cdf[card]).sum(axis=1)
        channel = np.minimum(channel, len(CHANNELS) - 1)
        foreign_share = np.where(
            channel == _ECOM, _ECOM_FOREIGN_SHARE, self._card_foreign_share[card]
        )
        home = self._card_home[card]
        country = np.where(rng.random(size) < foreign_share, self._abroad(home), home)
        merchant = self._pick_merchant(country, channel)
        family = self._merchant_family[merchant]
        amount = self._usual_amount(card, family)
        micro = (family == _DIGITAL) & (rng.random(size) < _LEGIT_MICRO_SHARE)
        amount[micro] = rng.uniform(*_MICRO_AMOUNT_RANGE, int(micro.sum()))
        splurge = rng.random(size) < _LEGIT_SPLURGE_SHARE
        amount[splurge] *= _log_uniform(rng, _SPLURGE_FACTOR_RANGE, int(splurge.sum()))
        rounded = (channel == _POS) & (rng.random(size) < _POS_ROUND_SHARE)
        amount[rounded] = _round_up(amount[rounded], _ROUND_TO)
        return self._at_merchants(card, merchant, amount)

    def _large_amount(self, hour: _Ints, burst: _Ints) -> _Rows:
        rng = self._rng
        size = len(hour)
        card = rng.integers(0, len(self._card_ids), size)
        channel = np.where(rng.random(size) < _LARGE_ECOM_SHARE, _ECOM, _POS)
        family = np.where(rng.random(size) < _LARGE_HIGH_VALUE_SHARE, _HIGH_VALUE, -1)
        merchant = self._pick_merchant(self._card_home[card], channel, family)
        amount = np.exp(self._card_mu[card]) * _log_uniform(rng, _LARGE_FACTOR_RANGE, size)
        rounded = rng.random(size) < _LARGE_ROUND_SHARE
        amount[rounded] = _round_up(amount[rounded], _LARGE_ROUND_TO)
        return self._at_merchants(card, merchant, amount)

    def _card_testing(self, hour: _Ints, burst: _Ints) -> _Rows:
        rng = self._rng
        size = len(burst)
        # Every row of a burst uses the card drawn for the burst's first row.
        first = np.diff(burst, prepend=-1) != 0
        card = rng.integers(0, len(self._card_ids), size)[np.cumsum(first) - 1]
        home = self._card_home[card]
        domestic = rng.random(size) < _CARD_TESTING_DOMESTIC_SHARE
        country = np.where(domestic, home, _choose(rng, self._destination_cdf, size))
        family = np.where(rng.random(size) < _CARD_TESTING_DIGITAL_SHARE, _DIGITAL, -1)
        merchant = self._pick_merchant(country, np.full(size, _ECOM), family)
        return self._at_merchants(card, merchant, rng.uniform(*_MICRO_AMOUNT_RANGE, size))

    def _compromised_terminal(self, hour: _Ints, burst: _Ints) -> _Rows:
        rng = self._rng
        size = len(hour)
        compromised = self._compromised_terminals
        terminal = compromised[rng.integers(0, len(compromised), size)]
        merchant = self._terminal_merchant[terminal]
        card = self._cards_by_home.pick(self._merchant_country[merchant], rng.random(size))
        amount = self._usual_amount(card, self._merchant_family[merchant])
        amount *= _log_uniform(rng, _TERMINAL_FACTOR_RANGE, size)
        return _Rows(card, merchant, terminal, self._cash_notes(merchant, amount))

    def _compromised_card(self, hour: _Ints, burst: _Ints) -> _Rows:
        rng = self._rng
        size = len(hour)
        card = rng.integers(0, len(self._card_ids), size)
        high_risk = np.flatnonzero(self._high_risk)
        country = np.where(
            rng.random(size) < _STOLEN_HIGH_RISK_SHARE,
            high_risk[rng.integers(0, len(high_risk), size)],
            _choose(rng, self._destination_cdf, size),
        )
        home = self._card_home[card]
        country = np.where(country == home, self._abroad(home), country)
        channel = _choose(rng, _STOLEN_CHANNEL_CDF, size)
        family = _STOLEN_FAMILIES[_choose(rng, _STOLEN_FAMILY_CDF, size)]
        merchant = self._pick_merchant(country, channel, family)
        amount = self._usual_amount(card, self._merchant_family[merchant])
        amount *= _log_uniform(rng, _STOLEN_FACTOR_RANGE, size)
        return self._at_merchants(card, merchant, amount)

    # Helpers.

    def _abroad(self, home: _Ints) -> _Ints:
        """A foreign destination for each home country."""
        destination = _choose(self._rng, self._destination_cdf, len(home))
        clash = np.flatnonzero(destination == home)
        # Shifting by 1 … len-1 countries never lands back home.
        shift = self._rng.integers(1, len(_COUNTRIES), len(clash))
        destination[clash] = (destination[clash] + shift) % len(_COUNTRIES)
        return destination

    def _pick_merchant(self, country: _Ints, channel: _Ints, family: _Ints | None = None) -> _Ints:
        """A merchant per row in that country and channel, of that family where one exists."""
        u = self._rng.random(len(country)) ** _MERCHANT_POPULARITY_SKEW
        place = country * len(CHANNELS) + channel
        merchant = self._merchants_by_place.pick(place, u)
        if family is not None:
            wanted = np.flatnonzero(family >= 0)
            keys = place[wanted] * len(_FAMILIES) + family[wanted]
            of_family = self._merchants_by_family.pick(keys, u[wanted])
            merchant[wanted] = np.where(of_family >= 0, of_family, merchant[wanted])
        return merchant

    def _usual_amount(self, card: _Ints, family: _Ints) -> _Floats:
        """An amount typical of the card at a merchant of that family."""
        usual = self._rng.normal(self._card_mu[card], self._card_sigma[card])
        return np.exp(usual) * _FAMILY_AMOUNT_SCALE[family]

    def _cash_notes(self, merchant: _Ints, amount: _Floats) -> _Floats:
        """ATMs pay out whole notes."""
        at_atm = self._merchant_channel[merchant] == _ATM
        return np.where(at_atm, _round_up(amount, _ATM_NOTE), amount)

    def _at_merchants(self, card: _Ints, merchant: _Ints, amount: _Floats) -> _Rows:
        """Rows at any terminal of their merchants (none for e-commerce), ATMs in notes."""
        count = self._terminal_count[merchant]
        offset = (self._rng.random(len(merchant)) * count).astype(np.int64)
        terminal = np.where(count > 0, self._terminal_start[merchant] + offset, -1)
        return _Rows(card, merchant, terminal, self._cash_notes(merchant, amount))

    def _records(self, columns: TransactionColumns, rows: _Rows) -> list[dict[str, object]]:
        """The contract records of a batch (the only per-record step)."""
        first = self._counter
        prefix = self._id_prefix
        card_ids, merchant_ids, terminal_ids = (
            self._card_ids,
            self._merchant_ids,
            self._terminal_ids,
        )
        records: list[dict[str, object]] = []
        for offset, (
            card,
            merchant,
            terminal,
            amount,
            currency,
            mcc,
            country,
            channel,
            present,
            at,
        ) in enumerate(
            zip(
                rows.card.tolist(),
                rows.merchant.tolist(),
                rows.terminal.tolist(),
                columns.amount.tolist(),
                columns.currency.tolist(),
                columns.mcc.tolist(),
                columns.country.tolist(),
                columns.channel.tolist(),
                columns.card_present.tolist(),
                columns.event_time.tolist(),
                strict=True,
            )
        ):
            record: dict[str, object] = {
                "transaction_id": f"{prefix}-{first + offset}",
                "card_id": card_ids[card],
                "merchant_id": merchant_ids[merchant],
            }
            if terminal >= 0:
                record["terminal_id"] = terminal_ids[terminal]
            record["amount"] = amount
            record["currency"] = currency
            record["mcc"] = mcc
            record["country"] = country
            record["channel"] = channel
            record["card_present"] = present
            record["event_time"] = at
            records.append(record)
        return records
