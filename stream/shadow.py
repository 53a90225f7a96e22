"""Shadow scoring: a challenger model (`FRAUD_SHADOW_MODEL`) scores every decided transaction
beside the served one, and what it would have decided goes to the shadow topic and the metrics;
it never changes a decision, and never delays or blocks one.

The challenger scores the feature rows the served model just scored (`Verdicts.features`), in
one more model call per batch, on its own session (the GPU where there is one). Each decided
record gets one `ShadowDecision`. Both models' labels are their own thresholds applied to their
scores, rules not applied, so the two compare model against model; the record also says what
was decided. `fraud_shadow_decisions_total{served,shadow}` counts the label pairs (agreement is
the diagonal, the decisions that would change the rest); `fraud_model_score` and
`fraud_shadow_model_score` hold the two score distributions. If the challenger fails on a batch,
the batch gets no shadow records, with a warning and `fraud_shadow_failures_total`. The
challenger is reloaded like the served model (stream/model_reload.py) when its path names a new
package.

Key design decisions (a shadow can never delay or block a decision):
- Off the decision path. The scoring stage hands a batch's decided rows over (`submit`) only
  after its decisions went to the sink, and never waits: the challenger scores them on a thread
  of its own. At most SHADOW_QUEUE_BATCHES batches wait for it; a batch that finds them all
  waiting gets no shadow records.
- A time limit (`FRAUD_SHADOW_TIMEOUT_MS`): a batch the challenger has not scored within it of
  the batch's decisions gets no shadow records; one taken past it is dropped unscored, so a slow
  challenger falls behind by at most the limit and catches up on its own.
- Its own output. Shadow records go out through a producer of their own (`ShadowOutput`), in an
  outcome group of their own that commits no offset: nothing waits for their acknowledgement,
  nothing retries them. One the broker refuses or does not acknowledge (a record too large for
  the shadow topic, a shadow topic that does not exist) is dropped. In exactly-once mode they
  are not part of the decisions' transaction, which they can therefore neither abort nor hold
  open; the shadow topic is at-least-once (a record decided again after an abort may have two
  shadow records, with one transaction id).
- Every shadow record not written is counted: `fraud_shadow_records_dropped_total{reason}`,
  `busy` (the challenger still had SHADOW_QUEUE_BATCHES batches), `late` (not scored within the
  time limit) or `refused` (the broker refused or did not acknowledge it, or the producer's
  queue was full).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from contracts.shadow import ShadowDecision, encode_shadow_decision
from contracts.transaction import Transaction
from plumbing.errors import ScoreError
from scorer.decide import DecisionPolicy, Verdicts
from scorer.decisions import Thresholds, classify, valid_scores
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, ServingModel

log = logging.getLogger(__name__)

#: Batches that may wait for the challenger: enough to ride out a burst of small batches at the
#: speed of the served model (a batch of 256 rows holds about 30 KB of features).
SHADOW_QUEUE_BATCHES = 64
#: How often the challenger's thread serves its producer's delivery reports while idle.
IDLE_POLL_S = 0.1
#: At shutdown, how long the shadow records still in the producer may take to be delivered.
FLUSH_S = 2.0


class ShadowJob(NamedTuple):
    """The decided rows of one batch, as the challenger needs them (copied off the batch)."""

    transactions: list[Transaction]
    features: npt.NDArray[np.float32]
    served_scores: npt.NDArray[np.float32]
    served_version: str
    served_thresholds: Thresholds
    #: The decision actually produced for each row (rules applied).
    decided: list[str]
    decided_at: int
    #: When the batch's decisions went to the sink (time.monotonic()).
    handed_at_s: float


class ShadowOutput:
    """The shadow topic's producer, apart from the decisions': sends without waiting, never
    retries, and counts what the broker refuses or does not acknowledge as dropped."""

    def __init__(self, producer: Producer, topic: str, metrics: ServiceMetrics) -> None:
        self._producer = producer
        self.topic = topic
        self._metrics = metrics
        #: librdkafka's error names already logged: one line per kind of refusal, not per record.
        self._logged: set[str] = set()

    def send(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Hand the records to the producer; a full producer queue drops the rest."""
        for sent, (key, value) in enumerate(zip(keys, values, strict=True)):
            try:
                self._producer.produce(self.topic, value, key, on_delivery=self._report)
            except BufferError:
                self._refused("the shadow producer's queue is full", len(values) - sent)
                return
            except KafkaException as exc:
                self._refused(str(exc.args[0]), 1)

    def poll(self) -> None:
        self._producer.poll(0)

    def close(self, timeout_s: float = FLUSH_S) -> None:
        """Deliver what is still in the producer, for at most `timeout_s`; count the rest."""
        left = self._producer.flush(timeout_s)
        if left:
            self._refused(f"not delivered within {timeout_s}s of the stop", left)

    def _report(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._refused(f"{error.name()}: {error.str()}", 1)

    def _refused(self, why: str, count: int) -> None:
        self._metrics.count_shadow_dropped("refused", count)
        kind = why.split(":", 1)[0]
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "shadow records to %s dropped (%s); decisions are not affected, "
                "fraud_shadow_records_dropped_total counts them",
                self.topic,
                why,
            )


class Shadow:
    """The challenger in shadow: its thread, its hand-off queue and its output."""

    def __init__(
        self,
        model: ServingModel,
        output: ShadowOutput,
        metrics: ServiceMetrics,
        reloader: ModelReloader | None = None,
        *,
        timeout_s: float,
        queue_batches: int = SHADOW_QUEUE_BATCHES,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._model = model
        self._output = output
        self._metrics = metrics
        self._reloader = reloader
        self._timeout_s = timeout_s
        self._jobs: queue.Queue[ShadowJob] = queue.Queue(queue_batches)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)

    @property
    def topic(self) -> str:
        return self._output.topic

    @property
    def model_version(self) -> str:
        return self._model.scorer.model_version

    def start(self) -> None:
        if self._reloader is not None:
            self._reloader.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop scoring (batches still waiting get no shadow records) and deliver what is in
        the producer, briefly."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(FLUSH_S)
        self._output.close()
        if self._reloader is not None:
            self._reloader.stop()

    def submit(
        self,
        transactions: Sequence[Transaction],
        verdicts: Verdicts,
        rows: list[int],
        served: tuple[str, DecisionPolicy],
        decided_at: int,
    ) -> None:
        """Hand the decided `rows` of a batch to the challenger (`served`: the served model's
        version and policy), after their decisions went to the sink. Never waits."""
        if not rows:
            return
        if self._jobs.full():
            self._metrics.count_shadow_dropped("busy", len(rows))
            return
        index = np.asarray(rows, np.intp)
        version, policy = served
        job = ShadowJob(
            [transactions[i] for i in rows],
            verdicts.features[index],
            verdicts.scores[index],
            version,
            policy.thresholds,
            [verdicts.decisions[i] for i in rows],
            decided_at,
            time.monotonic(),
        )
        try:
            self._jobs.put_nowait(job)
        except queue.Full:  # the check above raced with another submit: never wait
            self._metrics.count_shadow_dropped("busy", len(rows))

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._output.poll()
            try:
                job = self._jobs.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                continue
            try:
                self._score(job)
            except Exception:  # whatever the challenger does, the thread goes on
                self._metrics.record_shadow_failure()
                log.exception("shadow model %s failed on a batch", self.model_version)

    def _score(self, job: ShadowJob) -> None:
        """Score one batch and send its shadow records, unless it is past the time limit."""
        if self._reloader is not None:
            fresh = self._reloader.take()
            if fresh is not None:
                self._model = fresh
                log.info("shadow model %s scores from this batch on", self.model_version)
        rows = len(job.decided)
        if self._late(job):
            self._metrics.count_shadow_dropped("late", rows)
            return
        try:
            scores = self._model.scorer.score(job.features)
            if len(scores) != rows or not valid_scores(scores).all():
                raise ScoreError(f"{len(scores)} scores for {rows} rows, not all in [0, 1]")
        except ScoreError as exc:
            self._metrics.record_shadow_failure()
            log.warning("shadow model %s failed on a batch: %s", self.model_version, exc)
            return
        if self._late(job):
            self._metrics.count_shadow_dropped("late", rows)
            return
        labels = classify(scores, self._model.policy.thresholds)
        served_labels = classify(job.served_scores, job.served_thresholds)
        self._metrics.record_shadow(scores, Counter(zip(served_labels, labels, strict=True)))
        keys, values = shadow_records(job, scores, labels, served_labels, self.model_version)
        self._output.send(keys, values)

    def _late(self, job: ShadowJob) -> bool:
        return time.monotonic() - job.handed_at_s > self._timeout_s


def shadow_records(
    job: ShadowJob,
    scores: npt.NDArray[np.float32],
    labels: list[str],
    served_labels: list[str],
    version: str,
) -> tuple[list[bytes], list[bytes]]:
    """The keys and values of a batch's shadow records, row-aligned with `job`."""
    keys, values = [], []
    score_list: list[Any] = scores.tolist()
    served_list: list[Any] = job.served_scores.tolist()
    for j, t in enumerate(job.transactions):
        keys.append(t.card_id.encode())
        values.append(
            encode_shadow_decision(
                ShadowDecision(
                    transaction_id=t.transaction_id,
                    card_id=t.card_id,
                    model_version=version,
                    score=float(score_list[j]),
                    decision=labels[j],
                    served_model_version=job.served_version,
                    served_score=float(served_list[j]),
                    served_decision=served_labels[j],
                    decided=job.decided[j],
                    event_time=t.event_time,
                    decided_at=job.decided_at,
                )
            )
        )
    return keys, values
