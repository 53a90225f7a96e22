"""Shadow scoring: a challenger model (`FRAUD_SHADOW_MODEL`) scores every decided transaction
beside the served one, and what it would have decided goes to the shadow topic and the metrics;
it never changes a decision.

The challenger scores the feature rows the served model just scored (`Verdicts.features`) in one
more model call per batch, on its own session (the GPU where there is one). Each decided record
gets one `ShadowDecision`, an output of the batch's outcome group like its decision, so its
offsets commit only once the shadow record is acknowledged too. Both models' labels are their own
thresholds applied to their scores, rules not applied, so the two compare model against model;
the record also says what was decided. `fraud_shadow_decisions_total{served,shadow}` counts the
label pairs (agreement is the diagonal, the decisions that would change the rest);
`fraud_model_score` and `fraud_shadow_model_score` hold the two score distributions. If the
challenger fails on a batch, the batch is decided and sent without shadow records, with a
warning and `fraud_shadow_failures_total`. The challenger is reloaded like the served model
(stream/model_reload.py) when its path names a new package.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from contracts.errors import ScoreError
from contracts.shadow import ShadowDecision, encode_shadow_decision
from contracts.transaction import Transaction
from scorer.decide import DecisionPolicy, Verdicts
from scorer.decisions import classify, valid_scores
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, ServingModel

log = logging.getLogger(__name__)


class ShadowRecords(NamedTuple):
    """The shadow topic's records of one batch, row-aligned with the decided rows given."""

    keys: list[bytes]
    values: list[bytes]


class Shadow:
    """The challenger in shadow, and the shadow topic it writes to."""

    def __init__(
        self,
        model: ServingModel,
        topic: str,
        metrics: ServiceMetrics,
        reloader: ModelReloader | None = None,
    ) -> None:
        self._model = model
        self.topic = topic
        self._metrics = metrics
        self._reloader = reloader

    @property
    def model_version(self) -> str:
        return self._model.scorer.model_version

    def start(self) -> None:
        if self._reloader is not None:
            self._reloader.start()

    def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.stop()

    def records(
        self,
        transactions: Sequence[Transaction],
        verdicts: Verdicts,
        rows: list[int],
        served: tuple[str, DecisionPolicy],
        decided_at: int,
    ) -> ShadowRecords | None:
        """The challenger's view of the decided `rows` of a batch (`served`: the served model's
        version and policy); None when the challenger failed on it."""
        if self._reloader is not None:
            fresh = self._reloader.take()
            if fresh is not None:
                self._model = fresh
                log.info("shadow model %s scores from this batch on", self.model_version)
        if not rows:
            return ShadowRecords([], [])
        index = np.asarray(rows, np.intp)
        try:
            scores = self._model.scorer.score(verdicts.features[index])
            if len(scores) != len(rows) or not valid_scores(scores).all():
                raise ScoreError(f"{len(scores)} scores for {len(rows)} rows, not all in [0, 1]")
        except ScoreError as exc:
            self._metrics.record_shadow_failure()
            log.warning("shadow model %s failed on a batch: %s", self.model_version, exc)
            return None
        served_version, served_policy = served
        served_scores = verdicts.scores[index]
        labels = classify(scores, self._model.policy.thresholds)
        served_labels = classify(served_scores, served_policy.thresholds)
        self._metrics.record_shadow(scores, Counter(zip(served_labels, labels, strict=True)))
        version = self.model_version
        keys, values = [], []
        for j, i in enumerate(rows):
            t = transactions[i]
            keys.append(t.card_id.encode())
            values.append(
                encode_shadow_decision(
                    ShadowDecision(
                        transaction_id=t.transaction_id,
                        card_id=t.card_id,
                        model_version=version,
                        score=float(scores[j]),
                        decision=labels[j],
                        served_model_version=served_version,
                        served_score=float(served_scores[j]),
                        served_decision=served_labels[j],
                        decided=verdicts.labels[i],
                        event_time=t.event_time,
                        decided_at=decided_at,
                    )
                )
            )
        return ShadowRecords(keys, values)
