"""The features worker's probes (terminals/health.py): a worker that stopped counting must
fail /healthz (so it is restarted instead of freezing every terminal's risk), and one that is
recovering or retrying must fail /readyz, and so must one whose table lag is not known. The
clock is a parameter."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from terminals import table_lag as lag
from terminals.health import STALL_AFTER_S, WorkerHealth
from terminals.table_lag import EndOffsets, table_lag


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def started() -> tuple[WorkerHealth, Clock]:
    clock = Clock()
    health = WorkerHealth(clock)
    health.recovered(True)
    return health, clock


def beat(health: WorkerHealth) -> None:
    health.router_beat()
    health.loop_beat()


def test_a_worker_whose_loops_beat_is_alive_and_ready() -> None:
    health, clock = started()
    clock.now += STALL_AFTER_S - 1
    assert health.alive() == (True, "ok") and health.ready() == (True, "ok")


def test_a_silent_loop_is_stuck() -> None:
    for silent in ("router", "event loop"):
        health, clock = started()
        clock.now += STALL_AFTER_S + 1
        health.loop_beat() if silent == "router" else health.router_beat()
        alive, why = health.alive()
        assert not alive and why.startswith(f"{silent} silent"), why
        assert not health.ready()[0]


def test_a_router_that_stopped_is_dead_at_once() -> None:
    health, _ = started()
    health.router_failed("KafkaException: authorization failed")
    assert health.alive() == (False, "router stopped: KafkaException: authorization failed")


def test_a_table_agent_idle_while_events_wait_is_stalled() -> None:
    health, clock = started()
    health.agent_progress(waiting=True, progressed=False)
    clock.now += STALL_AFTER_S / 2
    beat(health)
    health.agent_progress(waiting=True, progressed=False)
    assert health.alive()[0] and not health.stalled
    clock.now += STALL_AFTER_S / 2 + 1
    beat(health)
    assert health.stalled and not health.alive()[0]
    health.agent_progress(waiting=True, progressed=True)  # it applied some: not stalled
    assert not health.stalled and health.alive()[0]


def test_an_agent_with_nothing_to_do_is_never_stalled() -> None:
    health, clock = started()
    for _ in range(5):
        clock.now += STALL_AFTER_S
        beat(health)
        health.agent_progress(waiting=False, progressed=False)
    assert health.alive() == (True, "ok")


def test_recovery_and_retries_make_it_unready_not_dead() -> None:
    health, _ = started()
    health.recovered(False)
    assert health.alive()[0] and health.ready() == (
        False,
        "recovering the table from its changelog",
    )
    health.recovered(True)
    health.router_delivering(False)
    assert health.ready() == (False, "routed records not acknowledged, retrying")
    health.router_delivering(True)
    assert health.ready() == (True, "ok")


def test_a_worker_catching_up_is_not_ready_until_both_lags_are_within_the_bound() -> None:
    health = WorkerHealth(Clock(), max_lag=1_000)
    health.recovered(True)
    steps = [
        (None, None, "input lag not known yet"),
        (50_000, None, "catching up: 50,000 input records not routed"),
        (1_000, None, "table lag not known yet"),
        (1_000, 40_000, "catching up: up to 40,000 routed transactions not counted"),
        (1_001, 0, "catching up: 1,001 input records not routed"),
    ]
    for router, table, why in steps:
        health.router_lag(router)
        health.table_lag(table)
        ready, reason = health.ready()
        assert not ready and reason.startswith(why), reason
    health.router_lag(1_000)
    health.table_lag(1_000)
    assert health.ready() == (True, "ok")
    assert health.alive() == (True, "ok")  # catching up is not being stuck


def test_the_tables_lag_is_unknown_while_an_end_or_a_first_record_is() -> None:
    # Unknown fails closed: the readiness check counts None as not ready.
    assert table_lag({0: 10, 1: 4}, {0: 7, 1: 4}) == 3
    assert table_lag({0: 10, 1: None}, {0: 7, 1: 4}) is None, "the broker did not say"
    assert table_lag({0: 10, 1: 5}, {0: 7}) is None, "records of 1, none applied yet"
    assert table_lag({0: 10, 1: 0}, {0: 10}) == 0, "an empty partition holds nothing back"
    assert table_lag({}, {}) == 0


def test_end_offsets_the_broker_does_not_give_in_time_are_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fallback to the consumer's last fetch said 0 behind during a catch-up whose fetches
    # had stopped.
    monkeypatch.setattr(lag, "END_OFFSETS_TIMEOUT_S", 0.05)

    class Consumer:
        async def highwaters(self, *partitions: str) -> dict[str, int]:
            await asyncio.sleep(10)
            return dict.fromkeys(partitions, 0)

        def highwater(self, _tp: str) -> int:
            return 0

    fake = SimpleNamespace(consumer=Consumer())
    ends = asyncio.run(lag.end_offsets(cast(Any, fake), ["tp0", "tp1"]))
    assert ends == {"tp0": None, "tp1": None}


class SlowBroker:
    """Answers each question for end offsets once `answer` is set, with `ends`."""

    def __init__(self) -> None:
        self.questions = 0
        self.answer = asyncio.Event()
        self.ends = {"tp0": 10, "tp1": 20}

    async def highwaters(self, *partitions: str) -> dict[str, int]:
        self.questions += 1
        await self.answer.wait()
        self.answer.clear()
        return {tp: self.ends[tp] for tp in partitions if tp in self.ends}


def test_the_health_timer_takes_the_newest_answer_and_never_waits_for_the_broker() -> None:
    # The timer awaited each question: one took over a second under load, and the 1 s timer
    # overlapped itself.
    async def scenario() -> None:
        clock = Clock()
        broker = SlowBroker()
        offsets = EndOffsets(cast(Any, SimpleNamespace(consumer=broker)), 5.0, clock)
        unknown = {"tp0": None, "tp1": None}
        assert offsets.latest(["tp0", "tp1"], {}) == (unknown, {}), "nothing asked yet"
        await asyncio.sleep(0.01)
        assert offsets.latest(["tp0", "tp1"], {0: 3}) == (unknown, {0: 3}), "not answered yet"
        assert broker.questions == 1, "a question in flight is not asked again"
        broker.answer.set()
        await asyncio.sleep(0.01)
        # The answer comes with what was applied when it was asked ({}), not now: in a
        # catch-up the ends grow while the question is out.
        ends, applied = offsets.latest(["tp0", "tp1", "tp2"], {0: 9, 1: 20})
        assert ends == {"tp0": 10, "tp1": 20, "tp2": None} and applied == {}
        await asyncio.sleep(0.01)
        assert broker.questions == 2, "the next question starts with the next call"
        # The broker stops answering: the answer ages, then it is unknown (not ready).
        clock.now += 4.0
        assert offsets.latest(["tp0"], {0: 10})[0] == {"tp0": 10}
        clock.now += 2.0
        assert offsets.latest(["tp0"], {0: 10})[0] == {"tp0": None}
        broker.ends = {"tp0": 30}
        broker.answer.set()
        await asyncio.sleep(0.01)
        assert offsets.latest(["tp0"], {0: 30})[0] == {"tp0": None}, "a question 6 s old"
        await asyncio.sleep(0.01)
        broker.answer.set()
        await asyncio.sleep(0.01)
        # Asked at the call before, when 30 were applied: caught up.
        assert offsets.latest(["tp0"], {0: 31}) == ({"tp0": 30}, {0: 30})
        assert broker.questions == 3

    asyncio.run(scenario())
