"""Seeded, repeatable stream of simulated card transactions, fraud labels and delayed outcomes.

The world (`simulator/population.py`) and the fraud scenarios (`simulator/fraud.py`) follow the
fraud-detection handbook (Le Borgne et al.), so results compare with its published tables; the
transaction fields the service reads beyond the handbook's (currency, mcc, country, channel,
card_present) come with the cards and terminals.

The stream is simulated a day at a time, as in the handbook: each customer makes a Poisson
number of transactions, at times of day drawn from a normal law around noon (sd 20,000 s, times
outside the day dropped), with amounts from its own normal law. `generate(n)` hands out the next
n transactions in event-time order, with the outcomes (labels) that became known meanwhile.

Time: by default event time is the simulated clock itself (a simulated day lasts a day).
`generate(..., rate_per_s=R)` compresses (or stretches) time so that the stream comes out at
about R transactions per event-time second; the batch says by how much (`time_scale`), so a
service fed in compressed time can shrink its windows to match (`CardHistory(time_scale=…)`,
terminal-risk days of `86_400_000 / time_scale` ms). Outcome delays shrink with the same clock,
and `label_delay_scale` shortens (or lengthens) them further.

The same seed and the same sequence of `generate` calls give the same transactions and labels;
how the stream is cut into calls changes neither (only the event times, through `rate_per_s`).
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.transaction import MAX_AMOUNT, MAX_ID_CHARS
from scorer.columns import TransactionColumns
from simulator.fraud import (
    ACCOUNT_TAKEOVER,
    CARD_TESTING,
    SCENARIOS,
    Compromised,
    Probes,
    account_takeovers,
    card_testing,
    label_frauds,
    outcome_delays_s,
)
from simulator.population import CHANNELS, DIGITAL, ECOM, Population, abroad, build_population

__all__ = ["DEFAULT_START_TIME_MS", "SCENARIOS", "SimulatedBatch", "TransactionSimulator"]

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]

#: 2026-01-05 00:00:00 UTC, a Monday.
DEFAULT_START_TIME_MS = 1_767_571_200_000
#: The handbook's population.
DEFAULT_CARDS, DEFAULT_TERMINALS = 5_000, 10_000
MAX_FRAUD_SCALE = 10.0
#: Room left in a transaction_id for "-" and the counter (at most 20 digits, as a uint64).
MAX_ID_PREFIX_CHARS = MAX_ID_CHARS - 21
DEFAULT_ID_PREFIX = "tx"


def transaction_id(counter: int, prefix: str = DEFAULT_ID_PREFIX) -> str:
    """The id of a simulator's `counter`-th transaction (counted from 0)."""
    return f"{prefix}-{counter}"


def row_of(transaction: str) -> int:
    """The counter of a simulated transaction's id (`transaction_id` read back)."""
    return int(transaction.rsplit("-", 1)[1])


#: Time of day of transactions: normal around noon, as in the handbook.
TIME_OF_DAY_MEAN_S, TIME_OF_DAY_SD_S = 43_200.0, 20_000.0
#: Legitimate micro purchases (apps, games) among digital-goods purchases, which card testing
#: hides among.
LEGIT_MICRO_SHARE = 0.12
MICRO_AMOUNT_RANGE = (0.3, 2.0)
MIN_AMOUNT = 0.01

_S_PER_DAY = 86_400
_MS_PER_S = 1000
_MS_PER_DAY = _S_PER_DAY * _MS_PER_S
_KEPT_SHARE = math.erf(TIME_OF_DAY_MEAN_S / TIME_OF_DAY_SD_S / math.sqrt(2.0))


class SimulatedBatch(NamedTuple):
    """The next transactions of a simulated stream, as columns and as contract records."""

    columns: TransactionColumns
    #: JSON-ready dicts with exactly the contract fields (empty if not asked for).
    records: list[dict[str, object]]
    is_fraud: npt.NDArray[np.bool_]
    #: One of SCENARIOS per row.
    scenario: npt.NDArray[np.str_]
    #: Label records (the `labels` topic's contract) that became known up to this batch's last
    #: event time, in the order they became known.
    labels: list[dict[str, object]]
    #: Index of each row's card and terminal in the simulator's population.
    card: _Ints
    terminal: _Ints
    #: Simulated seconds per event-time second used for this batch (1: real time).
    time_scale: float


class _Day(NamedTuple):
    card: _Ints
    terminal: _Ints
    natural_ms: _Ints  # simulated ms since the start
    amount: _Floats
    scenario: npt.NDArray[np.int8]
    outcome_ms: _Floats  # simulated ms from the transaction to its outcome; NaN: none


def _validate_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def _validate_number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not low <= value <= high:  # also rejects NaN
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)


class TransactionSimulator:
    """A continuing stream of simulated transactions from a fixed, seeded population.

    Each call of `generate` returns the next transactions of the same stream: the clock, the
    transaction counter, the compromised terminals and cards, the outcomes still to come and the
    random state carry on from the previous call.
    """

    def __init__(
        self,
        seed: int,
        *,
        fraud_scale: float = 1.0,
        num_cards: int = DEFAULT_CARDS,
        num_terminals: int = DEFAULT_TERMINALS,
        start_time_ms: int = DEFAULT_START_TIME_MS,
        id_prefix: str = DEFAULT_ID_PREFIX,
        label_delay_scale: float = 1.0,
    ) -> None:
        """Build the population of cards, merchants and terminals.

        Args:
            seed: seeds every random choice of the population and the stream.
            fraud_scale: multiplies the terminals and cards compromised (and cards tested) per
                day, 0 to MAX_FRAUD_SCALE; 0 turns every scenario off (amounts over 220 too).
            num_cards: customers (cards), at least 1; the handbook has 5,000.
            num_terminals: terminals, at least 1; the handbook has 10,000.
            start_time_ms: event_time (epoch ms) of the simulated day 0's midnight.
            id_prefix: transaction ids are f"{id_prefix}-{counter}".
            label_delay_scale: multiplies every outcome delay (0.01: a hundred times sooner).

        Raises:
            TypeError: an argument has the wrong type.
            ValueError: an argument is out of range.
        """
        _validate_int("seed", seed, 0)
        self._fraud_scale = _validate_number("fraud_scale", fraud_scale, 0.0, MAX_FRAUD_SCALE)
        _validate_int("num_cards", num_cards, 1)
        _validate_int("num_terminals", num_terminals, 1)
        _validate_int("start_time_ms", start_time_ms, 0)
        self._label_delay_scale = _validate_number("label_delay_scale", label_delay_scale, 0.0, 1e6)
        if not isinstance(id_prefix, str):
            raise TypeError(f"id_prefix must be a str, got {id_prefix!r}")
        if not 1 <= len(id_prefix) <= MAX_ID_PREFIX_CHARS:
            raise ValueError(
                f"id_prefix must be 1 to {MAX_ID_PREFIX_CHARS} characters, got {id_prefix!r}"
            )
        self._rng = np.random.default_rng(seed)
        self._id_prefix = id_prefix
        self.population: Population = build_population(self._rng, num_cards, num_terminals)
        self._compromised = Compromised()
        self._day = 0
        self._counter = 0
        self._pending: list[_Day] = []
        # Event time = anchor_event + (simulated ms - anchor_natural) / scale.
        self._scale = 1.0
        self._anchor_event = start_time_ms
        self._anchor_natural = 0
        self._last_event = start_time_ms
        self._last_natural = 0
        self._labels: list[tuple[int, int, dict[str, object]]] = []  # heap by reported_at
        self._takeovers = False

    @property
    def id_prefix(self) -> str:
        """Transaction ids are f"{id_prefix}-{counter}"."""
        return self._id_prefix

    @property
    def natural_rate_per_s(self) -> float:
        """Transactions per simulated second, on average over a day."""
        return self.population.expected_tx_per_day() * _KEPT_SHARE / _S_PER_DAY

    # The stream.

    def generate(
        self, n: int, *, rate_per_s: float | None = None, with_records: bool = True
    ) -> SimulatedBatch:
        """Return the next `n` transactions of the stream (and the outcomes known by then).

        `rate_per_s`: compress simulated time so the stream comes out at about this many
        transactions per event-time second (None: real time). `with_records=False` skips the
        contract dicts (training needs only the columns).

        Raises:
            TypeError: an argument has the wrong type.
            ValueError: `n` is negative or `rate_per_s` is not a positive finite number.
        """
        _validate_int("n", n, 0)
        scale = 1.0
        if rate_per_s is not None:
            if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float):
                raise TypeError(f"rate_per_s must be a number, got {rate_per_s!r}")
            if not (math.isfinite(rate_per_s) and rate_per_s > 0):
                raise ValueError(f"rate_per_s must be a positive finite number, got {rate_per_s!r}")
            scale = max(rate_per_s / max(self.natural_rate_per_s, 1e-12), 1e-9)
        rows = self._take(n)
        if scale != self._scale:
            self._anchor_event, self._anchor_natural = self._last_event, self._last_natural
            self._scale = scale
        offset_ms = (rows.natural_ms - self._anchor_natural) / scale
        event_time = self._anchor_event + np.floor(offset_ms).astype(np.int64)
        if n:
            self._last_event, self._last_natural = int(event_time[-1]), int(rows.natural_ms[-1])
        population = self.population
        terminal = rows.terminal
        channel = population.terminal_channel[terminal]
        columns = TransactionColumns(
            amount=rows.amount,
            currency=population.currency_names[population.card_home[rows.card]],
            mcc=population.terminal_mcc[terminal],
            country=population.country_names[population.terminal_country[terminal]],
            channel=np.array(CHANNELS, dtype="<U4")[channel],
            card_present=channel != ECOM,
            event_time=event_time,
            card_id=[population.card_ids[c] for c in rows.card.tolist()],
            merchant_id=[
                population.merchant_ids[m] for m in population.terminal_merchant[terminal].tolist()
            ],
            terminal_id=[population.terminal_ids[t] for t in terminal.tolist()],
        )
        first = self._counter
        self._counter += n
        ids = [transaction_id(first + i, self._id_prefix) for i in range(n)]
        records = _records(ids, columns) if with_records else []
        self._queue_labels(ids, columns, rows, event_time, scale)
        labels: list[dict[str, object]] = []
        while self._labels and self._labels[0][0] <= self._last_event:
            labels.append(heapq.heappop(self._labels)[2])
        return SimulatedBatch(
            columns=columns,
            records=records,
            is_fraud=rows.scenario != 0,
            scenario=np.array(SCENARIOS)[rows.scenario],
            labels=labels,
            card=rows.card,
            terminal=terminal,
            time_scale=scale,
        )

    def start_account_takeovers(self) -> None:
        """Switch the drift scenario on (`simulator/fraud.py`, account_takeover): from the next
        simulated day on, accounts are taken over. Days already simulated stay as they were."""
        self._takeovers = True

    def pending_labels(self) -> list[dict[str, object]]:
        """Every outcome not yet handed out (reported after the last batch), in report order."""
        pending = [heapq.heappop(self._labels)[2] for _ in range(len(self._labels))]
        return pending

    def _queue_labels(
        self,
        ids: list[str],
        columns: TransactionColumns,
        rows: _Day,
        event_time: _Ints,
        scale: float,
    ) -> None:
        confirmed = np.flatnonzero(~np.isnan(rows.outcome_ms))
        delay_ms = rows.outcome_ms[confirmed] * self._label_delay_scale / scale
        reported = (event_time[confirmed] + np.ceil(delay_ms)).astype(np.int64)
        for i, at in zip(confirmed.tolist(), reported.tolist(), strict=True):
            label: dict[str, object] = {
                "transaction_id": ids[i],
                "card_id": columns.card_id[i],
                "terminal_id": columns.terminal_id[i],
                "fraud": bool(rows.scenario[i] != 0),
                "event_time": int(event_time[i]),
                "reported_at": at,
            }
            heapq.heappush(self._labels, (at, self._counter - len(ids) + i, label))

    def _take(self, n: int) -> _Day:
        """The next n simulated transactions, simulating further days as needed."""
        have = sum(len(day.card) for day in self._pending)
        while have < n:
            day = self._simulate_day()
            self._pending.append(day)
            have += len(day.card)
        pending = (
            _Day._make(np.concatenate(parts) for parts in zip(*self._pending, strict=True))
            if self._pending
            else _empty_day()
        )
        taken = _Day._make(column[:n] for column in pending)
        rest = _Day._make(column[n:] for column in pending)
        self._pending = [rest] if len(rest.card) else []
        return taken

    def _simulate_day(self) -> _Day:
        """One simulated day of the whole population, sorted by time."""
        rng = self._rng
        population = self.population
        day = self._day
        self._day += 1
        enabled = self._fraud_scale > 0
        if enabled:
            self._compromised.start_day(rng, day, population, self._fraud_scale)

        usable = np.diff(population.card_terminal_start)
        counts = rng.poisson(np.where(usable > 0, population.card_tx_per_day, 0.0))
        card = np.repeat(np.arange(len(usable)), counts)
        second = rng.normal(TIME_OF_DAY_MEAN_S, TIME_OF_DAY_SD_S, len(card))
        kept = (second > 0) & (second < _S_PER_DAY)
        card, second = card[kept], second[kept]
        size = len(card)
        mean = population.card_mean_amount[card]
        amount = rng.normal(mean, population.card_std_amount[card])
        negative = amount < 0
        amount[negative] = rng.uniform(0, 2 * mean[negative])
        start = population.card_terminal_start[card]
        local = start + (rng.random(size) * usable[card]).astype(np.int64)
        terminal = population.card_terminals[np.minimum(local, len(population.card_terminals) - 1)]
        foreign = rng.random(size) < population.card_foreign_share[card]
        terminal[foreign] = abroad(rng, population, card[foreign])
        micro = (population.terminal_family[terminal] == DIGITAL) & (
            rng.random(size) < LEGIT_MICRO_SHARE
        )
        amount[micro] = rng.uniform(*MICRO_AMOUNT_RANGE, int(micro.sum()))
        amount = np.round(amount, 2)
        scenario = label_frauds(rng, self._compromised, card, terminal, amount, enabled)

        extra: list[tuple[Probes, int]] = []
        if enabled:
            extra.append((card_testing(rng, population, self._fraud_scale), CARD_TESTING))
        # Only once switched on: the default world's random draws stay as they were.
        if enabled and self._takeovers:
            self._compromised.start_takeovers_day(rng, day, population, self._fraud_scale)
            accounts = sorted(self._compromised.accounts)
            extra.append((account_takeovers(rng, population, accounts), ACCOUNT_TAKEOVER))
        for probes, code in extra:
            card = np.concatenate((card, probes.card))
            terminal = np.concatenate((terminal, probes.terminal))
            second = np.concatenate((second, probes.second))
            amount = np.concatenate((amount, probes.amount))
            scenario = np.concatenate((scenario, np.full(len(probes.card), code, np.int8)))
        order = np.argsort(second, kind="stable")
        natural_ms = day * _MS_PER_DAY + np.floor(second[order] * _MS_PER_S).astype(np.int64)
        scenario = scenario[order]
        outcome_ms = outcome_delays_s(rng, scenario != 0) * _MS_PER_S
        return _Day(
            card=card[order],
            terminal=terminal[order],
            natural_ms=natural_ms,
            amount=np.clip(amount[order], MIN_AMOUNT, MAX_AMOUNT),
            scenario=scenario,
            outcome_ms=outcome_ms,
        )


def _empty_day() -> _Day:
    empty = np.zeros(0, np.int64)
    return _Day(empty, empty, empty, np.zeros(0), np.zeros(0, np.int8), np.zeros(0))


def _records(ids: list[str], columns: TransactionColumns) -> list[dict[str, object]]:
    """The contract records of a batch (the only per-record step)."""
    return [
        {
            "transaction_id": transaction_id,
            "card_id": card_id,
            "merchant_id": merchant_id,
            "terminal_id": terminal_id,
            "amount": amount,
            "currency": currency,
            "mcc": mcc,
            "country": country,
            "channel": channel,
            "card_present": present,
            "event_time": at,
        }
        for (
            transaction_id,
            card_id,
            merchant_id,
            terminal_id,
            amount,
            currency,
            mcc,
            country,
            channel,
            present,
            at,
        ) in zip(
            ids,
            columns.card_id,
            columns.merchant_id,
            columns.terminal_id,
            columns.amount.tolist(),
            columns.currency.tolist(),
            columns.mcc.tolist(),
            columns.country.tolist(),
            columns.channel.tolist(),
            columns.card_present.tolist(),
            columns.event_time.tolist(),
            strict=True,
        )
    ]
