"""The scoring stage: a closed micro-batch → one decision path (`scorer.decide`) → decisions,
and dead letters for records that failed, handed to the sink.

`BatchScorer` decides one batch and is plain logic over the `Scorer` and `OutputSink`
interfaces, so it is unit-tested with fakes. `stream/scoring_thread.py` runs it, one batch at a
time and in order, on the consuming thread or its own (`FRAUD_SCORING`). The model it decides
with, and when it goes back from a new one, is `stream/model_in_use.py`'s; the outputs it makes
of the verdicts are sent by `stream/batch_outputs.py`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from contracts.decision import DECLINE, REVIEW, encode_decision
from contracts.offsets import OffsetTracker
from contracts.output_formats import DecisionEncoder
from contracts.transaction import Transaction
from deadletter.router import DeadLetterRouter
from plumbing.errors import ScoreError
from scorer.columns import TransactionColumns
from scorer.decide import DecisionPolicy, Verdicts, decide_batch, decide_by_rules
from scorer.drift import DEFAULT_WINDOW as DEFAULT_DRIFT_WINDOW
from scorer.model import Scorer
from scorer.reasons import Explainer
from scorer.recent_rows import RecentRows
from scorer.rules import Rules
from stream.batch_outputs import BatchOutputs, trace_contexts
from stream.batcher import Batch
from stream.card_history_changelog import ChangelogBatch
from stream.metrics import ServiceMetrics
from stream.model_in_use import ModelInUse
from stream.model_reload import ModelReloader
from stream.observed_precision import ObservedPrecision
from stream.outcomes import OutcomeGroup, OutputLabel
from stream.owned_card_history import OwnedCardHistory
from stream.pending_record import PendingRecord
from stream.rules_table import RulesTable
from stream.shadow import Shadow
from stream.sink import OutputSink
from stream.tracing import BatchOutcome, BatchTracer
from stream.worker_tables import CardFraudsTable, TerminalRiskTable

log = logging.getLogger(__name__)


class Stages:
    """Where a batch's time went, stage by stage, for `fraud_stage_seconds{stage}` (each stage
    one observation per batch; together, a record's way from its producer to its output's
    acknowledgement):

    - queue: from the batch's first record's Kafka timestamp (its producer's clock) to its
      joining the batch: the broker, the fetch and the consumer's own queue;
    - batch: from then to the batch's close (`max_wait_ms` or the size cap);
    - handoff: waiting for the scoring stage (the handoff queue);
    - state, terminal: the card history; the terminal-risk and card-frauds joins;
    - decide: features, model, rules and reasons (`fraud_inference_seconds` is its model call);
    - encode: the decisions made into output values;
    - delivery: from the first output produced to the last one acknowledged (in exactly-once
      mode, the transaction's commit).
    """

    __slots__ = ("_last", "seconds")

    def __init__(self, batch: Batch[PendingRecord], started: float) -> None:
        self.seconds: dict[str, float] = {
            "batch": batch.wait_s,
            "handoff": max(0.0, time.monotonic() - batch.closed_at_s),
        }
        kind, produced_ms = batch.items[0].message.timestamp() if batch.items else (0, 0)
        if kind != TIMESTAMP_NOT_AVAILABLE and produced_ms > 0:
            opened_ms = time.time() * 1000.0 - (time.monotonic() - batch.opened_at_s) * 1000.0
            self.seconds["queue"] = max(0.0, (opened_ms - produced_ms) / 1000.0)
        self._last = started

    def done(self, stage: str) -> None:
        """The stage that just ended (timed from the end of the one before)."""
        now = time.perf_counter()
        self.seconds[stage] = now - self._last
        self._last = now

    def on_delivered(self, metrics: ServiceMetrics) -> Callable[[Counter[OutputLabel]], None]:
        """The batch's outcome group's completion: its outputs counted, and the delivery timed
        (from now: its first output is produced next)."""
        since = time.perf_counter()

        def delivered(labels: Counter[OutputLabel]) -> None:
            metrics.count_delivered(labels)
            metrics.observe_stages({"delivery": time.perf_counter() - since})

        return delivered


class BatchReport(NamedTuple):
    """What the adaptive controller learns from one batch."""

    size: int
    #: Seconds from the batch's first record arriving to its outputs being handed to the sink.
    latency_s: float
    closed_full: bool


class BatchScorer:
    """Decides every record of a batch: a decision, or a dead letter for a record that failed."""

    def __init__(
        self,
        scorer: Scorer,
        sink: OutputSink,
        tracker: OffsetTracker,
        router: DeadLetterRouter,
        *,
        output_topic: str,
        policy: DecisionPolicy,
        metrics: ServiceMetrics,
        card_history: OwnedCardHistory | None = None,
        terminals: TerminalRiskTable | None = None,
        card_frauds: CardFraudsTable | None = None,
        encode: DecisionEncoder = encode_decision,
        rules: RulesTable | None = None,
        explainer: Explainer | None = None,
        reloader: ModelReloader | None = None,
        shadow: Shadow | None = None,
        observed_precision: ObservedPrecision | None = None,
        log_features: bool = False,
        drift_window: int = DEFAULT_DRIFT_WINDOW,
        tracer: BatchTracer | None = None,
        recent: RecentRows | None = None,
    ) -> None:
        """`encode`: how a decision becomes the output's value (FRAUD_OUTPUT_FORMAT); `rules`:
        the rules in force (FRAUD_RULES and its topic); `explainer`: reasons for flagged
        decisions (None: none); `reloader`: where a new model (scorer, policy and explainer
        together) comes from between batches (None: the first serves for good); `shadow`: a
        challenger that scores the decided rows too, on its own thread, once their decisions
        are sent (FRAUD_SHADOW_MODEL); `observed_precision`:
        follows the flagged transactions until their labels arrive (FRAUD_OBSERVED_PRECISION);
        `log_features`: each decision carries its feature row (FRAUD_DECISION_FEATURES);
        `tracer`: one span per batch (stream/tracing.py; None: no spans); `recent`: where a few
        rows of each batch the model decided are kept, the known-good rows that tell a broken
        model from poison records and that a new model must score (scorer/recent_rows.py)."""
        self._tracer = tracer
        self._recent = recent
        self._model = ModelInUse(
            scorer, policy, explainer, metrics=metrics, drift_window=drift_window
        )
        self._outputs = BatchOutputs(
            sink, router, output_topic=output_topic, encode=encode, log_features=log_features
        )
        self._reloader = reloader
        self._shadow = shadow
        self._observed_precision = observed_precision
        self._rules = rules
        self._metrics = metrics
        self._card_history = card_history
        self._terminals = terminals
        self._card_frauds = card_frauds
        self._tracker = tracker

    def process(self, batch: Batch[PendingRecord]) -> BatchReport:
        """Score the batch and send one output per record; return what the controller needs."""
        started = time.perf_counter()
        stages = Stages(batch, started)
        if self._reloader is not None:
            self._model.swap(self._reloader.take())
        records = batch.items
        transactions = [r.transaction for r in records]
        columns = _columns(transactions)
        history, changelog = self._history(records, columns)
        stages.done("state")
        event_time = (
            np.fromiter((t.event_time for t in transactions), np.int64, len(transactions))
            if columns is None
            else columns.event_time
        )
        terminal = (
            None
            if self._terminals is None
            else self._terminals.features([t.terminal_id for t in transactions], event_time)
        )
        card_frauds = (
            None
            if self._card_frauds is None
            else self._card_frauds.features([t.card_id for t in transactions], event_time)
        )
        stages.done("terminal")
        now_ms = time.time_ns() // 1_000_000
        rules = Rules.EMPTY if self._rules is None else self._rules.current

        def decide(scorer: Scorer, policy: DecisionPolicy, explainer: Explainer | None) -> Verdicts:
            return decide_batch(
                transactions,
                scorer,
                policy,
                now_ms,
                history=history,
                terminal=terminal,
                card_frauds=card_frauds,
                columns=columns,
                rules=rules,
                explainer=explainer,
                known_good=self._recent,
            )

        def by_rules(why: str) -> Verdicts:
            return decide_by_rules(
                transactions,
                self._model.policy,
                now_ms,
                why,
                history=history,
                terminal=terminal,
                card_frauds=card_frauds,
                columns=columns,
                rules=rules,
            )

        verdicts = self._model.decide(decide, by_rules)
        decided_at = time.time_ns() // 1_000_000
        if self._rules is not None:
            self._rules.observe(
                transactions, verdicts.features, verdicts.scores, self._model.policy.thresholds
            )
        stages.done("decide")
        model_version = self._model.scorer.model_version
        encoded = self._outputs.encode(records, verdicts, decided_at, model_version)
        self._count(verdicts, len(records), batch.wait_s, now_ms)
        stages.done("encode")

        failed = verdicts.failed
        outputs: Counter[OutputLabel] = Counter(
            ("decision", verdicts.decisions[i]) for i in encoded.rows
        )
        if failed:
            outputs["dead_letter", ScoreError.reason] = len(failed)
        if changelog:
            outputs["changelog", "card_state"] = sum(len(batch.card_ids) for batch in changelog)
        group = OutcomeGroup(
            self._tracker,
            [r.position for r in records],
            outputs,
            stages.on_delivered(self._metrics),
        )
        dead_letters = self._outputs.dead_letter(records, failed, group, model_version)
        contexts = trace_contexts(records, dead_letters)
        if changelog:
            assert self._card_history is not None
            topic = self._card_history.changelog_topic
            self._outputs.send_changelog(records, changelog, topic, group)
        self._outputs.send_decisions(records, verdicts, encoded, contexts, group)
        if self._shadow is not None:
            # After the decisions, and never waited for (stream/shadow.py).
            self._shadow.submit(
                transactions,
                verdicts,
                encoded.rows,
                (model_version, self._model.policy),
                decided_at,
            )
        if encoded.rows:
            decided = np.asarray(encoded.rows)
            event_time = verdicts.event_time[decided]
            self._metrics.observe_event_to_decision((decided_at - event_time) / 1000.0)
            if self._observed_precision is not None:
                flagged = [i for i in encoded.rows if verdicts.decisions[i] in (REVIEW, DECLINE)]
                if flagged:
                    self._observed_precision.note_flagged(
                        [transactions[i].transaction_id for i in flagged],
                        verdicts.event_time[flagged],
                    )
        if self._tracer is not None:
            outcome = BatchOutcome(len(records), len(encoded.rows), len(failed), model_version)
            self._tracer.batch_scored(contexts, time.perf_counter() - started, outcome)
        self._metrics.observe_stages(stages.seconds)
        latency_s = batch.wait_s + (time.perf_counter() - started)
        return BatchReport(len(records), latency_s, batch.closed_full)

    def _history(
        self, records: list[PendingRecord], columns: TransactionColumns | None
    ) -> tuple[npt.NDArray[np.float32] | None, list[ChangelogBatch]]:
        """The batch's history rows, once (outside the poison bisection: a state update
        applies once); neutral, with an error logged, should the state itself fail."""
        if self._card_history is None or columns is None:
            return None, []
        try:
            return self._card_history.update(records, columns)
        except Exception:
            log.exception("card history failed for a batch: its history features are neutral")
            return None, []

    def _count(self, verdicts: Verdicts, size: int, wait_s: float, now_ms: int) -> None:
        metrics = self._metrics
        decided = np.ones(size, bool)
        decided[list(verdicts.failed)] = False
        if decided.any():
            oldest = int(verdicts.event_time[decided].min())
            metrics.set_time_lag(max(0.0, (now_ms - oldest) / 1000.0))
        if verdicts.late:
            metrics.record_late(verdicts.late)
        if verdicts.by_rules_late:
            metrics.record_degraded("late", verdicts.by_rules_late)
        if verdicts.by_rules_model_unavailable:
            metrics.record_degraded("model_unavailable", verdicts.by_rules_model_unavailable)
        if verdicts.failed:
            metrics.record_poison(len(verdicts.failed))
        by_model = decided & ~verdicts.degraded
        if by_model.any():
            if self._recent is not None:
                self._recent.note(verdicts.features, by_model)
            metrics.observe_scores(verdicts.scores[by_model])
            self._model.drift.observe(verdicts.scores, verdicts.features, by_model)
        if verdicts.rule_counts:
            metrics.record_rule_hits(verdicts.rule_counts)
        if verdicts.reasons:
            metrics.observe_reasons(verdicts.reasons_s)
        metrics.record_batch(size, wait_s, verdicts.inference_s)


def _columns(transactions: list[Transaction]) -> TransactionColumns | None:
    """The batch's columns, read once for the state and the features; None when a record makes
    reading them fail (the decision path then isolates it)."""
    try:
        return TransactionColumns.from_transactions(transactions)
    except Exception:
        log.exception("reading a batch into columns failed: deciding it record by record")
        return None
