"""Runs the scoring stage (`stream/scoring.py`'s `BatchScorer`) one batch at a time and in
order, in one of two ways (`FRAUD_SCORING`):
- `inline` (the default): the consuming thread scores each batch itself as soon as it closes
  (`score_inline`), and hands it to the scoring thread only while outputs are being retried
  or a batch already waits there. No second thread contends for the GIL: on the benchmark's
  2-core machine this decided about half as many records again as the thread did
  (docs/benchmarks.md, "Figures behind design choices");
- `thread`: every batch goes through the hand-off (`stream/handoff.py`) to the scoring
  thread. ONNX Runtime releases the GIL during a call, so decoding and batching the next batch
  overlap scoring this one; that pays only when the model call, not Python, is most of a batch.
Retry rounds of failed outputs always run on the scoring thread, before it takes another batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stream.batcher import Batch
from stream.handoff import Handoff
from stream.pending_record import PendingRecord
from stream.redelivery import Redelivery
from stream.scoring import BatchReport, BatchScorer
from stream.sink import OutputSink

log = logging.getLogger(__name__)

#: How long the scoring thread waits for a batch before serving delivery reports again.
IDLE_WAIT_S = 0.05


class ScoringThread(threading.Thread):
    """Scores batches in order, one at a time: those the hand-off gives its own thread, and with
    `score_inline` those the consuming thread scores itself, until the hand-off is closed and
    drained.

    Failed outputs are retried before the next batch is scored, so while the broker is in
    trouble no new work piles up behind them.
    """

    def __init__(
        self,
        handoff: Handoff[PendingRecord],
        batch_scorer: BatchScorer,
        sink: OutputSink,
        redelivery: Redelivery,
        retry_pause_s: float,
        on_report: Callable[[BatchReport], None],
        warm_up: Callable[[], float],
        *,
        inline: bool,
    ) -> None:
        """`inline`: the consuming thread scores batches itself (`score_inline`) and warms the
        model up for itself (`warm_up_here`); otherwise this thread does both."""
        super().__init__(name="scoring", daemon=True)
        self._warm_up = warm_up
        self._inline = inline
        #: Set once the model is warmed up on this thread (ONNX Runtime keeps CUDA graphs per
        #: thread), so consuming starts only then.
        self.warmed_up = threading.Event()
        self._handoff = handoff
        self._batch_scorer = batch_scorer
        self._sink = sink
        self._redelivery = redelivery
        self._retry_pause_s = retry_pause_s
        self._on_report = on_report
        self._stop_retrying = threading.Event()
        #: Held while a batch is scored or a retry round runs: one at a time, whichever thread.
        self._scoring = threading.Lock()
        #: The exception that ended scoring, if any; the consuming thread checks it.
        self.error: BaseException | None = None

    def stop_retrying(self) -> None:
        """Give up pending retries (shutdown): their records stay uncommitted."""
        self._stop_retrying.set()

    def score_inline(self, batch: Batch[PendingRecord]) -> bool:
        """Score `batch` on the calling thread (the consuming thread) if nothing is being
        scored, retried or waiting in the hand-off: True once it is done (or failed: `error`
        says why); False when it must be offered to the hand-off instead. Never waits for a
        retry round, which may last minutes: the consumer must keep polling meanwhile. Always
        False unless batches are scored inline."""
        if not self._inline or not self._scoring.acquire(blocking=False):
            return False
        try:
            if self._redelivery.busy or not self._handoff.claim():
                return False
            try:
                self._on_report(self._batch_scorer.process(batch))
            except BaseException as exc:
                log.exception("scoring failed; stopping without committing its records")
                self.error = exc
            finally:
                self._handoff.done(batch)
        finally:
            self._scoring.release()
        self._sink.poll()
        return True

    def warm_up_here(self) -> None:
        """Warm the model up on the calling thread (ONNX Runtime keeps CUDA graphs per thread)."""
        log.info("warmed up every batch shape in %.3fs", self._warm_up())

    def run(self) -> None:
        try:
            if not self._inline:
                self.warm_up_here()
            self.warmed_up.set()
            self._run()
        except BaseException as exc:
            log.exception("scoring thread failed; stopping without committing its records")
            self.error = exc
            self.warmed_up.set()  # nobody waits for a thread that will never be ready

    def _run(self) -> None:
        while True:
            if self._redelivery.pending and not self._stop_retrying.is_set():
                with self._scoring:
                    delivered = self._redelivery.retry(self._sink)
                if not delivered:
                    self._stop_retrying.wait(self._retry_pause_s)
                continue
            batch = self._handoff.take(IDLE_WAIT_S)
            if batch is None:
                if self._handoff.drained:
                    return
                self._sink.poll()
                continue
            try:
                with self._scoring:
                    self._on_report(self._batch_scorer.process(batch))
                self._sink.poll()
            finally:
                self._handoff.done(batch)
