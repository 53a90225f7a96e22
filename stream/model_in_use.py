"""The model that decides a scoring stage's batches, and what it does when that model cannot be
trusted.

A new model (from `stream/model_reload.py`) serves on probation: while it does, a batch it fails
for the most part is decided again by the model before it, and if that one does better, the new
model is rolled back (counted and logged). A model with no model before it to go back to is
judged by what it fails of its last records, and found unavailable (its batch decided by the
fallback rules) rather than letting it dead-letter the traffic. The scoring stage
(`stream/scoring.py`) asks `ModelInUse` for each batch's verdicts and decides nothing about
models itself. The drift of the model in use is measured by `stream/drift_watch.py`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from scorer.decide import DecisionPolicy, Verdicts
from scorer.flag_rate import range_in_use
from scorer.model import Scorer
from scorer.reasons import Explainer
from stream.drift_watch import DriftWatch
from stream.metrics import ServiceMetrics
from stream.model_reload import ServingModel

log = logging.getLogger(__name__)

#: How a batch is decided by a given model: scorer, policy, explainer → the batch's verdicts.
Decide = Callable[[Scorer, DecisionPolicy, Explainer | None], Verdicts]


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


class ModelInUse:
    """The model that decides batches (its scorer, policy and explainer, and its drift
    measurement), on probation when it is new."""

    def __init__(
        self,
        scorer: Scorer,
        policy: DecisionPolicy,
        explainer: Explainer | None,
        *,
        metrics: ServiceMetrics,
        drift_window: int,
    ) -> None:
        self.scorer = scorer
        self.policy = policy
        self.explainer = explainer
        self._metrics = metrics
        #: The served model's drift measurement, fed by the scoring stage.
        self.drift = DriftWatch(scorer, metrics=metrics, window=drift_window)
        self._probation: _Probation | None = None
        self._failures = _Failures()

    def decide(self, decide: Decide, by_rules: Callable[[str], Verdicts]) -> Verdicts:
        """A batch's verdicts: by the model in use (`decide`); under a model on probation, the
        model before it's when it does better; by the fallback rules (`by_rules`, told why)
        when a model with none before it is unavailable."""
        verdicts = decide(self.scorer, self.policy, self.explainer)
        if self._probation is not None:
            return self._on_probation(verdicts, decide)
        if self._failures.unavailable(verdicts):
            return by_rules(
                f"model {self.scorer.model_version} failed {self._failures}, and there is no "
                "model before it to go back to"
            )
        return verdicts

    def swap(self, model: ServingModel | None) -> None:
        """Score from now on with `model`, when there is a new one, on probation: the model
        before it (the last one that passed its probation) is kept to roll back to."""
        if model is None:
            return
        previous = (
            self._probation.previous
            if self._probation is not None
            else _Model(self.scorer, self.policy, self.explainer)
        )
        self._install(_Model(model.scorer, model.policy, model.explainer))
        self._probation = _Probation(previous, PROBATION_RECORDS)

    def _on_probation(self, verdicts: Verdicts, decide: Decide) -> Verdicts:
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
        failed = self.scorer.model_version
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
        self.scorer, self.policy, self.explainer = model
        self._failures = _Failures()
        provider = str(getattr(model.scorer, "provider", "unknown"))
        self._metrics.set_model(
            model.scorer.model_version,
            provider,
            range_in_use(getattr(model.scorer, "package", None), model.policy.thresholds),
        )
        self.drift.follow(model.scorer)
        log.info("model %s serves from this batch on", model.scorer.model_version)


def _failing(verdicts: Verdicts) -> int:
    """Records of a batch its model did not decide: dead-lettered, or decided by the fallback
    rules because the model was found broken (late records decided by the rules are not its
    failure)."""
    return len(verdicts.failed) + verdicts.by_rules_model_unavailable
