"""Card-state restores in the background, so a rebalance never stops the partitions kept.

A newly assigned partition is paused in the assignment callback and its card state is read from
its changelog on a thread of its own; the consuming thread resumes it once its state is loaded
(`finished`), and scores every partition it already owned meanwhile. Restoring inside the
callback instead (as before) stopped the whole replica for about 9 s per million cards.

Each assignment of a partition is one restore, named by a token: a partition revoked while its
restore runs is cancelled (the restore stops at its next chunk and forgets what it read), and if
the partition comes back meanwhile, only the newest assignment's restore may resume it. Restores
run one at a time, in assignment order. The cards of partitions that went are forgotten on the
same thread (`forget`), in order with the restores, so a revoke never stops the partitions kept
for that either (half of a million cards took 0.4 s in the callback: a kept partition's longest
silence at a rebalance was that plus the group's own pause); so are the cards kept for a
partition's return once they expire (`expire_retained`, looked for every `EXPIRY_CHECK_S`), so
a partition that came back is restored before its kept cards could go. Once stopped, an
assignment starts nothing: the consumer's close may still hand one over (a rebalance under way
when the replica stops), and close takes it back at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

log = logging.getLogger(__name__)

#: How long `stop` waits for a restore to notice that it is cancelled.
STOP_TIMEOUT_S = 10.0
#: How often the restore thread looks for kept cards past their time, when idle.
EXPIRY_CHECK_S = 1.0


class RestorableState(Protocol):
    """What the restores need of the card state (`stream.owned_card_history.OwnedCardHistory`)."""

    def restore(self, partitions: Sequence[int], progress: Callable[[], None]) -> None: ...

    def drop(self, partitions: Sequence[int]) -> None: ...

    def forget_cards(self, partitions: Sequence[int]) -> None: ...

    def expire_retained(self) -> None: ...


class RestoreCancelled(Exception):
    """Raised inside a restore whose partition was revoked; never leaves this module."""


class FinishedRestore(NamedTuple):
    partition: int
    seconds: float


class _Job(NamedTuple):
    partition: int
    token: int
    queued_at: float


class _Forget(NamedTuple):
    partitions: tuple[int, ...]


class BackgroundRestores:
    """Restores card state of newly assigned partitions on a thread of their own."""

    def __init__(
        self,
        state: RestorableState,
        on_failure: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_failure`: called (on the restore thread) when a restore fails for another cause
        than a cancellation: the replica cannot score that partition and must stop."""
        self._state = state
        self._on_failure = on_failure
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | _Forget | None] = queue.SimpleQueue()
        #: partition → the token of its current assignment, while its restore is not finished.
        self._pending: dict[int, int] = {}
        self._finished: list[FinishedRestore] = []
        self._next_token = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="card-state-restore", daemon=True)

    def __contains__(self, partition: int) -> bool:
        """The partition's state is not loaded yet: its records must wait."""
        with self._lock:
            return partition in self._pending

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def start(self, partitions: Sequence[int]) -> None:
        """Restore these newly assigned partitions (they must be paused until `finished`)."""
        if not partitions or self._stopped:
            return
        now = self._clock()
        if not self._thread.is_alive():
            self._thread.start()  # at the first assignment: a replica without one has no thread
        with self._lock:
            for partition in partitions:
                self._next_token += 1
                self._pending[partition] = self._next_token
                self._jobs.put(_Job(partition, self._next_token, now))

    def cancel(self, partitions: Sequence[int]) -> None:
        """These partitions went: stop their restores; what they read is forgotten."""
        with self._lock:
            for partition in partitions:
                self._pending.pop(partition, None)
            self._finished = [f for f in self._finished if f.partition not in partitions]

    def forget(self, partitions: Sequence[int]) -> None:
        """Forget the cards of these partitions, which went (let go already: not owned), on the
        restore thread before any later restore; here when that thread does not run."""
        if not partitions:
            return
        with self._lock:
            if not self._stopped and self._thread.is_alive():
                self._jobs.put(_Forget(tuple(partitions)))
                return
        self._state.forget_cards(partitions)

    def finished(self) -> list[FinishedRestore]:
        """The partitions whose state loaded since the last call: resume them."""
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def stop(self) -> None:
        """Cancel every restore and stop the thread; later assignments start none."""
        self._stopped = True
        with self._lock:
            self._pending.clear()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(STOP_TIMEOUT_S)

    def _next_job(self) -> _Job | _Forget | None:
        """The next job; meanwhile, forget the kept cards past their time."""
        while True:
            try:
                return self._jobs.get(timeout=EXPIRY_CHECK_S)
            except queue.Empty:
                try:
                    self._state.expire_retained()
                except BaseException as exc:
                    self._on_failure(exc)
                    return None

    def _current(self, job: _Job) -> bool:
        with self._lock:
            return self._pending.get(job.partition) == job.token

    def _run(self) -> None:
        while (job := self._next_job()) is not None:
            if isinstance(job, _Forget):
                try:
                    self._state.forget_cards(job.partitions)
                except BaseException as exc:
                    self._on_failure(exc)
                    return
                continue
            if not self._current(job):
                continue

            def progress(job: _Job = job) -> None:
                if not self._current(job):
                    raise RestoreCancelled

            try:
                self._state.restore([job.partition], progress)
            except RestoreCancelled:
                log.info("card state restore of partition=%s cancelled: revoked", job.partition)
                continue  # the restore forgot what it read
            except BaseException as exc:
                self._on_failure(exc)
                return
            with self._lock:
                if self._pending.get(job.partition) == job.token:
                    del self._pending[job.partition]
                    waited = self._clock() - job.queued_at
                    self._finished.append(FinishedRestore(job.partition, waited))
                    continue
            # Revoked after its last chunk: its state goes, as a revoked partition's does.
            self._state.drop([job.partition])
