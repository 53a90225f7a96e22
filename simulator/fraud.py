"""Fraud scenarios and the delayed outcomes (labels) that report them.

The handbook's three scenarios (Le Borgne et al., chapter 3), then card testing:

1. ``large_amount``: every transaction above 220 is fraud.
2. ``compromised_terminal``: each day two terminals are compromised; every transaction at them
   in the next 28 days is fraud (a skimmer: amounts look ordinary).
3. ``compromised_card``: each day three customers are compromised; in the next 14 days a third
   of their transactions are fraud, with five times the amount.
4. ``card_testing``: each day two cards are tested: a burst of 3 … 12 tiny (< 2.0) e-commerce
   purchases a minute or two apart, mostly at digital-goods merchants.

And one the simulator's default world never has, switched on mid-stream to show drift
(`TransactionSimulator.start_account_takeovers`, `make flywheel`):

5. ``account_takeover``: each day four cards' online accounts are taken over; for the next five
   days the fraudster buys once to three times a night (midnight to 4 a.m.) at e-commerce
   merchants abroad, at the card's usual amounts. Nothing in a model trained on the default
   world has seen frauds that look like that.

A later scenario overrides an earlier one's label on the same transaction, as in the handbook.
Outcomes: every fraud is confirmed after a delay drawn from a mixture of analyst reviews (hours)
and chargebacks or customer reports (days); a small sample of legitimate transactions is
confirmed legitimate by review.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scorer.columns import TINY_AMOUNT
from simulator.population import DIGITAL, ECOM, Population

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]

SCENARIOS: tuple[str, ...] = (
    "legit",
    "large_amount",
    "compromised_terminal",
    "compromised_card",
    "card_testing",
    "account_takeover",
)
LEGIT, LARGE_AMOUNT, COMPROMISED_TERMINAL, COMPROMISED_CARD, CARD_TESTING, ACCOUNT_TAKEOVER = range(
    len(SCENARIOS)
)
#: The handbook's scenarios (1-3); card testing is this project's fourth.
HANDBOOK_SCENARIOS: tuple[str, ...] = SCENARIOS[1:4]
#: What the default world holds (the shipped model's training data): all but the drift.
DEFAULT_SCENARIOS: tuple[str, ...] = SCENARIOS[:ACCOUNT_TAKEOVER]

LARGE_AMOUNT_THRESHOLD = 220.0
TERMINALS_PER_DAY, TERMINAL_DAYS = 2, 28
CARDS_PER_DAY, CARD_DAYS = 3, 14
CARD_FRAUD_SHARE, CARD_FRAUD_FACTOR = 1.0 / 3.0, 5.0
TESTED_CARDS_PER_DAY = 2
BURST_LENGTH_RANGE = (3, 12)  # inclusive
BURST_GAP_S_RANGE = (20.0, 150.0)
PROBE_AMOUNT_RANGE = (0.3, TINY_AMOUNT - 0.01)
PROBE_DIGITAL_SHARE = 0.8
TAKEOVER_CARDS_PER_DAY, TAKEOVER_DAYS = 4, 5
TAKEOVER_BUYS_PER_NIGHT = (1, 3)  # inclusive
TAKEOVER_NIGHT_S = (0.0, 4 * 3600.0)
TAKEOVER_AMOUNT_FACTOR = (0.5, 1.5)  # x the card's mean amount

#: Outcomes: share of frauds found by an analyst review (the rest: chargebacks, reports).
REVIEW_SHARE = 0.35
#: Log-normal delays: median (seconds) and spread (sigma of the log).
REVIEW_DELAY = (4 * 3600.0, 0.7)
CHARGEBACK_DELAY = (2.5 * 86_400.0, 0.5)
MAX_DELAY_S = 60 * 86_400.0
#: Share of legitimate transactions whose outcome is confirmed (by review) anyway.
LEGIT_LABEL_SHARE = 0.005

_S_PER_DAY = 86_400


class Compromised:
    """Which terminals and cards are compromised until which day (exclusive)."""

    def __init__(self) -> None:
        self.terminals: dict[int, int] = {}
        self.cards: dict[int, int] = {}
        #: Cards whose online account is taken over (ACCOUNT_TAKEOVER, once switched on).
        self.accounts: dict[int, int] = {}

    def start_day(
        self, rng: np.random.Generator, day: int, population: Population, scale: float
    ) -> None:
        """Draw the terminals and cards compromised from `day` on; forget the expired ones."""
        self.terminals = {t: end for t, end in self.terminals.items() if end > day}
        self.cards = {c: end for c, end in self.cards.items() if end > day}
        for terminal in rng.choice(
            len(population.terminal_ids), _count(rng, TERMINALS_PER_DAY, scale), replace=False
        ).tolist():
            self.terminals[terminal] = day + TERMINAL_DAYS
        for card in rng.choice(
            len(population.card_ids), _count(rng, CARDS_PER_DAY, scale), replace=False
        ).tolist():
            self.cards[card] = day + CARD_DAYS

    def start_takeovers_day(
        self, rng: np.random.Generator, day: int, population: Population, scale: float
    ) -> None:
        """Draw the accounts taken over from `day` on; forget the expired ones."""
        self.accounts = {c: end for c, end in self.accounts.items() if end > day}
        for card in rng.choice(
            len(population.card_ids), _count(rng, TAKEOVER_CARDS_PER_DAY, scale), replace=False
        ).tolist():
            self.accounts[card] = day + TAKEOVER_DAYS


def _count(rng: np.random.Generator, per_day: int, scale: float) -> int:
    """per_day x scale, the fraction drawn at random (so that any scale has its mean)."""
    expected = per_day * scale
    whole = int(expected)
    return whole + int(rng.random() < expected - whole)


def label_frauds(
    rng: np.random.Generator,
    compromised: Compromised,
    card: _Ints,
    terminal: _Ints,
    amount: _Floats,
    enabled: bool,
) -> npt.NDArray[np.int8]:
    """Scenario code of each legit-generated row (in place: compromised cards' amounts x 5)."""
    scenario = np.zeros(len(card), np.int8)
    if not enabled:
        return scenario
    scenario[amount > LARGE_AMOUNT_THRESHOLD] = LARGE_AMOUNT
    if compromised.terminals:
        scenario[np.isin(terminal, list(compromised.terminals))] = COMPROMISED_TERMINAL
    if compromised.cards:
        hit = np.isin(card, list(compromised.cards)) & (rng.random(len(card)) < CARD_FRAUD_SHARE)
        amount[hit] = np.round(amount[hit] * CARD_FRAUD_FACTOR, 2)
        scenario[hit] = COMPROMISED_CARD
    return scenario


class Probes(NamedTuple):
    """Card-testing rows of one day."""

    card: _Ints
    terminal: _Ints
    second: _Floats  # seconds into the day
    amount: _Floats


def card_testing(rng: np.random.Generator, population: Population, scale: float) -> Probes:
    """Today's card-testing bursts: a few cards, each probed by a burst of tiny ecom buys."""
    ecom = np.flatnonzero(population.terminal_channel == ECOM)
    bursts = _count(rng, TESTED_CARDS_PER_DAY, scale) if len(ecom) else 0
    low, high = BURST_LENGTH_RANGE
    length = rng.integers(low, high + 1, bursts)
    n = int(length.sum())
    card = np.repeat(rng.integers(0, len(population.card_ids), bursts), length)
    latest_start = _S_PER_DAY - high * BURST_GAP_S_RANGE[1]
    first = np.repeat(rng.uniform(0, latest_start, bursts), length)
    gaps = rng.uniform(*BURST_GAP_S_RANGE, n)
    burst_first = np.cumsum(length) - length
    gaps[burst_first] = 0.0
    elapsed = np.cumsum(gaps)
    since_first = elapsed - np.repeat(elapsed[burst_first], length)
    digital = ecom[population.terminal_family[ecom] == DIGITAL]
    digital = digital if len(digital) else ecom
    terminal = np.where(
        rng.random(n) < PROBE_DIGITAL_SHARE,
        digital[rng.integers(0, max(len(digital), 1), n)] if n else card,
        ecom[rng.integers(0, max(len(ecom), 1), n)] if n else card,
    )
    amount = np.round(rng.uniform(*PROBE_AMOUNT_RANGE, n), 2)
    return Probes(card, terminal, first + since_first, amount)


def account_takeovers(
    rng: np.random.Generator, population: Population, accounts: list[int]
) -> Probes:
    """Tonight's purchases on the taken-over `accounts`: e-commerce, abroad, usual amounts."""
    low, high = TAKEOVER_BUYS_PER_NIGHT
    buys = rng.integers(low, high + 1, len(accounts))
    card = np.repeat(np.asarray(accounts, np.int64), buys)
    ecom = np.flatnonzero(population.terminal_channel == ECOM)
    terminal = ecom[rng.integers(0, len(ecom), len(card))] if len(ecom) else card
    home = population.card_home[card]
    clash = np.flatnonzero(population.terminal_country[terminal] == home)
    for _ in range(8):  # a few redraws, as `abroad` does
        if not len(clash) or not len(ecom):
            break
        terminal[clash] = ecom[rng.integers(0, len(ecom), len(clash))]
        clash = clash[population.terminal_country[terminal[clash]] == home[clash]]
    second = rng.uniform(*TAKEOVER_NIGHT_S, len(card))
    amount = np.round(
        population.card_mean_amount[card] * rng.uniform(*TAKEOVER_AMOUNT_FACTOR, len(card)), 2
    )
    return Probes(card, terminal, second, amount)


def outcome_delays_s(rng: np.random.Generator, is_fraud: npt.NDArray[np.bool_]) -> _Floats:
    """Seconds from each transaction to its confirmed outcome; NaN: never confirmed."""
    n = len(is_fraud)
    review = rng.random(n) < REVIEW_SHARE
    median = np.where(review, REVIEW_DELAY[0], CHARGEBACK_DELAY[0])
    sigma = np.where(review, REVIEW_DELAY[1], CHARGEBACK_DELAY[1])
    fraud_delay = np.minimum(median * np.exp(sigma * rng.standard_normal(n)), MAX_DELAY_S)
    legit_delay = REVIEW_DELAY[0] * np.exp(REVIEW_DELAY[1] * rng.standard_normal(n))
    sampled = rng.random(n) < LEGIT_LABEL_SHARE
    return np.where(is_fraud, fraud_delay, np.where(sampled, legit_delay, np.nan))
