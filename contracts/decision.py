"""The decision contract: one record of `decisions` per transaction (docs/contracts.md)."""

from __future__ import annotations

import msgspec

APPROVE, REVIEW, DECLINE = "approve", "review", "decline"


class Reason(msgspec.Struct, frozen=True, gc=False):
    """Why the model flagged a transaction: one feature and how much it added to the score."""

    #: A name from the feature catalogue (docs/features.md).
    feature: str
    #: The feature's value in words, e.g. "7d average spend 310.00, 9.0x the card's 30-day
    #: average".
    label: str
    #: The score with the feature's value minus the score with the reference row's value.
    contribution: float


class Decision(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """One decision as produced to the `decisions` topic (field order is the wire order; the
    empty `reasons` and `rules` of most approvals are left out)."""

    transaction_id: str
    card_id: str
    #: Fraud probability in [0, 1].
    score: float
    decision: str
    model_version: str
    #: True when rules decided instead of the model (late, or the model unavailable).
    degraded: bool
    event_time: int
    #: Epoch ms when this decision was made (a re-decision after a restart has its own).
    decided_at: int
    #: The model's top reasons, most important first, on every review and decline it scored.
    reasons: tuple[Reason, ...] = ()
    #: The rules that hit (FRAUD_RULES, docs/rules.md), in precedence order.
    rules: tuple[str, ...] = ()


encode_decision = msgspec.json.Encoder().encode
