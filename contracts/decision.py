"""The decision contract: one record of `decisions` per transaction (docs/contracts.md)."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
import numpy.typing as npt

APPROVE, REVIEW, DECLINE = "approve", "review", "decline"


class Reason(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Why the model flagged a transaction: one feature and how much it added to the score.

    The feature's value in words is `text`. Release 0.1.0 wrote it as `label` only; this
    release writes both, with the same value, and `label` goes in the release after next. A
    reason made or decoded with one of them gets the other too, so a 0.1.0 decision reads the
    same as a new one. Keyword-only: 0.1.0's positional order (feature, label, contribution)
    cannot be mistaken for this one."""

    #: A name from the feature catalogue (docs/features.md).
    feature: str
    #: The feature's value in words, e.g. "7d average spend 310.00, 9.0x the card's 30-day
    #: average".
    text: str = ""
    #: Deprecated: the same as `text`, written for the consumers of release 0.1.0's decisions
    #: for one more release; removed in the release after next.
    label: str = ""
    #: The score with the feature's value minus the score with the reference row's value.
    contribution: float

    def __post_init__(self) -> None:
        if not self.text:
            msgspec.structs.force_setattr(self, "text", self.label)
        elif not self.label:
            msgspec.structs.force_setattr(self, "label", self.text)


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
    #: With FRAUD_DECISION_FEATURES=on: the feature row it was scored with (`encode_features`).
    features: str = ""


encode_decision = msgspec.json.Encoder().encode


def encode_features(row: npt.NDArray[np.float32]) -> str:
    """A feature row as a decision carries it: its float32 values, little-endian, in the
    feature catalogue's order (docs/features.md), base64 (4 bytes a value, a third more in
    text)."""
    return base64.b64encode(np.asarray(row, "<f4").tobytes()).decode("ascii")


def decode_features(text: str) -> npt.NDArray[np.float32]:
    """The feature row of a decision's `features` (empty when it carries none).

    Raises ValueError when the text is not base64 of whole float32 values."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError(f"features hold {len(raw)} bytes, not whole float32 values")
    return np.frombuffer(raw, "<f4").astype(np.float32)
