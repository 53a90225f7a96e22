"""The scoring work of the faust and per-record contenders: the service's own steps (decode
and validate, features, one ONNX Runtime call, thresholds, decision records), without its
Kafka loop, so that only the loop around them differs between contenders."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from scorer.decisions import (
    DEFAULT_DECLINE_THRESHOLD,
    DEFAULT_REVIEW_THRESHOLD,
    Decision,
    Thresholds,
    classify,
    encode_decision,
)
from scorer.features import NUM_FEATURES, TransactionColumns, build_features
from scorer.model import OnnxScorer
from stream.config import SHIPPED_MODEL_PATH, ServiceConfig
from stream.transaction import decode_transaction

#: The service's defaults, so every contender batches (where it batches) the same way.
MAX_BATCH_SIZE: int = ServiceConfig.max_batch_size
MAX_WAIT_S: float = ServiceConfig.max_wait_ms / 1000.0

KeyValue = tuple[bytes, bytes]


class Decider:
    """Turns transaction record values into (key, decision value) pairs, one model call per
    call of `decide`."""

    def __init__(self) -> None:
        self._scorer = OnnxScorer(SHIPPED_MODEL_PATH)
        self._thresholds = Thresholds(DEFAULT_REVIEW_THRESHOLD, DEFAULT_DECLINE_THRESHOLD)
        # The first calls of a session set up its buffers; keep that out of the measurement.
        for size in (1, MAX_BATCH_SIZE):
            self._scorer.score(np.zeros((size, NUM_FEATURES), np.float32))

    def decide(self, values: Sequence[bytes | None]) -> list[KeyValue]:
        """The decision of each value, in order (the backlog holds valid transactions only)."""
        transactions = [decode_transaction(value) for value in values]
        scores = self._scorer.score(
            build_features(TransactionColumns.from_transactions(transactions))
        )
        labels = classify(scores, self._thresholds)
        decided_at = time.time_ns() // 1_000_000
        model_version = self._scorer.model_version
        return [
            (
                t.card_id.encode(),
                encode_decision(
                    Decision(
                        transaction_id=t.transaction_id,
                        card_id=t.card_id,
                        score=score,
                        decision=label,
                        model_version=model_version,
                        degraded=False,
                        event_time=t.event_time,
                        decided_at=decided_at,
                    )
                ),
            )
            for t, score, label in zip(transactions, scores.tolist(), labels, strict=True)
        ]
