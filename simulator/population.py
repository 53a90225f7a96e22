"""The simulated world: cardholders and terminals on the handbook's grid, with today's fields.

Following the fraud-detection handbook (Le Borgne et al., "Reproducible Machine Learning for
Credit Card Fraud Detection", chapter 3): every customer (card) and every terminal has a place on
a 100 x 100 grid, and a customer uses the terminals within radius 5 of it. A customer spends
amounts drawn from a normal law of mean U(5, 100) and standard deviation mean / 2, and makes a
Poisson number of transactions per day with mean U(0, 4).

On top of that, the fields the service reads and the previous simulator sampled stay: cards
have a home country and its currency (issuance weighted towards big markets), terminals belong
to merchants with a merchant category code, a country and a channel (point of sale, e-commerce
with a virtual terminal, ATM). Each country is its own grid: its terminals and customers share
a square whose area is the country's share of the terminals, so every customer sees as many
terminals around it as on the handbook's single grid. A few per cent of a card's transactions
(a quarter for travellers) happen abroad, at a random terminal of another country.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.reference_data import MCC_FAMILY_CODES

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]

GRID_SIZE = 100.0
RADIUS = 5.0
MEAN_AMOUNT_RANGE = (5.0, 100.0)
STD_SHARE = 0.5  # std of a customer's amounts = mean x this
TX_PER_DAY_RANGE = (0.0, 4.0)

CHANNELS: tuple[str, ...] = ("pos", "ecom", "atm")
POS, ECOM, ATM = range(len(CHANNELS))
#: The simulated world's countries and the currency its cards there bill in (each one of the
#: country's legal tenders in contracts/reference_data.py: a test checks).
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
COUNTRIES: tuple[str, ...] = tuple(COUNTRY_CURRENCY)
#: Where cards are issued and terminals stand: most in a few big markets, a small tail.
HOME_COUNTRY_WEIGHTS: dict[str, float] = {
    "US": 0.30,
    "GB": 0.10,
    "DE": 0.09,
    "FR": 0.07,
    "ES": 0.05,
    "IT": 0.05,
    "BR": 0.04,
    "IN": 0.04,
    "CA": 0.04,
    "NL": 0.03,
    "PL": 0.03,
    "MX": 0.03,
    "JP": 0.03,
    "AU": 0.03,
    "CN": 0.02,
}
MINOR_COUNTRY_WEIGHT = 0.007
TRAVELLER_SHARE = 0.08
#: Share of a card's transactions abroad: travellers, everybody else (foreign web shops).
TRAVELLER_FOREIGN_SHARE, HOMEBODY_FOREIGN_SHARE = 0.25, 0.03

# Merchant families: the keys of MCC_FAMILY_CODES, then "other" for codes in no family.
FAMILIES: tuple[str, ...] = (*MCC_FAMILY_CODES, "other")
DIGITAL = FAMILIES.index("digital")
ATM_MCC = 6011
_UNLISTED_MCCS: tuple[int, ...] = (
    4899,
    4900,
    5200,
    5399,
    5651,
    5691,
    5942,
    5964,
    5977,
    5999,
    7230,
    7299,
    7832,
    8011,
    8099,
)
_FAMILY_MCCS: tuple[tuple[int, ...], ...] = (
    *(tuple(code for code in codes if code != ATM_MCC) for codes in MCC_FAMILY_CODES.values()),
    _UNLISTED_MCCS,
)
#: Share of terminals by channel (pos, ecom, atm); a transaction's channel is its terminal's.
TERMINAL_CHANNEL_MIX = (0.60, 0.30, 0.10)
#: Point-of-sale merchants run 1 … this many terminals (lanes); others one.
MAX_POS_TERMINALS = 4
#: Share of each family among the merchants of a channel (pos, ecom, atm).
_FAMILY_MIX: dict[str, tuple[float, float, float]] = {
    "everyday": (0.55, 0.12, 0.0),
    "travel": (0.08, 0.15, 0.0),
    "digital": (0.0, 0.30, 0.0),
    "high_value": (0.07, 0.10, 0.0),
    "cash": (0.02, 0.03, 1.0),
    "other": (0.28, 0.30, 0.0),
}
_FAMILY_CDF = np.cumsum([_FAMILY_MIX[name] for name in FAMILIES], axis=0).T


class Population(NamedTuple):
    """Cards and terminals of a simulated world (indices are positions in these arrays)."""

    card_ids: list[str]
    card_home: _Ints  # country index
    card_mean_amount: _Floats
    card_std_amount: _Floats
    card_tx_per_day: _Floats
    card_foreign_share: _Floats
    #: The terminals card c uses: card_terminals[card_terminal_start[c] : …[c + 1]].
    card_terminal_start: _Ints
    card_terminals: _Ints
    merchant_ids: list[str]
    terminal_ids: list[str]
    terminal_merchant: _Ints
    terminal_country: _Ints
    terminal_channel: _Ints
    terminal_family: _Ints
    terminal_mcc: _Ints
    country_names: npt.NDArray[np.str_]
    currency_names: npt.NDArray[np.str_]

    def expected_tx_per_day(self) -> float:
        """Mean transactions per simulated day (cards without any terminal make none)."""
        has_terminals = np.diff(self.card_terminal_start) > 0
        return float(self.card_tx_per_day[has_terminals].sum())


def choose(rng: np.random.Generator, cdf: _Floats, size: int) -> _Ints:
    """Indices drawn from a discrete distribution given as its cumulative sums."""
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(cdf) - 1)


def _country_cdf() -> _Floats:
    weights = np.array([HOME_COUNTRY_WEIGHTS.get(c, MINOR_COUNTRY_WEIGHT) for c in COUNTRIES])
    cdf: _Floats = np.cumsum(weights) / weights.sum()
    return cdf


def build_population(rng: np.random.Generator, num_cards: int, num_terminals: int) -> Population:
    """Draw the cards, merchants and terminals of a world, and which terminals each card uses."""
    country_cdf = _country_cdf()

    # Merchants, until they run num_terminals terminals; the channel probabilities per merchant
    # make the terminals' channel shares TERMINAL_CHANNEL_MIX.
    mean_lanes = np.array([(1 + MAX_POS_TERMINALS) / 2.0, 1.0, 1.0])
    per_merchant = np.array(TERMINAL_CHANNEL_MIX) / mean_lanes
    channel = choose(rng, np.cumsum(per_merchant) / per_merchant.sum(), num_terminals)
    lanes = np.where(channel == POS, rng.integers(1, MAX_POS_TERMINALS + 1, num_terminals), 1)
    num_merchants = int(np.searchsorted(np.cumsum(lanes), num_terminals)) + 1
    channel, lanes = channel[:num_merchants], lanes[:num_merchants]
    lanes[-1] -= int(lanes.sum()) - num_terminals
    family = np.minimum(
        (rng.random(num_merchants)[:, None] > _FAMILY_CDF[channel]).sum(axis=1), len(FAMILIES) - 1
    )
    mcc = np.empty(num_merchants, np.int64)
    for index, codes in enumerate(_FAMILY_MCCS):
        members = family == index
        mcc[members] = rng.choice(np.array(codes), int(members.sum()))
    mcc[channel == ATM] = ATM_MCC
    merchant_country = choose(rng, country_cdf, num_merchants)
    terminal_merchant = np.repeat(np.arange(num_merchants), lanes)
    lane = np.arange(num_terminals) - np.repeat(np.cumsum(lanes) - lanes, lanes)
    merchant_ids = [f"merch-{i:05d}" for i in range(num_merchants)]

    # Places: each country's grid is a square of area share x GRID_SIZE², so the density of
    # terminals, and the terminals around a customer, are the handbook's everywhere.
    terminal_country = merchant_country[terminal_merchant]
    terminals_in = np.bincount(terminal_country, minlength=len(COUNTRIES))
    side = GRID_SIZE * np.sqrt(np.maximum(terminals_in, 1) / num_terminals)
    merchant_xy = rng.random((num_merchants, 2)) * side[merchant_country][:, None]
    terminal_xy = merchant_xy[terminal_merchant]

    card_home = choose(rng, country_cdf, num_cards)
    card_xy = rng.random((num_cards, 2)) * side[card_home][:, None]
    mean_amount = rng.uniform(*MEAN_AMOUNT_RANGE, num_cards)
    tx_per_day = rng.uniform(*TX_PER_DAY_RANGE, num_cards)
    foreign_share = np.where(
        rng.random(num_cards) < TRAVELLER_SHARE, TRAVELLER_FOREIGN_SHARE, HOMEBODY_FOREIGN_SHARE
    )
    start, terminals = _terminals_within_radius(card_xy, card_home, terminal_xy, terminal_country)
    return Population(
        card_ids=[f"card-{i:06d}" for i in range(num_cards)],
        card_home=card_home,
        card_mean_amount=mean_amount,
        card_std_amount=mean_amount * STD_SHARE,
        card_tx_per_day=tx_per_day,
        card_foreign_share=foreign_share,
        card_terminal_start=start,
        card_terminals=terminals,
        merchant_ids=merchant_ids,
        terminal_ids=[
            f"{merchant_ids[m]}-t{k}"
            for m, k in zip(terminal_merchant.tolist(), lane.tolist(), strict=True)
        ],
        terminal_merchant=terminal_merchant,
        terminal_country=terminal_country,
        terminal_channel=channel[terminal_merchant],
        terminal_family=family[terminal_merchant],
        terminal_mcc=mcc[terminal_merchant],
        country_names=np.array(COUNTRIES, dtype="<U2"),
        currency_names=np.array([COUNTRY_CURRENCY[c] for c in COUNTRIES], dtype="<U3"),
    )


#: Cards compared with every terminal of their country at once (bounds the distance matrix).
_CARDS_PER_CHUNK = 512


def _terminals_within_radius(
    card_xy: _Floats, card_home: _Ints, terminal_xy: _Floats, terminal_country: _Ints
) -> tuple[_Ints, _Ints]:
    """For every card, the terminals of its home country within RADIUS (CSR: starts, indices)."""
    found: list[list[_Ints]] = [[] for _ in range(len(card_xy))]
    for country in np.unique(card_home).tolist():
        cards = np.flatnonzero(card_home == country)
        candidates = np.flatnonzero(terminal_country == country)
        for begin in range(0, len(cards), _CARDS_PER_CHUNK):
            chunk = cards[begin : begin + _CARDS_PER_CHUNK]
            delta = card_xy[chunk, None, :] - terminal_xy[None, candidates, :]
            near = (delta**2).sum(axis=2) <= RADIUS**2
            for card, row in zip(chunk.tolist(), near, strict=True):
                found[card].append(candidates[row])
    lists = [np.concatenate(parts) if parts else np.zeros(0, np.int64) for parts in found]
    counts = np.array([len(terminals) for terminals in lists], np.int64)
    start = np.concatenate(([0], np.cumsum(counts)))
    flat = np.concatenate(lists) if lists else np.zeros(0, np.int64)
    return start, flat.astype(np.int64)


def abroad(rng: np.random.Generator, population: Population, cards: _Ints) -> _Ints:
    """A random terminal outside each card's home country (uniform over those terminals)."""
    terminals = rng.integers(0, len(population.terminal_ids), len(cards))
    clash = np.flatnonzero(population.terminal_country[terminals] == population.card_home[cards])
    for _ in range(8):  # a few redraws; the home country holds at most a third of terminals
        if not len(clash):
            break
        terminals[clash] = rng.integers(0, len(population.terminal_ids), len(clash))
        home = population.card_home[cards[clash]]
        clash = clash[population.terminal_country[terminals[clash]] == home]
    return terminals


def log_uniform(rng: np.random.Generator, bounds: tuple[float, float], size: int) -> _Floats:
    """Draws spread evenly on a log scale between the bounds."""
    return np.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]), size))
