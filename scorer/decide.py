"""The one decision path: transactions → columns → features → scores → rules → decisions,
with reasons for the flagged ones.

The service, the benchmark and training all call `decide_batch`, so there is a single place
where a score becomes a decision. It handles, for one micro-batch:

- rules (`scorer/rules.py`, FRAUD_RULES): deny and allow lists, segment thresholds and
  expression rules overrule the model's decision; each hit is named in the decision;
- reasons (`scorer/reasons.py`): every review and decline the model scored gets its top
  reasons, from one extra model call over the flagged rows only; a failure there leaves the
  decisions without reasons, never undecided;
- lateness: with the `fallback` late policy, a transaction already past its decision deadline
  is decided by the rules (`scorer/fallback.py`), `degraded`;
- poison: a record that makes any step raise, or gets a score that is not a probability, is
  isolated by bisection (`scorer/isolation.py`) and returned as failed, to be dead-lettered;
  its batch-mates are decided;
- a broken model (it fails even on a known-good row): every record is decided by the rules,
  `degraded` (`decide_by_rules`, which the scoring stage also calls for a model that fails
  most records with nothing to roll back to).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from contracts.decision import APPROVE, Reason
from plumbing.errors import ModelUnavailableError, ScoreError
from scorer.decisions import Thresholds, valid_scores
from scorer.fallback import fallback_scores
from scorer.features import (
    NUM_FEATURES,
    TransactionColumns,
    TransactionFields,
    build_features,
)
from scorer.isolation import Canary, bisect_failures
from scorer.model import Scorer
from scorer.reasons import Explainer
from scorer.recent_rows import RecentRows
from scorer.rules import Rules

log = logging.getLogger(__name__)

LatePolicy = Literal["score", "fallback"]
#: Rule hits that set a decision whatever the score (an allow list only ever approves).
_FORCING = ("deny:", "rule:")


class DecisionPolicy(NamedTuple):
    """How scores become decisions."""

    thresholds: Thresholds
    #: A transaction is late when decided more than this after its event_time; 0 disables.
    decision_deadline_ms: float = 1_000.0
    #: Late transactions: `score` them anyway (counted), or decide them by the `fallback` rules.
    late_policy: LatePolicy = "score"


class Verdicts(NamedTuple):
    """The outcome of each record of a batch, by index."""

    #: Fraud probability; NaN where the record failed.
    scores: npt.NDArray[np.float32]
    #: approve / review / decline; "" where the record failed.
    decisions: list[str]
    #: Decided by the rules instead of the model.
    degraded: npt.NDArray[np.bool_]
    #: Each transaction's event_time (0 where the record failed).
    event_time: npt.NDArray[np.int64]
    #: Records to dead-letter, with why.
    failed: dict[int, ScoreError]
    #: Records found past their decision deadline.
    late: int
    #: Records the rules decided: late (`fallback` policy) and with the model unavailable.
    by_rules_late: int
    by_rules_model_unavailable: int
    #: Seconds spent in the model, reasons excluded.
    inference_s: float
    #: The model's reasons for each review and decline it scored, by index.
    reasons: dict[int, tuple[Reason, ...]]
    #: The FRAUD_RULES hits of each record some rule hit, by index.
    rule_hits: dict[int, tuple[str, ...]]
    #: Hits per rule over the batch.
    rule_counts: Counter[str]
    #: Seconds spent computing reasons.
    reasons_s: float
    #: The feature rows the batch was scored with [B, NUM_FEATURES] (zeros where the record
    #: failed): what a shadow model scores and feature logging records.
    features: npt.NDArray[np.float32]


class _Part(NamedTuple):
    scores: npt.NDArray[np.float32]
    decisions: list[str]
    by_rules: npt.NDArray[np.bool_]
    event_time: npt.NDArray[np.int64]
    invalid: dict[int, ScoreError]
    late: int
    inference_s: float
    reasons: dict[int, tuple[Reason, ...]]
    rule_hits: dict[int, tuple[str, ...]]
    rule_counts: Counter[str]
    reasons_s: float
    features: npt.NDArray[np.float32]


class _FallbackScorer:
    """The fallback rules behind the `Scorer` interface, for when the model is unavailable."""

    model_version = "rules"

    def warm_up(self) -> float:
        return 0.0

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return fallback_scores(features)


class _State(NamedTuple):
    """What the caller computed once per batch (state updates must apply once; columns are
    read once): history, terminal and card-fraud features and the batch's columns, sliced
    along with the records during isolation."""

    history: npt.NDArray[np.float32] | None
    terminal: npt.NDArray[np.float32] | None
    card_frauds: npt.NDArray[np.float32] | None
    columns: TransactionColumns | None

    def rows(self, part: Sequence[int]) -> _State:
        index = np.asarray(part, np.int64)
        return _State(
            None if self.history is None else self.history[index],
            None if self.terminal is None else self.terminal[index],
            None if self.card_frauds is None else self.card_frauds[index],
            None if self.columns is None else self.columns.rows(index),
        )


def decide_batch(
    transactions: Sequence[TransactionFields],
    scorer: Scorer,
    policy: DecisionPolicy,
    now_ms: int,
    *,
    history: npt.NDArray[np.float32] | None = None,
    terminal: npt.NDArray[np.float32] | None = None,
    card_frauds: npt.NDArray[np.float32] | None = None,
    columns: TransactionColumns | None = None,
    rules: Rules = Rules.EMPTY,
    explainer: Explainer | None = None,
    known_good: RecentRows | None = None,
) -> Verdicts:
    """Decide every transaction of a batch: a decision, or a failure to dead-letter.

    `history` [B, NUM_HISTORY_FEATURES] (from the card state) and `terminal`
    [B, NUM_TERMINAL_FEATURES] (from `terminal-risk`) and `card_frauds`
    [B, NUM_CARD_FRAUD_FEATURES] (from `card-frauds`) are row-aligned with `transactions`;
    None: unknown, neutral values (`build_features`). `columns`: the transactions' columns,
    when the caller has read them already. `rules` overrule the model; `explainer` gives the
    model's flagged rows their reasons (None: no reasons). `known_good`: recent rows a model
    decided; a model that fails most of them is broken, not the batch's records.
    """
    state = _State(history, terminal, card_frauds, columns)
    try:
        return _decide_isolating(
            transactions, state, scorer, policy, now_ms, rules, explainer, known_good
        )
    except ModelUnavailableError as exc:
        return decide_by_rules(
            transactions,
            policy,
            now_ms,
            str(exc),
            history=history,
            terminal=terminal,
            card_frauds=card_frauds,
            columns=columns,
            rules=rules,
        )


def decide_by_rules(
    transactions: Sequence[TransactionFields],
    policy: DecisionPolicy,
    now_ms: int,
    why: str,
    *,
    history: npt.NDArray[np.float32] | None = None,
    terminal: npt.NDArray[np.float32] | None = None,
    card_frauds: npt.NDArray[np.float32] | None = None,
    columns: TransactionColumns | None = None,
    rules: Rules = Rules.EMPTY,
) -> Verdicts:
    """Decide every transaction of a batch by the fallback rules, `degraded`: the model is
    unavailable (`why`, logged). Only a record whose features cannot be built fails."""
    log.error("model unavailable, deciding %s records by rules: %s", len(transactions), why)
    return _decide_isolating(
        transactions,
        _State(history, terminal, card_frauds, columns),
        _FallbackScorer(),
        policy,
        now_ms,
        rules,
        None,
        model_down=True,
    )


def _decide_isolating(
    transactions: Sequence[TransactionFields],
    state: _State,
    scorer: Scorer,
    policy: DecisionPolicy,
    now_ms: int,
    rules: Rules,
    explainer: Explainer | None,
    known_good: RecentRows | None = None,
    *,
    model_down: bool = False,
) -> Verdicts:
    n = len(transactions)
    canary = Canary(scorer, known_good)
    parts, failed = bisect_failures(
        range(n),
        lambda part: _decide(
            [transactions[i] for i in part],
            state if len(part) == n else state.rows(part),
            scorer,
            policy,
            now_ms,
            rules,
            explainer,
            canary,
        ),
        canary.check,
    )
    scores = np.full(n, np.nan, np.float32)
    decisions = [""] * n
    by_rules = np.zeros(n, bool)
    event_time = np.zeros(n, np.int64)
    late = 0
    inference_s = reasons_s = 0.0
    reasons: dict[int, tuple[Reason, ...]] = {}
    rule_hits: dict[int, tuple[str, ...]] = {}
    rule_counts: Counter[str] = Counter()
    features = np.zeros((n, NUM_FEATURES), np.float32)
    for start, part in parts:
        stop = start + len(part.scores)
        features[start:stop] = part.features
        scores[start:stop] = part.scores
        decisions[start:stop] = part.decisions
        by_rules[start:stop] = part.by_rules
        event_time[start:stop] = part.event_time
        failed.update({start + i: error for i, error in part.invalid.items()})
        reasons.update({start + i: why for i, why in part.reasons.items()})
        rule_hits.update({start + i: hits for i, hits in part.rule_hits.items()})
        rule_counts += part.rule_counts
        late += part.late
        inference_s += part.inference_s
        reasons_s += part.reasons_s
    for i in failed:
        scores[i], decisions[i], by_rules[i], features[i] = np.nan, "", False, 0.0
        reasons.pop(i, None)
        rule_hits.pop(i, None)
    decided = n - len(failed)
    degraded = np.ones(n, bool) if model_down else by_rules
    if model_down:
        degraded[list(failed)] = False
    return Verdicts(
        scores=scores,
        decisions=decisions,
        degraded=degraded,
        event_time=event_time,
        failed=failed,
        late=late,
        by_rules_late=0 if model_down else int(by_rules.sum()),
        by_rules_model_unavailable=decided if model_down else 0,
        inference_s=inference_s,
        reasons=reasons,
        rule_hits=rule_hits,
        rule_counts=rule_counts,
        reasons_s=reasons_s,
        features=features,
    )


def _decide(
    transactions: Sequence[TransactionFields],
    state: _State,
    scorer: Scorer,
    policy: DecisionPolicy,
    now_ms: int,
    rules: Rules,
    explainer: Explainer | None,
    canary: Canary,
) -> _Part:
    """Scores and decisions of one batch or part of it; raises whatever a record provokes."""
    columns = state.columns
    if columns is None:
        columns = TransactionColumns.from_transactions(transactions)
    features = build_features(columns, state.history, state.terminal, state.card_frauds)
    late = np.zeros(len(features), bool)
    if policy.decision_deadline_ms:
        late = columns.event_time + policy.decision_deadline_ms < now_ms
    by_rules = late if policy.late_policy == "fallback" else np.zeros(len(features), bool)
    scores = np.empty(len(features), np.float32)
    model_rows = np.flatnonzero(~by_rules)
    started = time.perf_counter()
    if len(model_rows):
        model_scores = scorer.score(features[model_rows])
        if len(model_scores) != len(model_rows):
            raise ScoreError(
                f"model returned {len(model_scores)} scores for {len(model_rows)} rows"
            )
        scores[model_rows] = model_scores
    inference_s = time.perf_counter() - started
    if by_rules.any():
        scores[by_rules] = fallback_scores(features[by_rules])
    invalid: dict[int, ScoreError] = {}
    bad = np.flatnonzero(~valid_scores(scores))
    if len(bad):
        error = ScoreError(f"model returned score {float(scores[bad[0]])!r}")
        canary.check(error)
        invalid = {int(i): ScoreError(f"model returned score {float(scores[i])!r}") for i in bad}
    ruled = rules.decide(columns, features, np.nan_to_num(scores), policy.thresholds)
    rule_hits = {i: hits for i, hits in enumerate(ruled.hits) if hits and i not in invalid}
    # A decision a deny list or an expression rule forced, where the model approved, is the
    # rules' (its `rules` say why), not the model's: it gets no model reasons.
    forced = np.zeros(len(scores), np.bool_)
    forced[[i for i, hits in rule_hits.items() if any(h.startswith(_FORCING) for h in hits)]] = True
    model_flagged = ~forced | (np.nan_to_num(scores) >= policy.thresholds.review)
    started = time.perf_counter()
    reasons = _reasons(
        explainer, features, scores, ruled.decisions, by_rules | ~model_flagged, invalid
    )
    return _Part(
        scores,
        ruled.decisions,
        by_rules,
        columns.event_time,
        invalid,
        int(late.sum()),
        inference_s,
        reasons,
        rule_hits,
        Counter(name for hits in rule_hits.values() for name in hits),
        time.perf_counter() - started,
        features,
    )


def _reasons(
    explainer: Explainer | None,
    features: npt.NDArray[np.float32],
    scores: npt.NDArray[np.float32],
    decisions: list[str],
    not_the_models: npt.NDArray[np.bool_],
    invalid: dict[int, ScoreError],
) -> dict[int, tuple[Reason, ...]]:
    """The reasons of the flagged rows whose decision is the model's (`not_the_models`: decided by
    the fallback rules, or forced by a rule where the model approved)."""
    if explainer is None:
        return {}
    flagged = (np.asarray(decisions, dtype=object) != APPROVE) & ~not_the_models
    flagged[list(invalid)] = False
    rows = np.flatnonzero(flagged)
    if not len(rows):
        return {}
    try:
        explained = explainer.explain(features[rows], scores[rows])
    except ScoreError as exc:
        log.warning("no reasons for %s flagged decisions: %s", len(rows), exc)
        return {}
    return dict(zip(rows.tolist(), explained, strict=True))
