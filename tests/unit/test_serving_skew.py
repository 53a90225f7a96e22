"""No train/serve skew: a simulated stream replayed through the serving path gives every
transaction the feature row training computed for it.

Serving here is the service's own code, in the order a live system runs it: the scorer's card
state (`stream.owned_card_history.OwnedCardHistory`, batches of 256 across partitions as the
consumer makes them), the features worker's per-terminal state (`terminals.state.TerminalState`:
each transaction and each fraud label at its report time, publishing what it decides to publish),
the `terminal-risk` record as the worker encodes it (`encode_publications`) and the scorer decodes
it, and the scorer's join against its copy (`terminal_features`, what `TerminalRiskTable` runs); and
the same for each card's confirmed frauds (the worker's per-card state fed with the labels, the
`card-frauds` record, `card_features`, what `CardFraudsTable` runs).
Training is `simulator.replay.simulate`. The scorer scores a transaction before the worker has
counted it, and knows every record the worker published before (the worker runs ahead of the
scorer by less than the 7-day delay).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from contracts.card_frauds import (
    CARD_FRAUD_FEATURE_NAMES,
    CardFraudsRecord,
    decode_card_frauds,
)
from contracts.event_time import EventClock
from contracts.offsets import SourceOffset
from contracts.terminal_risk import (
    MS_PER_DAY,
    TERMINAL_FEATURE_NAMES,
    TerminalRiskRecord,
    decode_terminal_risk,
)
from contracts.transaction import Transaction
from scorer.card_frauds import card_features
from scorer.columns import TransactionColumns
from scorer.features import FEATURE_NAMES, build_features
from scorer.terminal_risk import terminal_features
from simulator.replay import REPLAY_PARTITIONS, simulate
from simulator.transactions import DEFAULT_START_TIME_MS, TransactionSimulator
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from terminals.events import LABEL, TRANSACTION, TerminalEvent
from terminals.publication import encode_publications
from terminals.state import TerminalState
from terminals.table_clock import NO_DAY, TerminalClock
from terminals.unpublished import Unpublished
from tests.unit.fakes import MemoryChangelog

SEED, DAYS, CARDS = 5, 24, 400
BATCH = 256
TOPIC = "transactions"
_TERMINAL = slice(
    len(FEATURE_NAMES) - len(CARD_FRAUD_FEATURE_NAMES) - len(TERMINAL_FEATURE_NAMES),
    len(FEATURE_NAMES) - len(CARD_FRAUD_FEATURE_NAMES),
)


class Record(NamedTuple):
    transaction: Transaction
    position: SourceOffset


class Served(NamedTuple):
    features: np.ndarray  # [rows, 41], what serving computed
    as_published: np.ndarray  # [rows, terminal features], the records' own features
    publications: int


@pytest.fixture(scope="module")
def trained_and_served() -> tuple[np.ndarray, Served]:
    stream = simulate(SEED, DAYS, CARDS)
    return stream.features, serve(stream.columns, labels())


def labels() -> list[dict[str, object]]:
    """The simulator's labels of the same run (simulate keeps only their count)."""
    simulator = TransactionSimulator(SEED, num_cards=CARDS, num_terminals=2 * CARDS)
    end_ms = DEFAULT_START_TIME_MS + DAYS * MS_PER_DAY
    out: list[dict[str, object]] = []
    while True:
        batch = simulator.generate(50_000, with_records=False)
        out.extend(batch.labels)
        if batch.columns.event_time[-1] >= end_ms:
            return [label for label in out if int(str(label["reported_at"])) < end_ms]


def serve(columns: TransactionColumns, all_labels: list[dict[str, object]]) -> Served:
    n = len(columns.amount)
    clock = EventClock(wall_ms=lambda: 2**62)  # simulated time is never in the future here
    card_history = OwnedCardHistory(
        MemoryChangelog(),
        time_scale=1.0,
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=clock,
        evict_interval_s=1e9,
    )
    card_history.restore(list(range(REPLAY_PARTITIONS)))
    worker_clock = TerminalClock(MS_PER_DAY, clock)
    scorer_copy: dict[str, TerminalRiskRecord] = {}
    card_copy: dict[str, CardFraudsRecord] = {}
    publications = 0
    history = np.empty(
        (n, len(FEATURE_NAMES) - 18 - len(TERMINAL_FEATURE_NAMES) - len(CARD_FRAUD_FEATURE_NAMES)),
        np.float32,
    )
    terminal = np.empty((n, len(TERMINAL_FEATURE_NAMES)), np.float32)
    card_frauds = np.empty((n, len(CARD_FRAUD_FEATURE_NAMES)), np.float32)
    as_published = np.zeros_like(terminal)
    frauds = sorted(
        (label for label in all_labels if label["fraud"]),
        key=lambda label: int(str(label["reported_at"])),
    )
    offsets = {TRANSACTION: 0, LABEL: 0}

    class Table:
        """What the worker's agent does with one table's events (terminals/entity_table.py), and its
        records as they go over Kafka (terminals/publication.py)."""

        def __init__(self, copy: dict[str, Any], card: bool) -> None:
            self.states: dict[str, TerminalState] = {}
            self.unpublished = Unpublished()
            self.copy, self.card = copy, card

        def publish(self, key: str, state: TerminalState) -> None:
            nonlocal publications
            publication = state.take_publication()
            if publication is None:
                return
            publications += 1
            [value] = encode_publications([(key, publication)], card=self.card)
            if value is None:
                self.copy.pop(key, None)
            elif self.card:
                self.copy[key] = decode_card_frauds(value)
            else:
                self.copy[key] = decode_terminal_risk(value)

        def apply(self, key: str, event: TerminalEvent) -> None:
            state = self.states.setdefault(key, TerminalState())
            applied = state.apply(event, worker_clock)
            if applied.publish:
                self.unpublished.discard(key)
                self.publish(key, state)
            elif applied.changed:
                day = state.as_of_day if applied.day == NO_DAY else applied.day
                self.unpublished.note(key, day)
            # The router's marks after it: the stream, in order, has reached its time (a
            # label's: its report time).
            worker_clock.advance_to(
                event.event_time if event.source == TRANSACTION else event.reported_at
            )
            for due in self.unpublished.take_due(worker_clock.watermark_day):  # the day close
                self.publish(due, self.states[due])

    terminals, cards = Table(scorer_copy, card=False), Table(card_copy, card=True)

    next_label = 0
    for start in range(0, n, BATCH):
        rows = np.arange(start, min(start + BATCH, n))
        batch = columns.rows(rows)
        for i, row in enumerate(rows.tolist()):
            # Labels reported before this transaction reach the worker first.
            while next_label < len(frauds) and int(str(frauds[next_label]["reported_at"])) < int(
                batch.event_time[i]
            ):
                label = frauds[next_label]
                offsets[LABEL] += 1
                event = TerminalEvent(
                    LABEL,
                    0,
                    offsets[LABEL],
                    int(str(label["event_time"])),
                    True,
                    int(str(label["reported_at"])),
                    str(label["transaction_id"]),
                )
                if label.get("terminal_id"):
                    terminals.apply(str(label["terminal_id"]), event)
                cards.apply(str(label["card_id"]), event)
                next_label += 1
            terminal_id = batch.terminal_id[i]
            day = np.array([int(batch.event_time[i]) // MS_PER_DAY])
            terminal[row] = terminal_features(scorer_copy, [terminal_id], day)[0]
            card_frauds[row] = card_features(card_copy, [batch.card_id[i]], day)[0]
            record = None if terminal_id is None else scorer_copy.get(terminal_id)
            if record is not None:
                as_published[row] = record.features
            if terminal_id is not None:
                offsets[TRANSACTION] += 1
                terminals.apply(
                    terminal_id,
                    TerminalEvent(TRANSACTION, 0, offsets[TRANSACTION], int(batch.event_time[i])),
                )
        history[rows] = card_history.update(list(_records(batch, start)), batch)[0]
    features = build_features(columns, history, terminal, card_frauds)
    return Served(features, as_published, publications)


def _records(batch: TransactionColumns, start: int) -> Iterator[Record]:
    for i in range(len(batch.amount)):
        card_id = batch.card_id[i]
        partition = zlib.crc32(card_id.encode()) % REPLAY_PARTITIONS
        transaction = Transaction(
            transaction_id=f"t-{start + i}",
            card_id=card_id,
            merchant_id=batch.merchant_id[i],
            terminal_id=batch.terminal_id[i],
            amount=float(batch.amount[i]),
            currency=str(batch.currency[i]),
            mcc=int(batch.mcc[i]),
            country=str(batch.country[i]),
            # The simulator draws only the contract's channels.
            channel=cast(Literal["pos", "ecom", "atm"], str(batch.channel[i])),
            card_present=bool(batch.card_present[i]),
            event_time=int(batch.event_time[i]),
        )
        yield Record(transaction, ((TOPIC, partition), start + i))


def test_every_feature_served_is_the_one_training_computed(
    trained_and_served: tuple[np.ndarray, Served],
) -> None:
    trained, served = trained_and_served
    assert served.publications > 0 and len(trained) > 10_000
    card_columns = [FEATURE_NAMES.index(name) for name in CARD_FRAUD_FEATURE_NAMES]
    assert (trained[:, card_columns] > 0).sum() > 100  # the cards' columns are exercised
    differs = ~np.isclose(served.features, trained, rtol=1e-6, atol=1e-6)
    by_feature = {FEATURE_NAMES[j]: int(differs[:, j].sum()) for j in range(len(FEATURE_NAMES))}
    assert not differs.any(), {name: count for name, count in by_feature.items() if count}


def test_the_published_features_alone_would_be_stale(
    trained_and_served: tuple[np.ndarray, Served],
) -> None:
    # The finding: the scorer used each record as of the terminal's own last day.
    trained, served = trained_and_served
    stale = ~np.isclose(served.as_published, trained[:, _TERMINAL], atol=1e-6).all(axis=1)
    assert stale.mean() > 0.2
