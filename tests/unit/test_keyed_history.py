"""The card history of the Quix Streams contender (bench/keyed_history.py): the service's
features, computed one record at a time on state a per-key store hands over as bytes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.keyed_history import KeyedHistory
from scorer.card_history import STATE_BYTES, CardHistory
from scorer.columns import TransactionColumns
from simulator.transactions import TransactionSimulator

TIME_SCALE = 40.0


@pytest.fixture(scope="module")
def stream() -> TransactionColumns:
    return TransactionSimulator(7, num_cards=200, num_terminals=400).generate(3_000).columns


def _in_store(stream: TransactionColumns, store: dict[str, bytes]) -> np.ndarray:
    """Every record of `stream` through KeyedHistory, its state in `store` by card id."""
    keyed = KeyedHistory(time_scale=TIME_SCALE)
    rows = []
    for offset in range(len(stream.amount)):
        record = stream.rows(np.array([offset]))
        (card,) = record.card_id
        row, state = keyed.update(store.get(card), record, offset)
        if state is not None:
            store[card] = state
        rows.append(row)
    return np.concatenate(rows)


def test_the_features_are_the_services_batch_features(stream: TransactionColumns) -> None:
    n = len(stream.amount)
    service = CardHistory(time_scale=TIME_SCALE).update_and_features(
        stream.card_id, stream, stream.merchant_id, np.arange(n, dtype=np.int64)
    )
    store: dict[str, bytes] = {}
    assert np.array_equal(_in_store(stream, store), service)
    assert set(store) == set(stream.card_id)
    assert {len(state) for state in store.values()} == {STATE_BYTES}


def test_a_record_read_again_changes_nothing(stream: TransactionColumns) -> None:
    store: dict[str, bytes] = {}
    _in_store(stream, store)
    last = len(stream.amount) - 1
    record = stream.rows(np.array([last]))
    (card,) = record.card_id
    row, state = KeyedHistory(time_scale=TIME_SCALE).update(store[card], record, last)
    assert state is None
    assert np.isfinite(row).all()


def test_a_stored_value_that_is_no_card_state_is_refused(stream: TransactionColumns) -> None:
    with pytest.raises(ValueError, match="not a version"):
        KeyedHistory().update(b"\x00" * 10, stream.rows(np.array([0])), 0)
