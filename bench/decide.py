"""The scoring work of the faust, Quix Streams, floor and per-record contenders: the service's own
decision path (`scorer.decide.decide_batch`) and decision records, without its Kafka loop, so
that only the loop around them differs between contenders."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from contracts.decision import Decision, encode_decision
from contracts.transaction import Transaction, decode_transaction
from scorer.columns import TransactionColumns
from scorer.decide import decide_batch
from scorer.features import NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.model_package import load_model_package
from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings

#: The service's defaults, so every contender batches (where it batches) the same way.
DEFAULTS = ScorerSettings()
MAX_BATCH_SIZE: int = DEFAULTS.max_batch_size
MAX_WAIT_S: float = DEFAULTS.max_wait_ms / 1000.0

KeyValue = tuple[bytes, bytes]


class Decider:
    """Turns transaction record values into (key, decision value) pairs, one model call per
    call of `decide`."""

    def __init__(self) -> None:
        package = load_model_package(SHIPPED_MODEL_PATH)
        self._scorer = OnnxScorer(package)
        self._policy = DEFAULTS.decision_policy(package.thresholds)
        # The first calls of a session set up its buffers; keep that out of the measurement.
        for size in (1, MAX_BATCH_SIZE):
            self._scorer.score(np.zeros((size, NUM_FEATURES), np.float32))

    def decide(self, values: Sequence[bytes | None]) -> list[KeyValue]:
        """The decision of each value, in order (the backlog holds valid transactions only),
        with neutral card history."""
        return self.decide_transactions([decode_transaction(value) for value in values])

    def decide_transactions(
        self,
        transactions: Sequence[Transaction],
        *,
        history: npt.NDArray[np.float32] | None = None,
        columns: TransactionColumns | None = None,
    ) -> list[KeyValue]:
        """The decision of each decoded transaction, in order; `history`: their card history
        feature rows (None: neutral), `columns`: their columns, where the caller has them."""
        now_ms = time.time_ns() // 1_000_000
        verdicts = decide_batch(
            transactions, self._scorer, self._policy, now_ms, history=history, columns=columns
        )
        decided_at = time.time_ns() // 1_000_000
        model_version = self._scorer.model_version
        degraded = verdicts.degraded.tolist()
        return [
            (
                t.card_id.encode(),
                encode_decision(
                    Decision(
                        transaction_id=t.transaction_id,
                        card_id=t.card_id,
                        score=score,
                        decision=decision,
                        model_version=model_version,
                        degraded=degraded[i],
                        event_time=t.event_time,
                        decided_at=decided_at,
                    )
                ),
            )
            for i, (t, score, decision) in enumerate(
                zip(transactions, verdicts.scores.tolist(), verdicts.decisions, strict=True)
            )
        ]
