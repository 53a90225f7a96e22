"""The scoring stage: a closed micro-batch → one decision path (`scorer.decide`) → decisions,
and dead letters for records that failed, handed to the sink.

`BatchScorer` decides one batch and is plain logic over the `Scorer` and `OutputSink`
interfaces, so it is unit-tested with fakes. `stream/scoring_thread.py` runs it, one batch at a
time and in order, on the consuming thread or its own (`FRAUD_SCORING`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from contracts.decision import DECLINE, REVIEW, Decision, encode_decision, encode_features
from contracts.offsets import OffsetTracker, SourceOffset
from contracts.output_formats import DecisionEncoder
from contracts.trace_context import batch_trace_headers, trace_context
from contracts.transaction import Transaction
from deadletter.router import DeadLetterRecord, DeadLetterRouter
from plumbing.errors import ScoreError
from scorer.columns import TransactionColumns
from scorer.decide import DecisionPolicy, Verdicts, decide_batch, decide_by_rules
from scorer.drift import DEFAULT_WINDOW as DEFAULT_DRIFT_WINDOW
from scorer.drift import DriftWindow
from scorer.features import FEATURE_NAMES
from scorer.flag_rate import range_in_use
from scorer.isolation import as_score_error
from scorer.model import Scorer
from scorer.reasons import Explainer
from scorer.recent_rows import RecentRows
from scorer.rules import Rules
from stream.batcher import Batch
from stream.card_changelog import ChangelogBatch
from stream.card_state import CardState
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, ServingModel
from stream.observed_precision import ObservedPrecision
from stream.outcomes import OutcomeGroup, OutputLabel
from stream.rules_table import RulesTable
from stream.shadow import Shadow
from stream.sink import Headers, Output, OutputSink
from stream.tracing import BatchOutcome, BatchTracer
from stream.worker_tables import CardFraudsTable, TerminalRiskTable

log = logging.getLogger(__name__)


class PendingRecord(NamedTuple):
    """A consumed, valid transaction waiting in a micro-batch."""

    message: Message
    transaction: Transaction
    #: Where it came from, as the offset tracker knows it.
    position: SourceOffset


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


class _Encoded(NamedTuple):
    rows: list[int]
    keys: list[bytes]
    values: list[bytes]


#: Records a newly loaded model decides on probation: while it does, a batch it fails for the
#: most part (dead letters, or the fallback rules) is decided again by the model before it, and
#: if that one does better, the new model is rolled back. A model that fails on real traffic
#: shows it in its first batch; the model before is kept (its session's memory) until then.
PROBATION_RECORDS = 10_000


class _Model(NamedTuple):
    """What a batch is decided with."""

    scorer: Scorer
    policy: DecisionPolicy
    explainer: Explainer | None


class _Probation(NamedTuple):
    """A new model on probation: the model it replaced, and how many records it has left."""

    previous: _Model
    records_left: int


#: A model with no model before it to go back to (the one a replica started with, or one past
#: its probation) is unavailable, its batch decided by the fallback rules, when it failed most
#: of its last JUDGED_RECORDS records (whole batches, this one included) and at least
#: MIN_FAILED of them: then the records are not at fault, the model is. A few poison records
#: (fewer than MIN_FAILED, or among records the model decides) are still dead-lettered.
JUDGED_RECORDS = 64
MIN_FAILED = 8


class _Failures:
    """What a model failed of its last records: dead letters, or the fallback rules because it
    failed a known-good row (`_failing`), over whole batches covering JUDGED_RECORDS."""

    def __init__(self) -> None:
        self._batches: deque[tuple[int, int]] = deque()
        self._records = 0
        self._failed = 0

    def unavailable(self, verdicts: Verdicts) -> bool:
        """Count the batch; whether the model is unavailable for it: it failed most of its last
        records, and some of this batch's records would be dead-lettered for it."""
        size, failed = len(verdicts.decisions), _failing(verdicts)
        self._batches.append((size, failed))
        self._records += size
        self._failed += failed
        while self._records - self._batches[0][0] >= JUDGED_RECORDS:
            gone, gone_failed = self._batches.popleft()
            self._records -= gone
            self._failed -= gone_failed
        return (
            bool(verdicts.failed)
            and self._failed >= MIN_FAILED
            and self._failed > self._records / 2
        )

    def __str__(self) -> str:
        return f"{self._failed} of its last {self._records} records"


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
        card_state: CardState | None = None,
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
        self._probation: _Probation | None = None
        self._failures = _Failures()
        self._log_features = log_features
        self._encode_decision = encode
        self._drift_window = drift_window
        self._drift = _drift_of(scorer, drift_window)
        self._reloader = reloader
        self._shadow = shadow
        self._observed_precision = observed_precision
        self._rules = rules
        self._explainer = explainer
        self._metrics = metrics
        self._card_state = card_state
        self._terminals = terminals
        self._card_frauds = card_frauds
        self._scorer = scorer
        self._sink = sink
        self._tracker = tracker
        self._router = router
        self._output_topic = output_topic
        self._policy = policy

    def process(self, batch: Batch[PendingRecord]) -> BatchReport:
        """Score the batch and send one output per record; return what the controller needs."""
        started = time.perf_counter()
        stages = Stages(batch, started)
        if self._reloader is not None:
            self._swap_model(self._reloader.take())
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

        verdicts = decide(self._scorer, self._policy, self._explainer)
        if self._probation is not None:
            verdicts = self._on_probation(verdicts, decide)
        elif self._failures.unavailable(verdicts):
            verdicts = decide_by_rules(
                transactions,
                self._policy,
                now_ms,
                f"model {self._scorer.model_version} failed {self._failures}, and there is no "
                "model before it to go back to",
                history=history,
                terminal=terminal,
                card_frauds=card_frauds,
                columns=columns,
                rules=rules,
            )
        decided_at = time.time_ns() // 1_000_000
        if self._rules is not None:
            self._rules.observe(
                transactions, verdicts.features, verdicts.scores, self._policy.thresholds
            )
        stages.done("decide")
        encoded = self._encode(records, verdicts, decided_at)
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
        dead_letters = self._dead_letter(records, failed, group)
        contexts = _trace_contexts(records, dead_letters)
        self._send_changelog(records, changelog, group)
        self._send_decisions(records, verdicts, encoded, contexts, group)
        if self._shadow is not None:
            # After the decisions, and never waited for (stream/shadow.py).
            self._shadow.submit(
                transactions,
                verdicts,
                encoded.rows,
                (self._scorer.model_version, self._policy),
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
            outcome = BatchOutcome(
                len(records), len(encoded.rows), len(failed), self._scorer.model_version
            )
            self._tracer.batch_scored(contexts, time.perf_counter() - started, outcome)
        self._metrics.observe_stages(stages.seconds)
        latency_s = batch.wait_s + (time.perf_counter() - started)
        return BatchReport(len(records), latency_s, batch.closed_full)

    def _swap_model(self, model: ServingModel | None) -> None:
        """Score from now on with `model`, when there is a new one, on probation: the model
        before it (the last one that passed its probation) is kept to roll back to."""
        if model is None:
            return
        previous = (
            self._probation.previous
            if self._probation is not None
            else _Model(self._scorer, self._policy, self._explainer)
        )
        self._install(_Model(model.scorer, model.policy, model.explainer))
        self._probation = _Probation(previous, PROBATION_RECORDS)

    def _on_probation(
        self,
        verdicts: Verdicts,
        decide: Callable[[Scorer, DecisionPolicy, Explainer | None], Verdicts],
    ) -> Verdicts:
        """The batch's verdicts under a model on probation: when it failed most records and
        the model before it does better on the same batch, that model's, and it serves again."""
        probation = self._probation
        assert probation is not None
        size = len(verdicts.decisions)
        if _failing(verdicts) > size / 2:
            before = decide(
                probation.previous.scorer, probation.previous.policy, probation.previous.explainer
            )
            if _failing(before) < _failing(verdicts):
                self._roll_back(probation.previous, _failing(verdicts), size)
                return before
        left = probation.records_left - size
        self._probation = probation._replace(records_left=left) if left > 0 else None
        return verdicts

    def _roll_back(self, previous: _Model, failing: int, size: int) -> None:
        """Serve `previous` again, for good: counted and logged. The reloader does not offer the
        package it left again: it loads a source once, until the source changes."""
        failed = self._scorer.model_version
        self._probation = None
        self._install(previous)
        self._metrics.count_model_rollback()
        log.error(
            "model %s failed %s of the %s records of a batch that model %s decided: rolled back "
            "to %s, which decided the batch; %s is not loaded again until its source changes",
            failed,
            failing,
            size,
            previous.scorer.model_version,
            previous.scorer.model_version,
            failed,
        )

    def _install(self, model: _Model) -> None:
        """Score from now on with `model`."""
        self._scorer, self._policy, self._explainer = model
        self._failures = _Failures()
        self._drift = _drift_of(model.scorer, self._drift_window)
        provider = str(getattr(model.scorer, "provider", "unknown"))
        self._metrics.set_model(
            model.scorer.model_version,
            provider,
            range_in_use(getattr(model.scorer, "package", None), model.policy.thresholds),
        )
        self._metrics.clear_drift()
        log.info("model %s serves from this batch on", model.scorer.model_version)

    def _history(
        self, records: list[PendingRecord], columns: TransactionColumns | None
    ) -> tuple[npt.NDArray[np.float32] | None, list[ChangelogBatch]]:
        """The batch's history rows, once (outside the poison bisection: a state update
        applies once); neutral, with an error logged, should the state itself fail."""
        if self._card_state is None or columns is None:
            return None, []
        try:
            return self._card_state.update(records, columns)
        except Exception:
            log.exception("card history failed for a batch: its history features are neutral")
            return None, []

    def _send_changelog(
        self, records: list[PendingRecord], changelog: list[ChangelogBatch], group: OutcomeGroup
    ) -> None:
        """The batch's card states, one shared-callback send per partition."""
        if not changelog:
            return
        assert self._card_state is not None
        topic = self._card_state.changelog_topic
        for batch in changelog:

            def output_of(i: int, batch: ChangelogBatch = batch) -> Output:
                return Output(
                    kind="changelog",
                    topic=topic,
                    key=batch.card_ids[i],
                    value=batch.states[i],
                    headers=None,
                    source=records[batch.batch_index].message,
                    group=group,
                    label="card_state",
                    partition=batch.partition,
                )

            self._sink.send_batch(
                topic, batch.card_ids, batch.states, group, output_of, batch.partition
            )

    def _encode(
        self, records: list[PendingRecord], verdicts: Verdicts, decided_at: int
    ) -> _Encoded:
        """Keys and values of the decisions; a record whose decision cannot be encoded joins
        the failed ones (it is dead-lettered like a record the model fails on)."""
        encoded = _Encoded([], [], [])
        model_version = self._scorer.model_version
        scores = verdicts.scores.tolist()
        degraded = verdicts.degraded.tolist()
        failed = verdicts.failed
        features = verdicts.features if self._log_features else None
        for i, record in enumerate(records):
            if i in failed:
                continue
            t = record.transaction
            try:
                value = self._encode_decision(
                    Decision(
                        transaction_id=t.transaction_id,
                        card_id=t.card_id,
                        score=scores[i],
                        decision=verdicts.decisions[i],
                        model_version=model_version,
                        degraded=degraded[i],
                        event_time=t.event_time,
                        decided_at=decided_at,
                        reasons=verdicts.reasons.get(i, ()),
                        rules=verdicts.rule_hits.get(i, ()),
                        features="" if features is None else encode_features(features[i]),
                    )
                )
                key = t.card_id.encode()
            except Exception as exc:
                failed[i] = as_score_error(exc)
                continue
            encoded.rows.append(i)
            encoded.keys.append(key)
            encoded.values.append(value)
        return encoded

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
            if self._drift is not None:
                psi = self._drift.observe(verdicts.scores[by_model], verdicts.features[by_model])
                if psi is not None:
                    metrics.set_drift(psi)
        if verdicts.rule_counts:
            metrics.record_rule_hits(verdicts.rule_counts)
        if verdicts.reasons:
            metrics.observe_reasons(verdicts.reasons_s)
        metrics.record_batch(size, wait_s, verdicts.inference_s)

    def _dead_letter(
        self, records: list[PendingRecord], failed: dict[int, ScoreError], group: OutcomeGroup
    ) -> dict[int, DeadLetterRecord]:
        """Dead-letter the failed records; their letters, by batch index."""
        model_version = self._scorer.model_version
        letters = {}
        for i, error in failed.items():
            (topic, partition), offset = records[i].position
            log.warning(
                "poison record topic=%s partition=%s offset=%s: %s", topic, partition, offset, error
            )
            letter = letters[i] = self._router.dead_letter(
                records[i].message, error, model_version=model_version
            )
            self._sink.send(Output.dead_letter(letter, records[i].message, group))
        return letters

    def _send_decisions(
        self,
        records: list[PendingRecord],
        verdicts: Verdicts,
        encoded: _Encoded,
        contexts: list[Headers | None] | None,
        group: OutcomeGroup,
    ) -> None:
        """The decisions, each with its transaction's trace context (contracts/trace_context.py)
        when the batch has any."""
        if not encoded.rows:
            return
        topic = self._output_topic
        headers = None if contexts is None else [contexts[i] for i in encoded.rows]

        def output_of(j: int) -> Output:
            i = encoded.rows[j]
            return Output(
                kind="decision",
                topic=topic,
                key=encoded.keys[j],
                value=encoded.values[j],
                headers=None if contexts is None else contexts[i],
                source=records[i].message,
                group=group,
                label=verdicts.decisions[i],
            )

        self._sink.send_batch(
            topic, encoded.keys, encoded.values, group, output_of, headers=headers
        )


def _failing(verdicts: Verdicts) -> int:
    """Records of a batch its model did not decide: dead-lettered, or decided by the fallback
    rules because the model was found broken (late records decided by the rules are not its
    failure)."""
    return len(verdicts.failed) + verdicts.by_rules_model_unavailable


def _drift_of(scorer: Scorer, window: int) -> DriftWindow | None:
    """The drift measurement of a model whose package has a [drift] reference."""
    package = getattr(scorer, "package", None)
    reference = None if package is None else package.manifest.drift
    if reference is None:
        return None
    return DriftWindow(
        reference, {name: FEATURE_NAMES.index(name) for name in reference.features}, window
    )


def _trace_contexts(
    records: list[PendingRecord], dead_letters: dict[int, DeadLetterRecord]
) -> list[Headers | None] | None:
    """Each record's trace context, for its decision and the batch's span; a dead-lettered
    record's from its letter, which read its headers already."""
    if not dead_letters:
        return batch_trace_headers([r.message for r in records])
    decided = [i for i in range(len(records)) if i not in dead_letters]
    read = batch_trace_headers([records[i].message for i in decided]) or [None] * len(decided)
    contexts: list[Headers | None] = [None] * len(records)
    for i, context in zip(decided, read, strict=True):
        contexts[i] = context
    for i, letter in dead_letters.items():
        contexts[i] = trace_context(letter.headers)
    return contexts if any(contexts) else None


def _columns(transactions: list[Transaction]) -> TransactionColumns | None:
    """The batch's columns, read once for the state and the features; None when a record makes
    reading them fail (the decision path then isolates it)."""
    try:
        return TransactionColumns.from_transactions(transactions)
    except Exception:
        log.exception("reading a batch into columns failed: deciding it record by record")
        return None
