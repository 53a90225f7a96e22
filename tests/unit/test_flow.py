"""Backpressure state: pause at the high-water mark, resume at the low one, across rebalances."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from stream.flow import REBALANCE_WAKE_DELAY_S, FlowControl
from stream.metrics import ServiceMetrics
from tests.unit.fakes import OneBrokerCluster

METRICS = ServiceMetrics(CollectorRegistry())


class RecordingConsumer(OneBrokerCluster):
    """Records pause/resume calls; FlowControl calls nothing else on a consumer but what a
    resume's wake-up asks (`OneBrokerCluster`)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[tuple[str, int]]]] = []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("pause", [(p.topic, p.partition) for p in partitions]))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("resume", [(p.topic, p.partition) for p in partitions]))


def tps(*numbers: int) -> list[TopicPartition]:
    return [TopicPartition("tx", n) for n in numbers]


def test_pauses_at_high_water_and_resumes_at_low_water() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0, 1))
    consumer.calls.clear()
    flow.update(99, 0, None)
    assert not flow.paused and consumer.calls == []
    flow.update(100, 0, None)
    assert flow.paused and consumer.calls == [("pause", [("tx", 0), ("tx", 1)])]
    flow.update(51, 0, None)
    assert flow.paused, "hysteresis: no resume above the low-water mark"
    flow.update(50, 0, None)
    assert not flow.paused and consumer.calls[-1] == ("resume", [("tx", 0), ("tx", 1)])


def test_a_blocking_condition_pauses_until_it_clears() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    flow.update(0, 0, "deliveries stalled")
    assert flow.paused
    flow.update(0, 0, "deliveries stalled")
    assert flow.paused
    flow.update(0, 0, None)
    assert not flow.paused


def test_new_partitions_get_the_current_state_explicitly() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 10, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    assert consumer.calls[-1] == ("resume", [("tx", 0)]), "resumed explicitly, not left as found"
    flow.update(10, 0, None)
    flow.on_assign(tps(2))
    assert consumer.calls[-1] == ("pause", [("tx", 2)])
    flow.on_revoke(tps(0))
    flow.update(0, 0, None)
    assert consumer.calls[-1] == ("resume", [("tx", 2)]), "revoked partitions are forgotten"


def test_bytes_in_flight_pause_like_records_and_both_must_drain_to_resume() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1_000, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    flow.update(3, 999, None)
    assert not flow.paused
    flow.update(3, 1_000, None)
    assert flow.paused, "three records of 1 kB reach the byte bound long before the record bound"
    flow.update(3, 501, None)
    assert flow.paused
    flow.update(60, 400, None)
    assert flow.paused, "records above their low-water mark keep it paused"
    flow.update(50, 500, None)
    assert not flow.paused


def test_a_block_that_clears_resumes_at_once_below_the_bounds() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    flow.update(80, 0, "scoring thread busy")
    assert flow.paused
    flow.update(80, 0, None)
    assert not flow.paused, "paused for a block, not for the bound: no need to drain to half"


def test_a_withheld_partition_stays_paused_until_released_whatever_the_bounds() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    flow.on_assign(tps(1), withheld=True)
    assert consumer.calls[-1] == ("pause", [("tx", 1)])
    flow.update(100, 0, None)
    flow.update(0, 0, None)
    assert consumer.calls[-1] == ("resume", [("tx", 0)]), "backpressure's end leaves it paused"
    flow.release([("tx", 1)])
    assert consumer.calls[-1] == ("resume", [("tx", 1)])
    flow.update(100, 0, None)
    assert consumer.calls[-1] == ("pause", [("tx", 0), ("tx", 1)]), "then it is like the others"


def test_a_partition_released_under_backpressure_waits_for_its_end() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(0))
    flow.on_assign(tps(1), withheld=True)
    flow.update(100, 0, None)
    consumer.calls.clear()
    flow.release([("tx", 1)])
    assert consumer.calls == [], "no fetching while the replica is paused"
    flow.update(0, 0, None)
    assert consumer.calls == [("resume", [("tx", 0), ("tx", 1)])]


def test_a_revoked_withheld_partition_is_forgotten() -> None:
    consumer = RecordingConsumer()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS)  # type: ignore[arg-type]
    flow.on_assign(tps(1), withheld=True)
    flow.on_revoke(tps(1))
    flow.on_assign(tps(1))
    assert consumer.calls[-1] == ("resume", [("tx", 1)]), "assigned again, not withheld"
    consumer.calls.clear()
    flow.release([("tx", 1)])
    assert consumer.calls == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_partitions_fetching_are_woken_once_shortly_after_each_rebalance() -> None:
    consumer, clock = RecordingConsumer(), Clock()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS, clock)  # type: ignore[arg-type]
    flow.on_assign(tps(3, 4))
    flow.on_assign(tps(5), withheld=True)
    clock.now = REBALANCE_WAKE_DELAY_S / 2
    flow.update(0, 0, None)
    assert consumer.wakeups == [], "librdkafka has not resumed the partitions kept yet"
    clock.now = REBALANCE_WAKE_DELAY_S
    flow.update(0, 0, None)
    assert consumer.wakeups == [("tx", 3)], "one query to the leader of 3 and 4, not of 5"
    clock.now = 10.0
    flow.update(0, 0, None)
    assert consumer.wakeups == [("tx", 3)], "once per rebalance"
    flow.on_revoke(tps(3))
    flow.on_assign([])  # a cooperative rebalance's empty assignment after its revoke
    clock.now += REBALANCE_WAKE_DELAY_S
    flow.update(0, 0, None)
    assert consumer.wakeups == [("tx", 3), ("tx", 4)], "the partition kept is woken"


def test_no_wake_after_a_rebalance_while_paused_the_resume_wakes_instead() -> None:
    consumer, clock = RecordingConsumer(), Clock()
    flow = FlowControl(consumer, 100, 1 << 30, METRICS, clock)  # type: ignore[arg-type]
    flow.on_assign(tps(0, 1))
    flow.update(100, 0, None)
    clock.now = 1.0
    flow.update(100, 0, None)
    assert flow.paused and consumer.wakeups == []
    flow.update(0, 0, None)
    assert not flow.paused and consumer.wakeups == [("tx", 0)]
