"""Scenario 6's held card state: many cards' histories written to the card state changelog
before the first replica starts, so that it holds them from its first restore on.

Writing the changelog is the fast honest way to a replica that holds a million cards: the load
would need hours to show it that many (the simulator has 5,000 cards), and a restore reads the
changelog whoever wrote it. Each state is a real one: `CardHistory` (what the service runs)
applies one transaction to each card, dated within the hour before the load starts, so that no
eviction round finds a card idle (idle means older than the longest window, 30 days, as of its
partition's newest event time). The cards (`held-0000000`, …) are none of the load's: a card's
state records the input offset it applied, which no made-up state of the load's cards could
honestly carry in a fresh input topic. Each record is keyed by card id and goes to the
partition that librdkafka's default partitioner chooses, as the load's producer does: the
changelog has the input's partitions, so a card's state is where its transactions would be.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
from confluent_kafka import KafkaError, Message, Producer

from scorer.card_history import CardHistory
from scorer.columns import TransactionColumns

#: Cards built per `CardHistory` (one vectorised pass each).
CHUNK = 50_000
#: The held cards' transactions happened within this long before the load starts.
HELD_AGE_MS = 3_600_000
MERCHANTS = 1_000
FLUSH_TIMEOUT_S = 300.0
QUEUE_FULL_BACKOFF_S = 0.05
PRODUCER_SETTINGS = {
    "enable.idempotence": True,
    "linger.ms": 50,
    "batch.size": 1_000_000,
    # A state is mostly zeros: lz4 writes a fraction of the 200-odd bytes per card.
    "compression.type": "lz4",
}


def held_states(cards: int, now_ms: int, seed: int) -> Iterator[list[tuple[str, bytes]]]:
    """The changelog records (card id, state) of `cards` held cards, in chunks."""
    rng = np.random.default_rng(seed)
    merchants = [f"held-merchant-{m}" for m in range(MERCHANTS)]
    for first in range(0, cards, CHUNK):
        n = min(CHUNK, cards - first)
        ids = [f"held-{i:07d}" for i in range(first, first + n)]
        merchant_ids = [merchants[m] for m in rng.integers(0, MERCHANTS, n).tolist()]
        columns = TransactionColumns(
            amount=np.round(rng.lognormal(3.5, 1.0, n), 2),
            currency=np.full(n, "EUR", "<U3"),
            mcc=np.full(n, 5411, np.int64),
            country=np.full(n, "FR", "<U2"),
            channel=np.full(n, "pos", "<U4"),
            card_present=np.ones(n, np.bool_),
            event_time=now_ms - rng.integers(0, HELD_AGE_MS, n),
            card_id=ids,
            merchant_id=merchant_ids,
            terminal_id=[None] * n,
        )
        history = CardHistory()
        history.update_and_features(ids, columns, merchant_ids, np.zeros(n, np.int64))
        yield history.take_dirty()


def write_held_states(bootstrap: str, topic: str, cards: int, *, seed: int) -> float:
    """Write `cards` held card states to the changelog `topic`; return the seconds it took.
    Raises RuntimeError when a record is not acknowledged."""
    started = time.monotonic()
    failed: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failed.append(error.str())

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    for chunk in held_states(cards, time.time_ns() // 1_000_000, seed):
        for card, state in chunk:
            while True:
                try:
                    producer.produce(topic, state, card.encode(), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(QUEUE_FULL_BACKOFF_S)
        producer.poll(0)
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left or failed:
        raise RuntimeError(
            f"held card states: {left} not acknowledged in {FLUSH_TIMEOUT_S:.0f}s, "
            f"{len(failed)} failed ({failed[:1]}): is the suite's broker up?"
        )
    return time.monotonic() - started
