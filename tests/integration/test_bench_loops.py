"""The benchmark's `floor` contender (bench/loops.py) against the broker: it must do the work it
stands for, one decision and one card-state-sized record per transaction, or the floor it sets
under the service's throughput would be too low."""

from __future__ import annotations

import threading
import uuid

import msgspec
from confluent_kafka.admin import AdminClient, NewTopic

from bench.loops import MODES, STATE_TOPIC_SUFFIX, run
from scorer.card_history_record import STATE_BYTES
from simulator.transactions import TransactionSimulator
from stream.startup.config import ScorerSettings
from tests.integration.conftest import BOOTSTRAP, Topics, encode, produce, read_topic
from tests.support.records import value_of
from tests.support.topics import create_topics, delete_topics

TRANSACTIONS = 600


def test_the_floor_decides_every_transaction_and_writes_one_state_record_for_each(
    topics_factory, admin: AdminClient
) -> None:
    topics: Topics = topics_factory(partitions=3)
    state_topic = topics.output + STATE_TOPIC_SUFFIX
    create_topics(admin, [NewTopic(state_topic, 3, 1)])
    sent = TransactionSimulator(5).generate(TRANSACTIONS).records
    produce(topics.input, [(str(r["card_id"]).encode(), encode(r)) for r in sent])
    config = ScorerSettings(
        bootstrap_servers=BOOTSTRAP,
        input_topic=topics.input,
        output_topic=topics.output,
        group_id=f"floor-{uuid.uuid4().hex[:8]}",
        metrics_port=0,
    )
    stop = threading.Event()
    failed: list[int] = []
    loop = threading.Thread(target=lambda: failed.append(run(config, MODES["floor"], stop)))
    loop.start()
    try:
        decisions = [msgspec.json.decode(value_of(m)) for m in read_topic(topics.output, len(sent))]
        states = read_topic(state_topic, len(sent))
    finally:
        stop.set()
        loop.join(60)
        delete_topics(admin, [state_topic])
    assert sorted(d["transaction_id"] for d in decisions) == sorted(
        str(r["transaction_id"]) for r in sent
    )
    assert {d["decision"] for d in decisions} <= {"approve", "review", "decline"}
    assert failed == [0]  # every output reported stored
    assert len(states) == len(sent)
    assert all(len(value_of(m)) == STATE_BYTES for m in states)
    assert sorted(m.key() or b"" for m in states) == sorted(
        str(r["card_id"]).encode() for r in sent
    )
