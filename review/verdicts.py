"""A verdict becomes a label: one record of the labels topic under the label contract
(`contracts/label.py`), with the reviewer's name, acknowledged by the broker before the verdict
is recorded. A label the broker did not take is an error for the analyst to retry: the case
stays as it was, so nothing is recorded that the features worker never sees.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
from confluent_kafka import KafkaError, Message, Producer

from contracts.label import Label, decode_label
from plumbing.errors import FraudScorerError, ValidationError
from review.cases import CaseStore, User
from review.metrics import ReviewMetrics

#: How long a verdict waits for the broker's acknowledgement of its label.
DELIVERY_TIMEOUT_S = 10.0

_encode = msgspec.json.Encoder().encode


class LabelNotDelivered(FraudScorerError):
    """The broker did not acknowledge a verdict's label; the verdict was not recorded."""


def label_of(case: dict[str, Any], fraud: bool, reviewer: str, reported_at: int) -> Label:
    """The label a verdict on `case` produces (its transaction's card, terminal and time)."""
    return Label(
        transaction_id=case["transaction_id"],
        card_id=case["card_id"],
        fraud=fraud,
        event_time=case["event_time"],
        # A verdict cannot precede its transaction, whatever the clocks say.
        reported_at=max(reported_at, case["event_time"]),
        terminal_id=case["terminal_id"],
        reviewer=reviewer,
    )


class LabelPublisher:
    """Produces labels, one at a time, each acknowledged (acks=all, idempotent)."""

    def __init__(self, settings: dict[str, Any], topic: str) -> None:
        self._producer = Producer(
            {
                **settings,
                "enable.idempotence": True,
                "linger.ms": 0,
                "message.timeout.ms": int(DELIVERY_TIMEOUT_S * 1000),
            }
        )
        self._topic = topic
        self._lock = threading.Lock()

    def publish(self, label: Label) -> None:
        """Produce `label` keyed by its card and wait for the acknowledgement.

        Raises LabelNotDelivered when the broker refused it or did not answer in time."""
        value = _encode(label)
        try:  # what the features worker will accept, checked before anything is sent
            decode_label(value)
        except ValidationError as exc:
            raise LabelNotDelivered(f"the label breaks the label contract: {exc}") from exc
        outcome: list[KafkaError | None] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            outcome.append(error)

        with self._lock:
            self._producer.produce(
                self._topic, value, label.card_id.encode(), on_delivery=delivered
            )
            deadline = time.monotonic() + DELIVERY_TIMEOUT_S + 1
            while not outcome and time.monotonic() < deadline:
                self._producer.poll(0.1)
        if not outcome:
            raise LabelNotDelivered(
                f"the broker did not acknowledge the label within {DELIVERY_TIMEOUT_S:.0f} s; "
                "the verdict was not recorded: send it again"
            )
        if outcome[0] is not None:
            raise LabelNotDelivered(
                f"the broker refused the label ({outcome[0].str()}); the verdict was not "
                "recorded: send it again"
            )

    def close(self) -> None:
        self._producer.flush(DELIVERY_TIMEOUT_S)


class CaseNotFound(FraudScorerError):
    """No case has this transaction id."""


class ReversalRefused(FraudScorerError):
    """Only a lead may change a verdict already given."""


class VerdictDesk:
    """The rules of a verdict: an open case takes anyone's; the same verdict again changes
    nothing; a different verdict on a closed case is a reversal, which only a lead may make.
    Each recorded verdict is produced as a label first, then written with its audit line, while
    the case is held against any other verdict (`CaseStore.deciding`): two analysts on one case
    never both publish."""

    def __init__(self, store: CaseStore, publisher: LabelPublisher, metrics: ReviewMetrics):
        self._store = store
        self._publisher = publisher
        self._metrics = metrics

    def record(self, transaction_id: str, fraud: bool, note: str, user: User) -> str:
        """Record a verdict; return what happened: "closed", "reversed" or "unchanged".

        Raises CaseNotFound, ReversalRefused, or LabelNotDelivered (nothing recorded)."""
        with self._store.deciding(transaction_id) as case:
            if case is None:
                raise CaseNotFound(f"no case for transaction {transaction_id!r}")
            if case["status"] == "closed":
                if case["fraud"] == fraud:
                    return "unchanged"
                if user.role != "lead":
                    raise ReversalRefused(
                        f"the case was closed as {_verdict(case['fraud'])} by "
                        f"{case['reviewer']}; only a lead may reverse a verdict"
                    )
                action = "reversed"
                before = {k: case[k] for k in ("fraud", "note", "reviewer")}
            else:
                action, before = "closed", None
            self._publisher.publish(label_of(case, fraud, user.name, int(time.time() * 1000)))
            self._store.close_case(transaction_id, fraud, note, user, action, before)
        self._metrics.verdicts.labels(_verdict(fraud), action).inc()
        return action


def _verdict(fraud: bool) -> str:
    return "fraud" if fraud else "legitimate"
