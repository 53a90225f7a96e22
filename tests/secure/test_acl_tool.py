"""`python -m ops.kafka.acls`: grant, show and revoke the service principal's ACLs as the admin."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

from contracts.worker_progress import progress_topic_name
from tests.secure.conftest import (
    REPO,
    Acls,
    Credentials,
    SecureBroker,
    SecureTopics,
    service_acls,
)


def acl_tool(broker: SecureBroker, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.kafka.acls",
            "--config",
            str(config),
            "--bootstrap-servers",
            broker.bootstrap,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_grant_creates_the_service_topics_and_exactly_the_acls_and_revoke_removes_them(
    secure_broker: SecureBroker,
    secure_admin: AdminClient,
    user_factory: Callable[..., Credentials],
    acls: Acls,
    tmp_path: Path,
) -> None:
    user = user_factory()
    suffix = uuid.uuid4().hex[:10]
    topics = SecureTopics(
        f"tx-{suffix}", f"labels-{suffix}", f"decisions-{suffix}", f"tx-{suffix}.dlq", 2
    )
    group = f"fraud-scorer-{suffix}"
    admin_config = secure_broker.write_properties(
        tmp_path / "admin.properties", secure_broker.admin
    )
    resources = [
        "--principal",
        user.username,
        "--input-topic",
        topics.input,
        "--input-topic",
        topics.labels,
        *(arg for name in topics.control for arg in ("--features-topic", name)),
        *("--features-topic", progress_topic_name(topics.control[0])),
        "--output-topic",
        topics.output,
        "--output-topic",
        topics.dlq,
        "--group",
        group,
        "--transactional-id-prefix",
        group,
    ]
    try:
        granted = acl_tool(
            secure_broker, admin_config, *resources, "grant", "--create-topics", "--partitions", "2"
        )
        assert granted.returncode == 0, granted.stderr
        assert set(acls.of(user)) == set(service_acls(user, topics, group).bindings())
        assert f"granted 21 ACLs to User:{user.username}" in granted.stdout
        metadata = secure_admin.list_topics(timeout=30)
        assert {t: len(metadata.topics[t].partitions) for t in topics.names} == dict.fromkeys(
            topics.names, 2
        )
        # The features worker's compacted topics are its own to create (fraud-features
        # create-topics): created here they would be neither compacted nor of its partitions.
        features = {*topics.control, progress_topic_name(topics.control[0])}
        assert not features & set(metadata.topics), "the features topics are left alone"

        shown = acl_tool(secure_broker, admin_config, *resources, "show")
        assert shown.returncode == 0, shown.stderr
        assert len(shown.stdout.splitlines()) == 21

        revoked = acl_tool(secure_broker, admin_config, *resources, "revoke")
        assert revoked.returncode == 0, revoked.stderr
        assert acls.of(user) == []
        assert f"no ACLs for User:{user.username}" in revoked.stdout
    finally:
        created = set(secure_admin.list_topics(timeout=30).topics)
        progress = progress_topic_name(topics.control[0])
        names = [t for t in (*topics.names, *topics.control, progress) if t in created]
        for future in secure_admin.delete_topics(names).values():
            future.result(timeout=30)


def test_a_principal_that_may_not_manage_acls_gets_one_clear_line(
    secure_broker: SecureBroker, user_factory: Callable[..., Credentials], tmp_path: Path
) -> None:
    user = user_factory()
    config = secure_broker.write_properties(tmp_path / "user.properties", user)
    result = acl_tool(secure_broker, config, "--principal", user.username, "grant")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "CLUSTER_AUTHORIZATION_FAILED" in result.stderr
    assert user.password not in result.stderr + result.stdout
