"""The shadow contract: one record of the shadow topic (`FRAUD_SHADOW_TOPIC`) per decision made
while a challenger model runs in shadow (`FRAUD_SHADOW_MODEL`, docs/contracts.md). Nothing acts on
it: it says what the challenger would have decided, beside what the served model did."""

from __future__ import annotations

import msgspec


class ShadowDecision(msgspec.Struct, frozen=True, gc=False):
    """One transaction scored by both models (field order is the wire order)."""

    transaction_id: str
    card_id: str
    #: The challenger's version, score, and decision by its own thresholds (rules not applied).
    model_version: str
    score: float
    decision: str
    #: The served model's version, score, and decision by its thresholds (rules not applied).
    served_model_version: str
    served_score: float
    served_decision: str
    #: The decision actually produced to `decisions` (rules applied).
    decided: str
    event_time: int
    decided_at: int


encode_shadow_decision = msgspec.json.Encoder().encode
