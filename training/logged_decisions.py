"""The decisions topic and the labels topic read back for training (`fraud-train from-topics`):
each decision made by a cut-off with the feature row it was scored with, and each labelled
transaction's outcome as known at the cut-off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from contracts.decision import decode_features
from contracts.label import decode_label
from plumbing.errors import ConfigurationError
from scorer.features import NUM_FEATURES

READ_BATCH = 10_000
READ_TIMEOUT_S = 1.0
#: A read that gets nothing this long, with partitions still short of their end, fails.
STALL_TIMEOUT_S = 30.0


class _LoggedDecision(msgspec.Struct, frozen=True):
    """The fields of a decision this reads (the rest are skipped by the decoder)."""

    transaction_id: str
    decision: str
    score: float
    model_version: str
    event_time: int
    decided_at: int
    features: str = ""


class Decisions(NamedTuple):
    """The decisions kept, one row each, in the order read."""

    transaction_ids: list[str]
    features: npt.NDArray[np.float32]
    event_time: npt.NDArray[np.int64]
    #: The served model's score, whether it approved, and its version.
    score: npt.NDArray[np.float32]
    approved: npt.NDArray[np.bool_]
    model_version: list[str]
    #: Decisions read but not kept: made after the cut-off, without features, repeated, or not
    #: a JSON decision.
    skipped: dict[str, int]


def read_decisions(bootstrap: str, topic: str, until_ms: int) -> Decisions:
    """The decisions on `topic` made by `until_ms` that carry their features."""
    decoder = msgspec.json.Decoder(_LoggedDecision)
    ids: list[str] = []
    seen: set[str] = set()
    chunks: list[npt.NDArray[np.float32]] = []
    chunk = np.empty((READ_BATCH, NUM_FEATURES), np.float32)
    filled = 0
    event_time: list[int] = []
    score: list[float] = []
    approved: list[bool] = []
    version: list[str] = []
    skipped = {"after_cut_off": 0, "without_features": 0, "repeated": 0, "unreadable": 0}
    for message in _read_to_end(bootstrap, topic):
        try:
            decision = decoder.decode(message.value() or b"")
            row = decode_features(decision.features) if decision.features else None
        except (msgspec.DecodeError, ValueError):
            skipped["unreadable"] += 1
            continue
        if decision.decided_at > until_ms:
            skipped["after_cut_off"] += 1
            continue
        if row is None or len(row) != NUM_FEATURES:
            skipped["without_features"] += 1
            continue
        if decision.transaction_id in seen:
            skipped["repeated"] += 1
            continue
        seen.add(decision.transaction_id)
        ids.append(decision.transaction_id)
        chunk[filled] = row
        filled += 1
        if filled == READ_BATCH:
            chunks.append(chunk)
            chunk, filled = np.empty((READ_BATCH, NUM_FEATURES), np.float32), 0
        event_time.append(decision.event_time)
        score.append(decision.score)
        approved.append(decision.decision == "approve")
        version.append(decision.model_version)
    chunks.append(chunk[:filled])
    return Decisions(
        ids,
        np.concatenate(chunks),
        np.asarray(event_time, np.int64),
        np.asarray(score, np.float32),
        np.asarray(approved, np.bool_),
        version,
        skipped,
    )


def read_labels(bootstrap: str, topic: str, until_ms: int) -> dict[str, bool]:
    """Each labelled transaction's outcome as known at `until_ms`: its last label reported by
    then."""
    latest: dict[str, tuple[int, bool]] = {}
    for message in _read_to_end(bootstrap, topic):
        try:
            label = decode_label(message.value())
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # the features worker dead-letters these; they say nothing here
        if label.reported_at > until_ms:
            continue
        known = latest.get(label.transaction_id)
        if known is None or label.reported_at >= known[0]:
            latest[label.transaction_id] = (label.reported_at, label.fraud)
    return {transaction: fraud for transaction, (_, fraud) in latest.items()}


def _read_to_end(bootstrap: str, topic: str) -> Iterator[Message]:
    """Every record of `topic` up to its end as it is now, partition by partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fraud-train-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise ConfigurationError(f"topic {topic!r} is not on the broker at {bootstrap}")
        ends = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 30)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        last_progress = time.monotonic()
        while ends:
            messages = consumer.consume(READ_BATCH, READ_TIMEOUT_S)
            if not messages and time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise ConfigurationError(
                    f"reading {topic!r} stalled {STALL_TIMEOUT_S:g} s short of its end "
                    f"(partitions {sorted(ends)})"
                )
            for message in messages:
                if message.error() is not None:
                    raise ConfigurationError(f"reading {topic!r}: {message.error()}")
                last_progress = time.monotonic()
                partition, offset = message.partition(), message.offset()
                if partition not in ends or offset is None or offset >= ends[partition]:
                    continue
                yield message
                if offset + 1 >= ends[partition]:
                    del ends[partition]
    except KafkaException as exc:
        raise ConfigurationError(f"reading {topic!r}: {exc}") from exc
    finally:
        consumer.close()
