"""The decision contract: one record of `decisions` per transaction (docs/contracts.md)."""

from __future__ import annotations

import msgspec

APPROVE, REVIEW, DECLINE = "approve", "review", "decline"


class Decision(msgspec.Struct, frozen=True, gc=False):
    """One decision as produced to the `decisions` topic (field order is the wire order)."""

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


encode_decision = msgspec.json.Encoder().encode
