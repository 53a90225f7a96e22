"""Resuming partitions wakes the broker threads that fetch them (`stream/resume.py`): one
watermark query per leader, and a failed wake-up is not an error."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.resume import resume
from tests.unit.fakes import OneBrokerCluster


class TwoBrokers(OneBrokerCluster):
    """Partitions 0-2 of a topic led by broker 1, 3-5 by broker 2, partition 6 leaderless."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed: list[tuple[str, int]] = []

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed.extend((p.topic, p.partition) for p in partitions)

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        leaders = {p: 1 if p < 3 else 2 for p in range(6)} | {6: -1}
        partitions = {p: SimpleNamespace(leader=leader) for p, leader in leaders.items()}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions, error=None)})


def test_a_resume_wakes_each_leader_of_the_resumed_partitions_once() -> None:
    consumer = TwoBrokers()
    partitions = [TopicPartition("tx", p) for p in (1, 2, 4, 5, 6)]
    resume(consumer, partitions)  # type: ignore[arg-type]
    assert consumer.resumed == [("tx", p) for p in (1, 2, 4, 5, 6)]
    assert consumer.wakeups == [("tx", 1), ("tx", 4)]


def test_nothing_to_resume_asks_nothing() -> None:
    consumer = TwoBrokers()
    resume(consumer, [])  # type: ignore[arg-type]
    assert consumer.resumed == [] and consumer.wakeups == []


def test_a_failed_wake_up_still_resumes() -> None:
    consumer = TwoBrokers()

    def unreachable(topic: str, timeout: float) -> SimpleNamespace:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    consumer.list_topics = unreachable  # type: ignore[method-assign]
    resume(consumer, [TopicPartition("tx", 0)])  # type: ignore[arg-type]
    assert consumer.resumed == [("tx", 0)] and consumer.wakeups == []
