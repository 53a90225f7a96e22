"""Background card-state restores: each assignment is one restore, a revoked partition's restore
is cancelled and forgotten, only the newest assignment's restore may resume a partition, and a
failure reaches the consuming thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from stream import restores as restores_module
from stream.restores import BackgroundRestores
from tests.support.waiting import wait_until


class GatedState:
    """A card state whose restore of a partition reads chunks until its gate opens (calling
    `progress` between them, as a changelog read does) and records what it did."""

    def __init__(self, failing: int | None = None) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.started: list[int] = []
        self.loaded: list[int] = []
        self.dropped: list[int] = []
        #: (partitions, thread name) of each `forget_cards`.
        self.forgotten: list[tuple[list[int], str]] = []
        #: Everything it did, in order: ("restore", p), ("loaded", p), ("forget", p).
        self.events: list[tuple[str, int]] = []
        #: The threads `expire_retained` ran on.
        self.expiry_threads: set[str] = set()
        self._failing = failing

    def gate(self, partition: int) -> threading.Event:
        return self.gates.setdefault(partition, threading.Event())

    def restore(self, partitions: Sequence[int], progress: Callable[[], None]) -> None:
        for partition in partitions:
            self.started.append(partition)
            self.events.append(("restore", partition))
            if partition == self._failing:
                raise TimeoutError(f"changelog[{partition}] stalled")
            while not self.gate(partition).wait(0.001):
                progress()
            progress()
            self.loaded.append(partition)
            self.events.append(("loaded", partition))

    def drop(self, partitions: Sequence[int]) -> None:
        self.dropped.extend(partitions)

    def forget_cards(self, partitions: Sequence[int]) -> None:
        self.forgotten.append((list(partitions), threading.current_thread().name))
        self.events.extend(("forget", partition) for partition in partitions)

    def expire_retained(self) -> None:
        self.expiry_threads.add(threading.current_thread().name)
        self.events.append(("expire", -1))


def restores_of(state: GatedState) -> tuple[BackgroundRestores, list[BaseException]]:
    failures: list[BaseException] = []
    return BackgroundRestores(state, failures.append), failures


def finished_partitions(restores: BackgroundRestores, count: int) -> list[int]:
    done: list[int] = []

    def collected() -> bool:
        done.extend(f.partition for f in restores.finished())
        return len(done) >= count

    wait_until(collected, what=f"{count} finished restores")
    return done


def test_a_partition_is_restoring_until_its_state_loads_and_is_reported_once() -> None:
    state = GatedState()
    restores, failures = restores_of(state)
    restores.start([3, 5])
    assert 3 in restores and 5 in restores and len(restores) == 2
    state.gate(3).set()
    assert finished_partitions(restores, 1) == [3]
    assert 3 not in restores and 5 in restores
    state.gate(5).set()
    assert finished_partitions(restores, 1) == [5]
    assert restores.finished() == [] and len(restores) == 0 and not failures
    restores.stop()


def test_a_revoked_partition_stops_restoring_and_is_never_resumed() -> None:
    state = GatedState()
    restores, failures = restores_of(state)
    restores.start([1, 2])
    wait_until(lambda: state.started == [1])
    restores.cancel([1])  # revoked while its chunks are read
    assert 1 not in restores
    state.gate(2).set()
    assert finished_partitions(restores, 1) == [2]
    assert state.loaded == [2], "the cancelled restore stopped at its next chunk"
    assert not failures
    restores.stop()


def test_a_partition_revoked_and_assigned_again_is_resumed_by_its_newest_restore_only() -> None:
    state = GatedState()
    restores, _ = restores_of(state)
    restores.start([7])
    wait_until(lambda: state.started == [7])
    restores.cancel([7])
    restores.start([7])  # back before the first restore noticed
    assert 7 in restores
    state.gate(7).set()
    assert finished_partitions(restores, 1) == [7]
    assert state.started == [7, 7], "the first restore was cancelled, the second loaded"
    assert state.loaded == [7] and 7 not in restores
    restores.stop()


def test_a_partition_revoked_after_its_last_chunk_is_dropped_not_resumed() -> None:
    state = GatedState()
    restores, _ = restores_of(state)
    revoked = threading.Event()
    original = state.restore

    def restore_then_revoked(partitions: Sequence[int], progress: Callable[[], None]) -> None:
        state.gate(4).set()
        original(partitions, progress)
        restores.cancel([4])  # between its last chunk and its report
        revoked.set()

    state.restore = restore_then_revoked  # type: ignore[method-assign]
    restores.start([4])
    wait_until(revoked.is_set)
    wait_until(lambda: state.dropped == [4], what="the loaded state dropped")
    assert restores.finished() == [] and 4 not in restores
    restores.stop()


def test_a_failed_restore_is_handed_to_the_consuming_thread() -> None:
    state = GatedState(failing=2)
    restores, failures = restores_of(state)
    restores.start([2])
    wait_until(lambda: failures, what="the failure handed over")
    assert isinstance(failures[0], TimeoutError)
    assert restores.finished() == []
    restores.stop()


def test_stop_cancels_a_restore_in_progress() -> None:
    state = GatedState()
    restores, failures = restores_of(state)
    restores.start([0])
    wait_until(lambda: state.started == [0])
    restores.stop()
    assert state.loaded == [] and not failures and len(restores) == 0


@pytest.mark.parametrize("restored_before", [True, False])
def test_an_assignment_after_stop_starts_nothing(restored_before: bool) -> None:
    """The consumer's close can hand over an assignment after the restores stopped (a rebalance
    under way when the replica stops): starting a thread a second time used to raise out of
    close, and the replica exited 1 instead of 0 (seen in the rebalance storm)."""
    state = GatedState()
    state.gate(0).set()
    restores, failures = restores_of(state)
    if restored_before:
        restores.start([0])
        assert finished_partitions(restores, 1) == [0]
    restores.stop()
    before = threading.active_count()
    restores.start([1, 2])
    assert 1 not in restores and len(restores) == 0
    assert threading.active_count() == before and state.started == ([0] if restored_before else [])
    assert not failures


@pytest.mark.parametrize("partitions", [[], [0]])
def test_no_thread_runs_until_a_restore_is_asked_for(partitions: list[int]) -> None:
    state = GatedState()
    state.gate(0).set()
    restores, _ = restores_of(state)
    before = threading.active_count()
    restores.start(partitions)
    assert threading.active_count() == before + (1 if partitions else 0)
    restores.stop()


def test_the_cards_of_partitions_that_went_are_forgotten_on_the_restore_thread_in_order() -> None:
    """A revoke let the consuming thread forget half of a million cards (0.4 s) inside its
    callback, while the partitions it kept waited: a kept partition's longest silence at a
    rebalance in fault scenario 6."""
    state = GatedState()
    restores, failures = restores_of(state)
    restores.start([1])
    wait_until(lambda: state.started == [1])
    restores.forget([5, 6])  # partitions that went while 1 restores
    restores.start([5])  # 5 comes back: its restore must not start before its cards went
    assert state.forgotten == [], "not on the calling thread"
    state.gate(1).set()
    state.gate(5).set()
    assert sorted(finished_partitions(restores, 2)) == [1, 5]
    assert state.forgotten == [([5, 6], "card-state-restore")]
    assert state.events == [
        ("restore", 1),
        ("loaded", 1),
        ("forget", 5),
        ("forget", 6),
        ("restore", 5),
        ("loaded", 5),
    ]
    assert not failures
    restores.stop()
    restores.forget([1])
    assert state.forgotten[-1] == ([1], threading.current_thread().name), "stopped: done here"


def test_kept_cards_expire_on_the_restore_thread_only_between_restores(monkeypatch) -> None:
    monkeypatch.setattr(restores_module, "EXPIRY_CHECK_S", 0.01)
    state = GatedState()
    restores, failures = restores_of(state)
    restores.start([1])
    wait_until(lambda: state.started == [1])
    expired_before = state.events.count(("expire", -1))
    threading.Event().wait(0.1)  # a restore under way: nothing expires meanwhile
    assert state.events.count(("expire", -1)) == expired_before
    state.gate(1).set()
    assert finished_partitions(restores, 1) == [1]
    wait_until(lambda: state.events[-1] == ("expire", -1), what="an expiry check once idle")
    assert state.expiry_threads == {"card-state-restore"} and not failures
    restores.stop()
