"""A record whose schema lookup fails for a cause that may pass (the registry down) holds its
partition, not the replica: the other partitions are decided meanwhile, nothing is dead-lettered
or committed past it, and once the lookup works the partition goes on from that record, each
record decided once."""

from __future__ import annotations

import threading

from contracts.transaction import Transaction, decode_transaction
from plumbing.errors import RegistryUnavailableError
from tests.support.waiting import wait_until
from tests.unit.replica import TOPIC, Replica, messages, tp


class FlakyRegistry:
    """Decodes JSON, but the lookup of partition 0's records fails while `down` is set."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()
        self.failures = 0

    def __call__(self, value: bytes | None) -> Transaction:
        transaction = decode_transaction(value)
        if self.down.is_set() and transaction.transaction_id in PARTITION_0:
            self.failures += 1
            raise RegistryUnavailableError("schema registry unreachable: ConnectError")
        return transaction


#: The records of partition 0 from offset 20 on: those whose lookup fails.
PARTITION_0 = {decode_transaction(m.value()).transaction_id for m in messages(0, range(20, 40))}


def test_a_registry_that_is_down_holds_the_partition_and_loses_nothing() -> None:
    registry = FlakyRegistry()
    with Replica(decode=registry, retry_backoff_ms=5.0, retry_backoff_max_ms=40.0) as replica:
        replica.consumer.assign(tp(0, 1))
        replica.consumer.feed(messages(0, range(40)) + messages(1, range(60)))
        # Partition 0 is decided up to the first record the registry cannot read; partition 1
        # all the way.
        wait_until(lambda: replica.progress() == {(TOPIC, 0): 20, (TOPIC, 1): 60})
        wait_until(lambda: registry.failures >= 3)  # held, resumed and held again, with backoff
        assert replica.progress()[(TOPIC, 0)] == 20
        wait_until(lambda: replica.metrics.registry.get_sample_value("fraud_held_partitions") == 1)
        assert (TOPIC, 0) in {(t, p) for t, p, _ in replica.consumer.seeks}
        assert not [t for t, _ in replica.outputs() if t == replica.config.dlq_topic]

        registry.down.clear()
        wait_until(lambda: replica.progress() == {(TOPIC, 0): 40, (TOPIC, 1): 60})
        wait_until(lambda: replica.metrics.registry.get_sample_value("fraud_held_partitions") == 0)
    decisions = [t for t, _ in replica.outputs() if t == replica.config.output_topic]
    assert len(decisions) == len(replica.decided()) == 100, "each record decided once"
    assert replica.committed() == {(TOPIC, 0): 40, (TOPIC, 1): 60}
