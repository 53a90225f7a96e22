"""Authorization on the secured broker: the service principal's ACL set allows exactly what the
service does (consume its inputs in its group, produce its outputs, idempotently or in
transactions) and nothing else."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from ops.kafka.acls import MATCH_ANY, ServiceAcls
from tests.secure.conftest import (
    Acls,
    Credentials,
    SecureBroker,
    SecureTopics,
    only,
    raised_error,
)
from tests.support.records import value_of

GrantServiceAcls = Callable[..., ServiceAcls]


def produce_all(producer: Producer, topic: str, values: list[bytes]) -> list[KafkaError | None]:
    """Produce and wait for every delivery report; return their errors (None: delivered)."""
    reports: list[KafkaError | None] = []
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(30) == 0
    return reports


def consume(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[Message]:
    """Consume until `expected` records arrived; a consumer error fails the test."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(messages) < expected and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.2):
            assert message.error() is None, message.error()
            messages.append(message)
    return messages


def first_consumer_error(consumer: Consumer, timeout_s: float = 30.0) -> KafkaError:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            error = message.error()
            assert error is not None, "a record arrived that the consumer may not read"
            return error
    raise AssertionError(f"no consumer error within {timeout_s}s")


def test_the_service_principal_consumes_its_inputs_in_its_group(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
    group_id: str,
) -> None:
    topics, user = secure_topics_factory(), user_factory()
    grant_service_acls(user, topics)
    admin_producer = Producer(secure_broker.client_config(secure_broker.admin))
    for topic in (topics.input, topics.labels):
        assert produce_all(admin_producer, topic, [b"a", b"b", b"c"]) == [None] * 3

    consumer = Consumer(
        secure_broker.client_config(
            user,
            **{"group.id": group_id, "auto.offset.reset": "earliest", "enable.auto.commit": False},
        )
    )
    try:
        consumer.subscribe([topics.input, topics.labels])
        messages = consume(consumer, 6)
        assert sorted(value_of(m) for m in messages) == [b"a", b"a", b"b", b"b", b"c", b"c"]
        consumer.commit(asynchronous=False)
        wanted = [TopicPartition(t, p) for t in (topics.input, topics.labels) for p in range(3)]
        committed = consumer.committed(wanted, timeout=30)
        assert sum(tp.offset for tp in committed if tp.offset > 0) == 6
    finally:
        consumer.close()


def test_the_service_principal_produces_decisions_and_dead_letters_idempotently(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
) -> None:
    topics, user = secure_topics_factory(), user_factory()
    spec = grant_service_acls(user, topics)
    # The idempotent producer needs no IDEMPOTENT_WRITE on the cluster: WRITE on a topic will do.
    assert not [b for b in spec.bindings() if b.restype == ResourceType.BROKER]
    producer = Producer(
        secure_broker.client_config(user, **{"enable.idempotence": True, "acks": "all"})
    )
    assert produce_all(producer, topics.output, [b"decision"] * 5) == [None] * 5
    assert produce_all(producer, topics.dlq, [b"dead letter"] * 2) == [None] * 2


def test_exactly_once_works_within_the_transactional_id_prefix_only(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
    group_id: str,
) -> None:
    topics, user = secure_topics_factory(), user_factory()
    grant_service_acls(user, topics)
    consumer = Consumer(secure_broker.client_config(user, **{"group.id": group_id}))
    producer = Producer(
        secure_broker.client_config(user, **{"transactional.id": f"{group_id}-instance-a"})
    )
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topics.output, b"decision", partition=0)
        offsets = [TopicPartition(topics.input, 0, 1)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        committed = consumer.committed([TopicPartition(topics.input, 0)], timeout=30)
        assert committed[0].offset == 1
    finally:
        consumer.close()

    outsider = Producer(
        secure_broker.client_config(user, **{"transactional.id": f"other-{uuid.uuid4().hex}"})
    )
    with pytest.raises(KafkaException) as raised:
        outsider.init_transactions(30)
    assert raised_error(raised.value).code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_without_write_on_the_dlq_producing_there_is_refused_and_nothing_else_is(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
    acls: Acls,
) -> None:
    topics, user = secure_topics_factory(), user_factory()
    spec = grant_service_acls(user, topics)
    dlq_write = only(spec.bindings(), topics.dlq, AclOperation.WRITE)
    acls.revoke(dlq_write)

    producer = Producer(
        secure_broker.client_config(user, **{"enable.idempotence": True, "acks": "all"})
    )
    reports = produce_all(producer, topics.dlq, [b"dead letter"])
    assert [e.code() if e else None for e in reports] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # The refusal is about that topic: the same producer still delivers decisions.
    assert produce_all(producer, topics.output, [b"decision"]) == [None]

    acls.grant(dlq_write)  # and it is the ACL, nothing else: granted again, it goes through
    assert produce_all(producer, topics.dlq, [b"dead letter"]) == [None]


def test_a_topic_without_read_acl_cannot_be_consumed(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
    group_id: str,
) -> None:
    topics, others = secure_topics_factory(), secure_topics_factory()
    user = user_factory()
    grant_service_acls(user, topics)
    admin_producer = Producer(secure_broker.client_config(secure_broker.admin))
    assert produce_all(admin_producer, others.input, [b"not yours"]) == [None]

    consumer = Consumer(
        secure_broker.client_config(user, **{"group.id": group_id, "auto.offset.reset": "earliest"})
    )
    try:
        consumer.subscribe([others.input])
        assert first_consumer_error(consumer).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    # Its own output topic is write-only to it as well.
    reader = Consumer(
        secure_broker.client_config(user, **{"group.id": group_id, "auto.offset.reset": "earliest"})
    )
    try:
        reader.subscribe([topics.output])
        assert first_consumer_error(reader).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        reader.close()


def test_another_consumer_group_is_refused(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
) -> None:
    topics, user = secure_topics_factory(), user_factory()
    grant_service_acls(user, topics)
    consumer = Consumer(
        secure_broker.client_config(user, **{"group.id": f"other-{uuid.uuid4().hex[:8]}"})
    )
    try:
        consumer.subscribe([topics.input])
        assert first_consumer_error(consumer).code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()


def test_the_service_principal_may_do_nothing_else(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: GrantServiceAcls,
    acls: Acls,
    group_id: str,
) -> None:
    topics, others = secure_topics_factory(), secure_topics_factory()
    user = user_factory()
    spec = grant_service_acls(user, topics)
    admin = AdminClient(secure_broker.client_config(user))

    # It sees its own topics and no other (DESCRIBE is per topic).
    assert set(admin.list_topics(timeout=30).topics) == set(topics.names)

    # It may create its card-state changelog (under its prefix), no other topic, and delete none.
    changelog = f"{group_id}-card-state-changelog"
    admin.create_topics([NewTopic(changelog, 1, 1)])[changelog].result(timeout=30)
    super_admin = AdminClient(secure_broker.client_config(secure_broker.admin))
    super_admin.delete_topics([changelog])[changelog].result(timeout=30)
    elsewhere = f"other-{group_id}"
    futures = admin.create_topics([NewTopic(elsewhere, 1, 1)])
    for future in futures.values():
        with pytest.raises(KafkaException) as raised:
            future.result(timeout=30)
        assert raised_error(raised.value).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    for future in admin.delete_topics([topics.input]).values():
        with pytest.raises(KafkaException) as raised:
            future.result(timeout=30)
        assert raised_error(raised.value).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # No writing to its inputs, nor to anybody else's topic.
    producer = Producer(secure_broker.client_config(user))
    for topic in (topics.input, others.output):
        reports = produce_all(producer, topic, [b"x"])
        assert [e.code() if e else None for e in reports] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    # No reading ACLs, not even its own: the broker denies DescribeAcls (DESCRIBE on the
    # cluster), which librdkafka reports as an empty list.
    any_acl = AclBindingFilter(
        ResourceType.ANY,
        MATCH_ANY,
        ResourcePatternType.ANY,
        MATCH_ANY,
        MATCH_ANY,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert admin.describe_acls(any_acl).result(timeout=30) == []
    assert len(acls.of(user)) == len(spec.bindings())
    # No changing ACLs: it cannot grant itself more.
    more = AclBinding(
        ResourceType.TOPIC,
        others.input,
        ResourcePatternType.LITERAL,
        f"User:{user.username}",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([more]).values():
        with pytest.raises(KafkaException) as raised:
            future.result(timeout=30)
        assert raised_error(raised.value).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
