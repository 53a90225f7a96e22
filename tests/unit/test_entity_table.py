"""The worker's table side without faust (terminals/entity_table.py `EntityTable`): which entries it
forgets as idle. The table is a dict and the producer keeps what it is sent; the faust table and
the broker are exercised by tests/integration/test_features_worker.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from terminals.config import FeaturesSettings
from terminals.entity_table import EntityTable
from terminals.events import InputMarks, TerminalEvent
from terminals.metrics import WorkerMetrics
from terminals.table_progress import TableClocks

DAY_MS = 86_400_000
NOW_MS = int(time.time() * 1000)


class Producer:
    """Keeps what it is sent; the broker refuses the records of the keys in `failing`."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []
        self.failing: set[bytes] = set()

    async def send(
        self, _topic: str, key: bytes, value: bytes | None, **_: Any
    ) -> asyncio.Future[None]:
        self.sent.append((key, value))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if key in self.failing:
            delivery.set_exception(RuntimeError("KafkaTimeoutError"))
        else:
            delivery.set_result(None)
        return delivery


class App:
    def __init__(self) -> None:
        self.producer = Producer()


def table_of(table: dict[str, bytes]) -> tuple[EntityTable, TableClocks, App]:
    config = FeaturesSettings(table_partitions=1, evict_interval_s=0.001)
    clocks = TableClocks(config)
    app = App()
    metrics = WorkerMetrics(CollectorRegistry())
    entities = EntityTable(cast(Any, app), table, config, metrics, clocks, card=False)
    return entities, clocks, app


def marks(time_ms: int) -> InputMarks:
    return InputMarks((1, 1), {"t0": (time_ms, False), "l0": (time_ms, True)})


def evict(entities: EntityTable) -> None:
    time.sleep(0.002)  # past the eviction interval
    asyncio.run(entities.evict_if_due(0))


def test_an_entry_idle_since_before_a_reassignment_is_forgotten() -> None:
    # An entry changed after the reassignment made the table's entries unseen: those left idle
    # by the replica before were never forgotten (nor tombstoned) again.
    table: dict[str, bytes] = {}
    entities, clocks, app = table_of(table)
    old = NOW_MS - 100 * DAY_MS
    clocks.of(0).follow(marks(old))
    entities.apply(0, [("OLD", TerminalEvent("t", 0, 1, old))])
    entities.write(0)
    entities.reset()  # a restart, or partitions moved
    clocks.reset()
    clocks.of(0).follow(marks(NOW_MS))
    entities.apply(0, [("NEW", TerminalEvent("t", 0, 2, NOW_MS))])
    evict(entities)
    assert "OLD" not in table
    assert app.producer.sent == [(b"OLD", None)]
    entities.write(0)
    assert list(table) == ["NEW"], "the entry changed since is kept"


@st.composite
def events(draw: st.DrawFn) -> list[tuple[str, TerminalEvent]]:
    """A batch of transactions and labels of three terminals, days up to 60 apart."""
    batch = []
    for offset in range(draw(st.integers(1, 12))):
        key = draw(st.sampled_from(["A", "B", "C"]))
        day = draw(st.integers(0, 60))
        time_ms = NOW_MS - day * DAY_MS
        if draw(st.booleans()):
            event = TerminalEvent("t", 0, draw(st.integers(0, 10_000)) + offset, time_ms)
        else:
            reported = time_ms + draw(st.integers(-2, 10)) * DAY_MS
            fraud = draw(st.booleans())
            tx = draw(st.sampled_from(["x", "y"]))
            event = TerminalEvent("l", 0, offset, time_ms, fraud, reported, tx)
        batch.append((key, event))
    return batch


@settings(max_examples=150, deadline=None)
@given(st.lists(events(), min_size=1, max_size=6), st.integers(0, 60))
def test_the_newest_day_kept_per_entry_makes_the_eviction_the_buckets_make(
    batches: list[list[tuple[str, TerminalEvent]]], clock_back_days: int
) -> None:
    # The newest day kept per entry, which eviction reads instead of decoding every entry,
    # never falls behind its buckets, and decides idleness as they do.
    entities, clocks, _ = table_of({})
    clock = clocks.of(0)
    clock.follow(marks(NOW_MS - clock_back_days * DAY_MS))
    for batch in batches:
        entities.apply(0, batch)
        for key, kept in entities._newest_days.get(0, {}).items():
            state = entities._decoded[key]
            assert kept >= state.newest_day
            assert clock.idle_since(kept) == clock.idle_since(state.newest_day), key


def test_a_publication_the_broker_did_not_acknowledge_is_sent_again_in_the_next_round() -> None:
    # The worker's progress follows a round only once the round is acknowledged
    # (terminals/app.py): a failed record must not count as published, or the topic would keep
    # the entry's older record while the progress says it is up to date.
    entities, clocks, app = table_of({})
    clocks.of(0).follow(marks(NOW_MS))
    for key in ("A", "B"):  # a confirmed fraud is published at once
        entities.apply(0, [(key, TerminalEvent("l", 0, 1, NOW_MS, True, NOW_MS, f"tx-{key}"))])
    app.producer.failing = {b"A"}

    async def rounds() -> list[bool]:
        acknowledged = [await entities.acknowledged(await entities.publish_due())]
        app.producer.failing = set()
        for _ in range(2):
            acknowledged.append(await entities.acknowledged(await entities.publish_due()))
        return acknowledged

    assert asyncio.run(rounds()) == [False, True, True]
    (a_first, a_again), (b,) = (
        [value for key, value in app.producer.sent if key == name] for name in (b"A", b"B")
    )
    assert a_again == a_first and a_first is not None, "the same record, sent again"
    assert b is not None, "the acknowledged entry is not sent twice"
    assert len(app.producer.sent) == 3, "the third round has nothing to send"
