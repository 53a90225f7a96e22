"""A decided batch's outputs, handed to the sink: its decisions, the dead letters of the records
that failed, and the card states its updates changed (the changelog records).

Every output of a batch joins the batch's outcome group (`stream/outcomes.py`), so its offsets
are stored only once all of them are acknowledged. A record whose decision cannot be encoded is
dead-lettered like one the model failed on, so that no record is left without an output.
Decisions go out with their transaction's trace context (`contracts/trace_context.py`).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from contracts.decision import Decision, encode_features
from contracts.output_formats import DecisionEncoder
from contracts.trace_context import batch_trace_headers, trace_context
from deadletter.router import DeadLetterRecord, DeadLetterRouter
from plumbing.errors import ScoreError
from scorer.decide import Verdicts
from scorer.isolation import as_score_error
from stream.card_history_changelog import ChangelogBatch
from stream.outcomes import OutcomeGroup
from stream.pending_record import PendingRecord
from stream.sink import Headers, Output, OutputSink

log = logging.getLogger(__name__)


class EncodedDecisions(NamedTuple):
    """A batch's encoded decisions: each one's index in the batch, key and value."""

    rows: list[int]
    keys: list[bytes]
    values: list[bytes]


class BatchOutputs:
    """Sends a decided batch's outputs (decisions, dead letters, changelog records) to the sink."""

    def __init__(
        self,
        sink: OutputSink,
        router: DeadLetterRouter,
        *,
        output_topic: str,
        encode: DecisionEncoder,
        log_features: bool,
    ) -> None:
        """`encode`: how a decision becomes the output's value (FRAUD_OUTPUT_FORMAT);
        `log_features`: each decision carries its feature row (FRAUD_DECISION_FEATURES)."""
        self._sink = sink
        self._router = router
        self._output_topic = output_topic
        self._encode_decision = encode
        self._log_features = log_features

    def encode(
        self, records: list[PendingRecord], verdicts: Verdicts, decided_at: int, model_version: str
    ) -> EncodedDecisions:
        """Keys and values of the decisions; a record whose decision cannot be encoded joins
        the failed ones (it is dead-lettered like a record the model fails on)."""
        encoded = EncodedDecisions([], [], [])
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

    def dead_letter(
        self,
        records: list[PendingRecord],
        failed: dict[int, ScoreError],
        group: OutcomeGroup,
        model_version: str,
    ) -> dict[int, DeadLetterRecord]:
        """Dead-letter the failed records; their letters, by batch index."""
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

    def send_changelog(
        self,
        records: list[PendingRecord],
        changelog: list[ChangelogBatch],
        topic: str,
        group: OutcomeGroup,
    ) -> None:
        """The batch's card states, to the changelog `topic`: one shared-callback send per
        partition."""
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

    def send_decisions(
        self,
        records: list[PendingRecord],
        verdicts: Verdicts,
        encoded: EncodedDecisions,
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


def trace_contexts(
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
