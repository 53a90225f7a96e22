"""The review console through a broker restart (kill -9, then up again on the same state), on
the fault tier's broker (127.0.0.1:9292, tests/faults/conftest.py): the console stays up, reads
the decisions made after the restart, and a verdict given then reaches the labels topic."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from faults.broker import Broker
from tests.integration.review_console import ANALYST, ReviewConsole
from tests.integration.test_review_console import decision, transaction
from tests.support.topics import create_topics


def send(bootstrap: str, topic: str, value: dict[str, object]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, json.dumps(value).encode(), b"card")
    assert producer.flush(60) == 0


@pytest.mark.timeout(300)
def test_the_console_survives_a_broker_restart(broker: Broker, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:10]
    names = (f"decisions-{suffix}", f"tx-{suffix}", f"labels-{suffix}")
    create_topics(AdminClient({"bootstrap.servers": broker.bootstrap}),
                  [NewTopic(name, 1, 1) for name in names])  # fmt: skip
    console = ReviewConsole(*names, tmp_path / "review.db", tmp_path / "review.log",
                            bootstrap=broker.bootstrap)  # fmt: skip
    assert console.add_user(*ANALYST, "analyst").returncode == 0
    console.start()
    try:
        send(broker.bootstrap, console.transactions, transaction("t-1", "card", 30.0))
        send(broker.bootstrap, console.decisions, decision("t-1", "card", 0.4))
        assert len(console.wait_for_cases(1)) == 1

        broker.kill()
        time.sleep(2)
        assert console.get("/healthz").status == 200  # up, while the broker is away
        broker.up()

        send(broker.bootstrap, console.transactions, transaction("t-2", "card", 60.0))
        send(broker.bootstrap, console.decisions, decision("t-2", "card", 0.4))
        # Both cases, each joined with its transaction (the two topics are read side by side,
        # so t-2's decision may come before its transaction: its case then waits for it).
        deadline = time.monotonic() + 90
        while True:
            cases = console.cases()
            if len(cases) == 2 and all(c["amount"] is not None for c in cases):
                break
            assert time.monotonic() < deadline, (cases, console.log()[-4000:])
            time.sleep(0.5)
        assert [c["transaction_id"] for c in cases] == ["t-2", "t-1"]
        deadline = time.monotonic() + 60
        while (answer := console.verdict("t-1", True)).status == 503:
            assert time.monotonic() < deadline, answer.body
            time.sleep(1)
        assert answer.status == 200, answer.body
        reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": suffix,
                           "auto.offset.reset": "earliest"})  # fmt: skip
        reader.subscribe([console.labels])
        found: list[Message] = []
        deadline = time.monotonic() + 60
        while not found and time.monotonic() < deadline:
            found = [m for m in reader.consume(10, timeout=1) if m.error() is None]
        reader.close()
        assert [json.loads(m.value() or b"")["reviewer"] for m in found] == [ANALYST[0]]
        assert console.process is not None and console.process.poll() is None
    finally:
        console.kill()
