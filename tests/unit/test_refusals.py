"""The exactly-once sink's memory of outputs the broker refused for themselves."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from confluent_kafka import KafkaException

from contracts.offsets import OffsetTracker
from deadletter.router import DeadLetterRouter
from plumbing.errors import RecordRejectedError
from stream.outcomes import OutcomeGroup
from stream.refusals import RefusedOutputs
from stream.sink import Output
from tests.unit.fakes import message

TOO_LARGE = RecordRejectedError("too large", "MSG_SIZE_TOO_LARGE")
ROUTER = DeadLetterRouter("tx.dlq", "g/i")


def decision(key: bytes = b"card") -> Output:
    """The decision of the record at offset 7, as one read of it makes it."""
    tracker = OffsetTracker()
    tracker.track(("tx", 0), 7)
    group = OutcomeGroup(
        tracker, [(("tx", 0), 7)], Counter({("decision", "approve"): 1}), lambda _: None
    )
    source = message(7, value=b"x" * 5_000, key=key)
    return Output(
        kind="decision",
        topic="decisions",
        key=b"card",
        value=b"{}",
        headers=None,
        source=source,
        group=group,
        label="approve",
    )


def test_a_refused_decision_is_dead_lettered_on_every_read_until_a_commit() -> None:
    refused = RefusedOutputs(ROUTER, max_message_bytes=1_000)
    refused.remember(decision(), TOO_LARGE)
    for _read in range(3):  # aborted twice: librdkafka may fail the transaction after an abort
        again = decision()
        sent = refused.instead_of_remembered(again)
        assert sent.kind == "dead_letter" and dict(sent.headers or [])["dlq.reason"] == b"produce"
        assert sent.group is again.group, "counted in this read's outcome group"
        assert again.group.labels == Counter({("dead_letter", "produce"): 1})
        refused.aborted()
    refused.instead_of_remembered(decision())
    refused.committed()
    assert not refused
    assert refused.instead_of_remembered(decision()).kind == "decision", "forgotten once durable"


def test_a_replacement_refused_in_turn_is_shrunk_further_and_then_the_topic_is_at_fault() -> None:
    refused = RefusedOutputs(ROUTER, max_message_bytes=1_000)
    big_key = b"k" * 2_000
    letter = Output.dead_letter(
        ROUTER.dead_letter(message(7, value=b"x" * 5_000, key=big_key), TOO_LARGE),
        message(7, value=b"x" * 5_000, key=big_key),
        decision().group,
    )
    refused.remember(letter, TOO_LARGE)
    first = refused.instead_of_remembered(decision(big_key))
    assert first.value is None and first.key is None, "the key alone was too large"
    refused.aborted()
    refused.remember(first, TOO_LARGE)
    with pytest.raises(KafkaException, match=r"max\.message\.bytes"):
        refused.instead_of_remembered(decision(big_key))


def test_card_states_sent_for_a_refused_record_are_sent_as_they_are() -> None:
    # A batch's card states name its partition's last record as their source: when that
    # record's decision was refused, they are still card states, not its dead letter.
    refused = RefusedOutputs(ROUTER, max_message_bytes=1_000)
    refused.remember(decision(), TOO_LARGE)
    again = decision()
    changelog_output = dataclasses.replace(
        again, kind="changelog", topic="g-card-state-changelog", label="card_state", partition=0
    )
    assert refused.instead_of_remembered(changelog_output) is changelog_output
    assert refused.instead_of_remembered(again).kind == "dead_letter"


def test_refusals_of_partitions_gone_elsewhere_are_forgotten() -> None:
    refused = RefusedOutputs(ROUTER, max_message_bytes=1_000)
    refused.remember(decision(), TOO_LARGE)
    refused.forget({("tx", 1)})
    assert refused
    refused.forget({("tx", 0)})
    assert not refused
