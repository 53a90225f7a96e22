"""Per-card history (scorer/card_history.py): order, idempotence, restore, eviction, robustness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.transaction import MAX_AMOUNT, MAX_EVENT_TIME_MS, MAX_ID_CHARS
from scorer.card_history import (
    HISTORY_FEATURE_NAMES,
    MS_PER_DAY,
    MS_PER_HOUR,
    STATE_BYTES,
    CardHistory,
    neutral_history,
)
from scorer.card_history_store import _OFFSET_AT
from scorer.columns import TransactionColumns
from scorer.features import FEATURE_NAMES, build_features
from simulator.transactions import TransactionSimulator

COLUMN = {name: i for i, name in enumerate(HISTORY_FEATURE_NAMES)}


def columns(
    cards: list[str],
    times: list[int],
    amounts: list[float] | None = None,
    channel: str = "pos",
    merchants: list[str] | None = None,
    countries: list[str] | None = None,
) -> TransactionColumns:
    n = len(cards)
    return TransactionColumns(
        amount=np.array(amounts or [20.0] * n, np.float64),
        currency=np.array(["EUR"] * n),
        mcc=np.full(n, 5411),
        country=np.array(countries or ["FR"] * n),
        channel=np.array([channel] * n),
        card_present=np.full(n, channel != "ecom"),
        event_time=np.array(times, np.int64),
        card_id=cards,
        merchant_id=merchants or [f"m{i}" for i in range(n)],
        terminal_id=[None] * n,
    )


def run(history: CardHistory, batch: TransactionColumns, offsets: list[int]) -> np.ndarray:
    return history.update_and_features(
        batch.card_id, batch, batch.merchant_id, np.array(offsets, np.int64)
    )


@pytest.fixture(scope="module")
def stream() -> TransactionColumns:
    return TransactionSimulator(5, num_cards=300, num_terminals=600).generate(6_000).columns


def replay(stream: TransactionColumns, batch_size: int) -> np.ndarray:
    history = CardHistory()
    n = len(stream.amount)
    parts = []
    for begin in range(0, n, batch_size):
        rows = np.arange(begin, min(begin + batch_size, n))
        part = stream.rows(rows)
        parts.append(run(history, part, rows.tolist()))
    return np.concatenate(parts)


def test_features_do_not_depend_on_how_the_stream_is_batched(stream: TransactionColumns) -> None:
    one_by_one = replay(stream, 1)
    assert np.array_equal(replay(stream, 256), one_by_one)
    assert np.array_equal(replay(stream, 37), one_by_one)
    assert np.isfinite(one_by_one).all()


def test_a_batch_applies_each_card_in_event_time_order() -> None:
    hour = MS_PER_HOUR
    shuffled = run(
        CardHistory(), columns(["a", "b", "a", "a"], [3 * hour, 0, hour, 2 * hour]), [0, 1, 2, 3]
    )
    ordered = run(
        CardHistory(), columns(["a", "a", "a", "b"], [hour, 2 * hour, 3 * hour, 0]), [0, 1, 2, 3]
    )
    assert np.allclose(shuffled[[2, 3, 0, 1]], ordered)
    # Each transaction of card a sees the ones before it within the day.
    day_counts = ordered[:3, COLUMN["card_tx_1d"]]
    assert day_counts[0] == pytest.approx(np.log1p(1.0))
    assert day_counts[0] < day_counts[1] < day_counts[2] < np.log1p(3.0)


def test_windows_count_and_decay() -> None:
    history = CardHistory()
    minute = 60_000
    burst = run(
        history, columns(["c"] * 3, [0, minute, 2 * minute], [1.0, 1.5, 0.5], "ecom"), [0, 1, 2]
    )
    assert burst[2, COLUMN["card_tx_1h"]] == pytest.approx(np.log1p(3), abs=0.05)
    assert burst[2, COLUMN["card_testing_velocity"]] > burst[0, COLUMN["card_testing_velocity"]]
    later = run(history, columns(["c"], [10 * MS_PER_HOUR], [50.0]), [3])
    assert later[0, COLUMN["card_tx_1h"]] == pytest.approx(np.log1p(1), abs=0.01)
    assert later[0, COLUMN["card_tx_30d"]] == pytest.approx(np.log1p(4), abs=0.05)
    assert later[0, COLUMN["card_since_previous"]] == pytest.approx(np.log1p(10 * 3600 - 120))
    assert later[0, COLUMN["card_amount_zscore"]] > 5  # far above the card's tiny amounts


def test_distinct_merchants_and_countries_of_the_last_day() -> None:
    batch = columns(
        ["d"] * 4, [0, 1, 2, 3], merchants=["x", "y", "x", "z"], countries=["FR", "DE", "FR", "FR"]
    )
    out = run(CardHistory(), batch, [0, 1, 2, 3])
    assert out[:, COLUMN["card_distinct_merchants_1d"]].tolist() == [1, 2, 2, 3]
    assert out[:, COLUMN["card_distinct_countries_1d"]].tolist() == [1, 2, 2, 2]


def test_a_record_read_again_is_not_applied_twice() -> None:
    history = CardHistory()
    batch = columns(["e", "e", "f"], [0, 1_000, 2_000])
    first = run(history, batch, [10, 11, 12])
    saved = dict(history.take_dirty())
    again = run(history, batch, [10, 11, 12])
    assert history.take_dirty() == []  # nothing changed
    assert again[1, COLUMN["card_tx_1h"]] == pytest.approx(first[1, COLUMN["card_tx_1h"]])
    # A batch that overlaps what was applied applies only what is new.
    more = run(history, columns(["e", "e"], [1_000, 5_000]), [11, 13])
    assert more[1, COLUMN["card_tx_1h"]] == pytest.approx(np.log1p(3), abs=0.01)
    assert set(saved) == {"e", "f"}


def test_cards_changed_over_many_batches_are_taken_once_each() -> None:
    # More rows marked than the store has (an owner that takes rarely, e.g. training): each
    # changed card still comes out once, with its latest state.
    history = CardHistory()
    cards = [f"k{i}" for i in range(300)]
    for batch in range(20):
        run(history, columns(cards, [batch * 1_000] * 300), [batch] * 300)
    taken = history.take_dirty()
    assert sorted(card for card, _ in taken) == sorted(cards)
    assert history.take_dirty() == []
    run(history, columns(["k7"], [99_000]), [99])
    history.evict_idle(99_000 + 40 * MS_PER_DAY)  # forgotten before it was taken
    assert history.take_dirty() == []


def test_restore_from_the_changelog_gives_the_same_features() -> None:
    original = CardHistory()
    run(original, columns(["g", "h", "g"], [0, 10, 20], [5.0, 7.0, 9.0]), [0, 1, 2])
    changelog = original.take_dirty()
    assert all(len(state) == STATE_BYTES for _, state in changelog)
    restored = CardHistory()
    assert restored.restore(changelog) == []
    assert len(restored) == 2 and restored.take_dirty() == []
    nxt = columns(["g", "h"], [MS_PER_HOUR, MS_PER_HOUR], [300.0, 1.0])
    assert np.array_equal(run(original, nxt, [3, 4]), run(restored, nxt, [3, 4]))
    assert restored.restore([("g", None)]) == []
    assert "g" not in restored and len(restored) == 1
    rejected = restored.restore([("h", b"\x02" + bytes(STATE_BYTES - 1)), ("i", b"\x01")])
    assert len(rejected) == 2 and all("not a version 1 card state" in r for r in rejected)
    assert len(restored) == 0, "a card whose state cannot be read starts anew"


def written_twice() -> tuple[CardHistory, dict[str, bytes], dict[str, bytes]]:
    """A history whose cards a and b each applied a transaction (their states: the first
    dict), then a a second one (its state: the second dict)."""
    original = CardHistory()
    run(original, columns(["a", "b"], [0, 10], [5.0, 7.0]), [0, 1])
    first = dict(original.take_dirty())
    run(original, columns(["a"], [20], [9.0]), [2])
    return original, first, dict(original.take_dirty())


def test_a_restore_chunk_leaves_each_card_as_its_last_record_says() -> None:
    original, first, second = written_twice()
    one_by_one, chunked = CardHistory(), CardHistory()
    changelog = [("a", first["a"]), ("b", first["b"]), ("b", None), ("a", second["a"])]
    for record in changelog:
        one_by_one.restore([record])
    chunked.restore(changelog)
    assert "b" not in chunked and len(chunked) == 1
    nxt = columns(["a"], [MS_PER_HOUR], [1.0])
    expected = run(original, nxt, [3])
    assert np.array_equal(run(one_by_one, nxt, [3]), expected)
    assert np.array_equal(run(chunked, nxt, [3]), expected)


def test_an_older_state_never_replaces_a_newer_one_in_a_run_of_distinct_cards() -> None:
    # A run of distinct cards, all states, loads in one pass (most chunks of a compacted
    # changelog): it must keep the offset rule of the record-by-record path.
    _, first, second = written_twice()
    restored = CardHistory()
    assert restored.restore([("a", second["a"])]) == []
    # A retry wrote a's older state again, after the newer one: a is not rolled back.
    assert restored.restore([("a", first["a"]), ("b", first["b"])]) == []
    assert restored.state_of("a") == second["a"] and restored.state_of("b") == first["b"]
    assert restored.take_dirty() == [], "a restored card is not dirty"


def test_both_restore_paths_leave_out_a_state_whose_offset_no_record_has() -> None:
    # A state whose input offset is below -1 (no record has one: a corrupt changelog) is older
    # than even a card not held; one record at a time and a run of distinct cards agree.
    _, first, _ = written_twice()
    corrupt = bytearray(first["a"])
    corrupt[_OFFSET_AT : _OFFSET_AT + 8] = (-5).to_bytes(8, "little", signed=True)
    one_by_one, distinct = CardHistory(), CardHistory()
    one_by_one.restore([("a", bytes(corrupt)), ("a", bytes(corrupt))])  # a repeat: step by step
    distinct.restore([("a", bytes(corrupt)), ("b", first["b"])])
    assert "a" not in one_by_one and "a" not in distinct and "b" in distinct


def test_idle_cards_are_evicted_after_the_longest_window() -> None:
    history = CardHistory()
    run(history, columns(["old", "new"], [0, 20 * MS_PER_DAY]), [0, 1])
    assert history.evict_idle(29 * MS_PER_DAY) == []
    assert history.evict_idle(31 * MS_PER_DAY) == ["old"]
    assert len(history) == 1 and "old" not in history
    assert [card_id for card_id, _ in history.take_dirty()] == ["new"]


def test_memory_is_fixed_per_card() -> None:
    history = CardHistory()
    cards = [f"card-{i:07d}" for i in range(20_000)]
    batch = columns(cards, list(range(len(cards))))
    run(history, batch, list(range(len(cards))))
    per_card = history.nbytes / len(history)
    assert per_card < 400
    run(history, batch, list(range(len(cards), 2 * len(cards))))
    assert history.nbytes / len(history) == pytest.approx(per_card)


def test_time_scale_shrinks_every_window() -> None:
    fast = CardHistory(time_scale=24.0)
    out = run(fast, columns(["k", "k"], [0, MS_PER_HOUR]), [0, 1])  # a compressed day
    assert out[1, COLUMN["card_tx_1d"]] == pytest.approx(np.log1p(1 + np.exp(-1)), abs=0.01)
    with pytest.raises(ValueError, match="time_scale"):
        CardHistory(time_scale=0.0)


def test_unknown_history_is_that_of_a_new_card() -> None:
    batch = columns(["n1", "n2"], [0, 5], [10.0, 3.0])
    assert np.array_equal(neutral_history(batch), run(CardHistory(), batch, [0, 1]))
    full = build_features(batch)
    assert full.shape == (2, len(FEATURE_NAMES)) and np.isfinite(full).all()


ids = st.text(min_size=1, max_size=MAX_ID_CHARS)
transaction = st.tuples(
    st.sampled_from(["c1", "c2", "c3"]) | ids,
    ids,
    st.floats(min_value=0.01, max_value=MAX_AMOUNT),
    st.integers(0, 9999),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=2, max_size=2),
    st.sampled_from(["pos", "ecom", "atm"]),
    st.integers(0, MAX_EVENT_TIME_MS),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.lists(transaction, min_size=0, max_size=12), min_size=1, max_size=4))
def test_extreme_valid_values_never_raise_nor_give_non_finite_features(
    batches: list[list[tuple[str, str, float, int, str, str, int]]],
) -> None:
    history = CardHistory()
    offset = 0
    for rows in batches:
        n = len(rows)
        batch = TransactionColumns(
            amount=np.array([r[2] for r in rows], np.float64),
            currency=np.array(["USD"] * n, dtype="<U3"),
            mcc=np.array([r[3] for r in rows], np.int64),
            country=np.array([r[4] for r in rows], dtype="<U2"),
            channel=np.array([r[5] for r in rows], dtype="<U4"),
            card_present=np.array([r[5] != "ecom" for r in rows], np.bool_),
            event_time=np.array([r[6] for r in rows], np.int64),
            card_id=[r[0] for r in rows],
            merchant_id=[r[1] for r in rows],
            terminal_id=[None] * n,
        )
        out = run(history, batch, list(range(offset, offset + n)))
        offset += n
        assert out.shape == (n, len(HISTORY_FEATURE_NAMES))
        assert np.isfinite(out).all()
        assert np.isfinite(build_features(batch, out)).all()
    assert CardHistory().restore(history.take_dirty()) == []
    history.evict_idle(MAX_EVENT_TIME_MS + 31 * MS_PER_DAY)
    assert len(history) == 0
