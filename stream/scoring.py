"""The scoring stage: a closed micro-batch → features → one model call → decisions (and dead
letters for poison records) handed to the sink.

`BatchScorer` decides one batch and is plain logic over the `Scorer` and `OutputSink`
interfaces, so it is unit-tested with fakes. `ScoringWorker` runs it on its own thread, fed by
a bounded hand-off queue from the consuming thread: ONNX Runtime releases the GIL, so decoding
and batching of the next batch overlap the scoring of this one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from deadletter.router import DeadLetterRouter
from scorer.decisions import Decision, Thresholds, classify, encode_decision
from scorer.fallback import fallback_scores
from scorer.features import TransactionColumns, build_features
from scorer.isolation import score_isolating_poison
from scorer.model import Scorer
from stream import metrics
from stream.batcher import Batch
from stream.errors import ModelUnavailableError, ScoreError
from stream.offsets import OffsetTracker, SourceOffset
from stream.outcomes import OutcomeGroup, OutputLabel
from stream.redelivery import Redelivery
from stream.sink import Output, OutputSink
from stream.transaction import Transaction

log = logging.getLogger(__name__)

#: How long the worker waits for a batch before serving delivery reports again.
IDLE_WAIT_S = 0.05


class PendingRecord(NamedTuple):
    """A consumed, valid transaction waiting in a micro-batch."""

    message: Message
    transaction: Transaction
    #: Where it came from, as the offset tracker knows it.
    position: SourceOffset


class BatchReport(NamedTuple):
    """What the adaptive controller learns from one batch."""

    size: int
    #: Seconds from the batch's first record arriving to its outputs being handed to the sink.
    latency_s: float
    closed_full: bool


def count_delivered(labels: Counter[OutputLabel]) -> None:
    """Count a completed group's outputs in the metrics."""
    for (kind, label), count in labels.items():
        if kind == "decision":
            metrics.record_decisions_delivered(label, count)
        else:
            metrics.record_dead_letter_delivered(label, count)


class BatchScorer:
    """Decides every record of a batch: a decision, or a dead letter for a poison record."""

    def __init__(
        self,
        scorer: Scorer,
        sink: OutputSink,
        tracker: OffsetTracker,
        router: DeadLetterRouter,
        *,
        output_topic: str,
        thresholds: Thresholds,
        decision_deadline_ms: float,
        late_policy: str,
    ) -> None:
        self._scorer = scorer
        self._sink = sink
        self._tracker = tracker
        self._router = router
        self._output_topic = output_topic
        self._thresholds = thresholds
        self._deadline_ms = decision_deadline_ms
        self._fallback_late = late_policy == "fallback"

    def process(self, batch: Batch[PendingRecord]) -> BatchReport:
        """Score the batch and send one output per record; return what the controller needs."""
        started = time.perf_counter()
        records = batch.items
        columns = TransactionColumns.from_transactions([r.transaction for r in records])
        features = build_features(columns)
        now_ms = time.time_ns() // 1_000_000
        metrics.set_time_lag(max(0.0, (now_ms - int(columns.event_time.min())) / 1000.0))

        late = self._late(columns.event_time, now_ms)
        by_rules = late if self._fallback_late else np.zeros(len(records), bool)
        scores, poison, inference_s, model_down = self._score(features, ~by_rules)
        if by_rules.any():
            scores[by_rules] = fallback_scores(features[by_rules])
            metrics.record_degraded("late", int(by_rules.sum()))
        degraded = by_rules | model_down
        metrics.record_batch(len(records), batch.wait_s, inference_s)

        decided_at = time.time_ns() // 1_000_000
        labels = classify(np.nan_to_num(scores), self._thresholds)
        group = OutcomeGroup(
            self._tracker, [r.position for r in records], _outcome_labels(labels, poison),
            count_delivered,
        )  # fmt: skip
        self._send(records, scores.tolist(), labels, degraded.tolist(), poison, group, decided_at)
        decided = np.ones(len(records), bool)
        decided[list(poison)] = False
        metrics.observe_event_to_decision((decided_at - columns.event_time[decided]) / 1000.0)
        latency_s = batch.wait_s + (time.perf_counter() - started)
        return BatchReport(len(records), latency_s, batch.closed_full)

    def _late(self, event_time: npt.NDArray[np.int64], now_ms: int) -> npt.NDArray[np.bool_]:
        if not self._deadline_ms:
            return np.zeros(len(event_time), bool)
        late = event_time + self._deadline_ms < now_ms
        if late.any():
            metrics.record_late(int(late.sum()))
        return late

    def _score(
        self, features: npt.NDArray[np.float32], use_model: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.float32], dict[int, ScoreError], float, npt.NDArray[np.bool_]]:
        """Model scores of the rows in `use_model`; poison rows by batch index; inference time;
        rows the fallback decided because the model is unavailable."""
        scores = np.zeros(len(features), np.float32)
        model_down = np.zeros(len(features), bool)
        rows = np.flatnonzero(use_model)
        if not len(rows):
            return scores, {}, 0.0, model_down
        started = time.perf_counter()
        try:
            model_scores, poison_rows = score_isolating_poison(self._scorer, features[rows])
        except ModelUnavailableError as exc:
            log.error("model unavailable, deciding %s records by rules: %s", len(rows), exc)
            scores[rows] = fallback_scores(features[rows])
            model_down[rows] = True
            metrics.record_degraded("model_unavailable", len(rows))
            return scores, {}, time.perf_counter() - started, model_down
        inference_s = time.perf_counter() - started
        scores[rows] = model_scores
        poison = {int(rows[i]): error for i, error in poison_rows.items()}
        if poison:
            metrics.record_poison(len(poison))
        return scores, poison, inference_s, model_down

    def _send(
        self,
        records: list[PendingRecord],
        scores: list[float],
        labels: list[str],
        degraded: list[bool],
        poison: dict[int, ScoreError],
        group: OutcomeGroup,
        decided_at: int,
    ) -> None:
        model_version = self._scorer.model_version
        for i, error in poison.items():
            (topic_in, partition), offset = records[i].position
            log.warning(
                "poison record topic=%s partition=%s offset=%s: %s",
                topic_in, partition, offset, error,
            )  # fmt: skip
            self._sink.send(
                self._router.dead_letter(
                    records[i].message, error, group, model_version=model_version
                )
            )
        rows = (
            [i for i in range(len(records)) if i not in poison] if poison else range(len(records))
        )
        keys: list[bytes] = []
        values: list[bytes] = []
        for i in rows:
            t = records[i].transaction
            keys.append(t.card_id.encode())
            values.append(
                encode_decision(
                    Decision(
                        transaction_id=t.transaction_id,
                        card_id=t.card_id,
                        score=scores[i],
                        decision=labels[i],
                        model_version=model_version,
                        degraded=degraded[i],
                        event_time=t.event_time,
                        decided_at=decided_at,
                    )
                )
            )
        topic = self._output_topic

        def output_of(j: int) -> Output:
            i = rows[j]
            return Output(
                "decision", topic, keys[j], values[j], None, records[i].message, group, labels[i]
            )

        if values:
            self._sink.send_decisions(topic, keys, values, group, output_of)


def _outcome_labels(labels: list[str], poison: dict[int, ScoreError]) -> Counter[OutputLabel]:
    """The outputs of a batch by kind and label: a decision per record, a dead letter per poison."""
    decided = Counter(labels)
    for i in poison:
        decided[labels[i]] -= 1
    outputs: Counter[OutputLabel] = Counter({("decision", k): n for k, n in decided.items() if n})
    if poison:
        outputs["dead_letter", ScoreError.reason] = len(poison)
    return outputs


class ScoringWorker(threading.Thread):
    """Scores batches from the hand-off queue in order, one at a time, until it gets None."""

    def __init__(
        self,
        handoff: queue.Queue[Batch[PendingRecord] | None],
        batch_scorer: BatchScorer,
        sink: OutputSink,
        redelivery: Redelivery,
        retry_pause_s: float,
        on_report: Callable[[BatchReport], None],
        warm_up: Callable[[], float],
    ) -> None:
        super().__init__(name="scoring", daemon=True)
        self._warm_up = warm_up
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
        #: The exception that ended the worker, if any; the consuming thread checks it.
        self.error: BaseException | None = None

    def stop_retrying(self) -> None:
        """Give up pending retries (shutdown): their records stay uncommitted."""
        self._stop_retrying.set()

    def run(self) -> None:
        try:
            log.info("warmed up every batch shape in %.3fs", self._warm_up())
            self.warmed_up.set()
            self._run()
        except BaseException as exc:
            log.exception("scoring thread failed; stopping without committing its records")
            self.error = exc
            self.warmed_up.set()  # nobody waits for a thread that will never be ready

    def _run(self) -> None:
        while True:
            if self._redelivery.pending and not self._stop_retrying.is_set():
                if not self._redelivery.retry():
                    self._stop_retrying.wait(self._retry_pause_s)
                continue
            try:
                batch = self._handoff.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                self._sink.poll()
                continue
            try:
                if batch is None:
                    return
                if batch.items:  # a rebalance may have emptied it
                    self._on_report(self._batch_scorer.process(batch))
                self._sink.poll()
            finally:
                self._handoff.task_done()
