"""The service principal's ACL set (ops/kafka/acls.py): exactly what the service needs."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from ops.kafka.acls import ServiceAcls, main, name_of

TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
CREATE = AclOperation.CREATE


def test_the_default_set_is_the_services_resources_and_operations() -> None:
    bindings = ServiceAcls().bindings()
    assert sorted(
        (name_of(b.restype), b.name, name_of(b.resource_pattern_type), name_of(b.operation))
        for b in bindings
    ) == sorted(
        (kind.name, name, pattern.name, operation.name)
        for kind, name, pattern, operation in [
            (TOPIC, "transactions", LITERAL, READ),
            (TOPIC, "transactions", LITERAL, DESCRIBE),
            (TOPIC, "labels", LITERAL, READ),
            (TOPIC, "labels", LITERAL, DESCRIBE),
            (TOPIC, "terminal-risk", LITERAL, READ),
            (TOPIC, "terminal-risk", LITERAL, DESCRIBE),
            (TOPIC, "terminal-risk-progress", LITERAL, READ),
            (TOPIC, "terminal-risk-progress", LITERAL, DESCRIBE),
            (TOPIC, "card-frauds", LITERAL, READ),
            (TOPIC, "card-frauds", LITERAL, DESCRIBE),
            (TOPIC, "decisions", LITERAL, WRITE),
            (TOPIC, "decisions", LITERAL, DESCRIBE),
            (TOPIC, "transactions.dlq", LITERAL, WRITE),
            (TOPIC, "transactions.dlq", LITERAL, DESCRIBE),
            (TOPIC, "fraud-scorer-", PREFIXED, READ),
            (TOPIC, "fraud-scorer-", PREFIXED, WRITE),
            (TOPIC, "fraud-scorer-", PREFIXED, DESCRIBE),
            (TOPIC, "fraud-scorer-", PREFIXED, CREATE),
            (GROUP, "fraud-scorer", LITERAL, READ),
            (TXN, "fraud-scorer", PREFIXED, WRITE),
            (TXN, "fraud-scorer", PREFIXED, DESCRIBE),
        ]
    )
    assert {(b.principal, b.host, b.permission_type) for b in bindings} == {
        ("User:fraud-scorer", "*", AclPermissionType.ALLOW)
    }


def test_nothing_on_the_cluster_no_delete_or_alter_and_create_only_for_changelogs() -> None:
    bindings = ServiceAcls().bindings()
    assert {b.restype for b in bindings} == {TOPIC, GROUP, TXN}
    assert {b.operation for b in bindings} == {READ, WRITE, DESCRIBE, CREATE}
    assert {(b.name, b.resource_pattern_type) for b in bindings if b.operation == CREATE} == {
        ("fraud-scorer-", PREFIXED)
    }


def test_resources_follow_the_settings() -> None:
    spec = ServiceAcls(
        principal="svc",
        input_topics=("in",),
        features_topics=("risk",),
        output_topics=("out", "out.dlq"),
        group="g1",
        transactional_id_prefix="tx1",
    )
    names = {(b.restype, b.name, b.resource_pattern_type) for b in spec.bindings()}
    assert names == {
        (TOPIC, "in", LITERAL),
        (TOPIC, "risk", LITERAL),
        (TOPIC, "out", LITERAL),
        (TOPIC, "out.dlq", LITERAL),
        (TOPIC, "g1-", PREFIXED),
        (GROUP, "g1", LITERAL),
        (TXN, "tx1", PREFIXED),
    }
    assert {b.principal for b in spec.bindings()} == {"User:svc"}
    custom = ServiceAcls(group="g1", changelog_prefix="state.g1.")
    assert (TOPIC, "state.g1.", PREFIXED) in {
        (b.restype, b.name, b.resource_pattern_type) for b in custom.bindings()
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        (b"\xff\xfe not utf-8", "cannot read"),
        (b"no equals sign\n", "line 1"),
    ],
)
def test_a_config_that_cannot_be_read_is_refused_in_one_line_before_any_broker_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, problem: str
) -> None:
    config = tmp_path / "admin.properties"
    if content is not None:
        config.write_bytes(content)
    # No broker listens on port 1: the tool must stop at its configuration, not try one.
    code = main(["--config", str(config), "--bootstrap-servers", "127.0.0.1:1", "show"])
    error = capsys.readouterr().err
    assert code == 2 and problem in error and len(error.strip().splitlines()) == 1
