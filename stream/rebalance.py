"""What a replica does when its group moves partitions (the consumer's rebalance callbacks, run
on the consuming thread inside `poll` or `close`).

- Assigned: each new partition is paused, and its card state restored in the background
  (`stream/restores.py`); the consuming thread resumes it once loaded (`resume_restored`), and
  scores the partitions it kept meanwhile.
- Revoked: the partitions' undecided records are dropped (their next owner reads them again),
  the batch being scored finishes, outputs are flushed and what was decided is committed,
  within the shutdown deadline while stopping; then everything held for them is forgotten, but
  their cards when every change reached the changelog: those are kept with the changelog's end
  offset, for a return that reads only what was written since (`stream/owned_card_history.py`).
- Lost (the group moved on without us): nothing of them may be committed. Exactly-once aborts
  the open transaction, which holds outputs of the kept partitions too, so the replica rewinds
  those to their commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from contracts.offsets import OffsetTracker, PartitionKey, SourceOffset
from stream.flow import FlowControl
from stream.handoff import Handoff
from stream.held_partitions import HeldPartitions
from stream.lag import LagMonitor
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from stream.pending_record import PendingRecord
from stream.restores import BackgroundRestores
from stream.sink import OutputSink
from stream.transactional_sink import TransactionalSink

log = logging.getLogger(__name__)

#: How long a revoke waits for the changelog's end offsets before forgetting the cards instead.
CHANGELOG_END_TIMEOUT_S = 1.0


class Rebalance:
    """The replica's rebalance callbacks and the partitions whose state is still restoring."""

    def __init__(
        self,
        consumer: Consumer,
        input_topic: str,
        shutdown_timeout_s: float,
        *,
        flow: FlowControl,
        held: HeldPartitions,
        handoff: Handoff[PendingRecord],
        sink: OutputSink,
        tracker: OffsetTracker,
        lag: LagMonitor,
        metrics: ServiceMetrics,
        card_history: OwnedCardHistory | None,
        transactions: TransactionalSink | None,
        release_records: Callable[[set[PartitionKey]], int],
        commit: Callable[[], bool],
        request_rewind: Callable[[], None],
    ) -> None:
        """`release_records`: drop the undecided records of these partitions, say how many.
        `commit`: commit now what is finished; say whether every output so far is acknowledged
        and none waits to be sent again or undone by an abort. `request_rewind`: read the kept
        partitions again from their commit (exactly-once, after a loss aborted the
        transaction)."""
        self._consumer = consumer
        self._input_topic = input_topic
        self._shutdown_timeout_s = shutdown_timeout_s
        self._flow = flow
        self._held = held
        self._handoff = handoff
        self._sink = sink
        self._tracker = tracker
        self._lag = lag
        self._metrics = metrics
        self._card_history = card_history
        self._transactions = transactions
        self._release_records = release_records
        self._commit = commit
        self._request_rewind = request_rewind
        self._restores = (
            BackgroundRestores(card_history, self._restore_failed)
            if card_history is not None
            else None
        )
        #: Assigned partitions whose card state is not loaded yet (the restores' own set, kept
        #: here too for a per-record check without their lock).
        self.restoring: set[PartitionKey] = set()
        self._restore_failure: BaseException | None = None
        #: Set when shutdown starts: revokes run by `close()` share its deadline.
        self._shutdown_deadline: float | None = None
        #: Records given up on during shutdown (their outputs never acknowledged).
        self.abandoned = 0

    # -- the consumer's callbacks -----------------------------------------------------------

    def on_assign(self, _consumer: object, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", describe(partitions))
        if self._restores is not None and partitions:
            # Paused before their first fetch, until their card state is loaded; the partitions
            # already owned go on meanwhile.
            self.restoring.update((p.topic, p.partition) for p in partitions)
            self._restores.start([p.partition for p in partitions])
            self._metrics.set_restoring_partitions(len(self.restoring))
        self._flow.on_assign(partitions, withheld=self._restores is not None)
        self._lag.assign([(p.topic, p.partition) for p in partitions])

    def on_revoke(self, _consumer: object, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        released = self._release_records(keys)
        what = f"revoked {describe(partitions)}: releasing {released} undecided records"
        log.info("%s, committing what was decided", what)
        started = time.monotonic()
        deadline = self._deadline()
        scored = self._handoff.wait_until_done(deadline)
        left = self._sink.flush(max(0.0, deadline - time.monotonic()))
        flushed = time.monotonic()
        durable = self._commit() and scored and left == 0
        committed = time.monotonic()
        ends = self._changelog_ends(partitions) if durable else None
        self._forget(keys, partitions, ends)
        log.info(
            "revoked %s handed over: outputs flushed in %.3fs, committed in %.3fs, state let go "
            "in %.3fs (cards kept: %s)",
            describe(partitions),
            flushed - started,
            committed - flushed,
            time.monotonic() - committed,
            "no" if not ends else ",".join(map(str, sorted(ends))),
        )

    def on_lost(self, _consumer: object, partitions: list[TopicPartition]) -> None:
        keys = {(p.topic, p.partition) for p in partitions}
        if self._transactions is not None:
            # The open transaction holds outputs of the lost partitions: none may be committed,
            # so it is aborted, and the partitions kept are read again from their commit.
            self._transactions.abort()
            self._request_rewind()
        released = self._release_records(keys)
        what = f"lost {describe(partitions)}: {released} undecided records released"
        log.warning("%s, nothing of them is committed", what)
        # As on a revoke, the batch being scored (thread mode) finishes before the partitions'
        # state goes: it holds records of the partitions kept too.
        self._handoff.wait_until_done(self._deadline())
        self._forget(keys, partitions)

    # -- the consuming thread's loop ----------------------------------------------------------

    def resume_restored(self) -> None:
        """Resume the partitions whose state has loaded; raise a restore's failure."""
        if self._restore_failure is not None:
            raise self._restore_failure
        if not self.restoring or self._restores is None:
            return
        finished = self._restores.finished()
        if not finished:
            return
        keys = [(self._input_topic, f.partition) for f in finished]
        self.restoring.difference_update(keys)
        self._flow.release(keys)
        self._metrics.set_restoring_partitions(len(self.restoring))
        for restore in finished:
            log.info(
                "partition=%s resumed: its card state loaded %.3fs after its assignment",
                restore.partition,
                restore.seconds,
            )

    def rewind_restoring(self, position: SourceOffset) -> None:
        """A record of a partition whose state is not loaded yet (fetched before its pause took
        effect): go back to it, so it is read once the state is there."""
        (topic, partition), offset = position
        where = TopicPartition(topic, partition, offset)
        self._consumer.pause([where])
        self._consumer.seek(where)

    def shutting_down(self, deadline: float) -> None:
        """Shutdown started: revokes from now on share its `deadline`, and count what they
        abandon."""
        self._shutdown_deadline = deadline

    def stop(self) -> None:
        """Cancel the restores still running."""
        if self._restores is not None:
            self._restores.stop()

    # -- internals ----------------------------------------------------------------------------

    def _deadline(self) -> float:
        return self._shutdown_deadline or time.monotonic() + self._shutdown_timeout_s

    def _restore_failed(self, error: BaseException) -> None:
        """On the restore thread: the next pass of the loop raises it (the replica stops)."""
        log.error("card state restore failed: %s", error)
        self._restore_failure = error

    def _changelog_ends(self, partitions: list[TopicPartition]) -> dict[int, int] | None:
        """The changelog's end offsets of these partitions (for a restored one: its state may
        be kept), or None when the broker does not say within a second. Asked in the revoke
        callback: no next owner can have written there yet."""
        if self._card_history is None or not self._card_history.retains:
            return None
        if self._shutdown_deadline is not None:  # stopping: nothing will come back here
            return None
        topic = self._card_history.changelog_topic
        restored = [p.partition for p in partitions if (p.topic, p.partition) not in self.restoring]
        if not restored:
            return None
        latest = [TopicPartition(topic, partition, OFFSET_END) for partition in restored]
        try:
            ends = self._consumer.offsets_for_times(latest, timeout=CHANGELOG_END_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("changelog end offsets not known (%s): the cards are forgotten", exc)
            return None
        return {end.partition: end.offset for end in ends if end.error is None and end.offset >= 0}

    def _forget(
        self,
        keys: set[PartitionKey],
        partitions: list[TopicPartition],
        changelog_ends: dict[int, int] | None = None,
    ) -> None:
        if self._restores is not None:
            self._restores.cancel([p.partition for p in partitions])
            self.restoring.difference_update(keys)
            self._metrics.set_restoring_partitions(len(self.restoring))
        if self._card_history is not None and self._restores is not None:
            gone = self._card_history.let_go([p.partition for p in partitions], changelog_ends)
            self._restores.forget(gone)  # their cards, off the consuming thread
        if self._transactions is not None:
            self._transactions.forget(keys)
        unfinished = self._tracker.forget(keys)
        if unfinished:
            log.warning(
                "%s records of %s have no acknowledged outcome yet: the next owner re-reads them",
                unfinished,
                describe(partitions),
            )
        if self._shutdown_deadline is not None:
            self.abandoned += unfinished
        self._flow.on_revoke(partitions)
        self._held.forget(keys)
        self._lag.forget(sorted(keys))


def describe(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing"
