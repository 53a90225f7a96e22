"""`fraud-loadgen` against the secured broker: its producer and its outcome reader take the same
librdkafka settings as every other command (properties file, `-X`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ops.kafka.acls import ServiceAcls
from tests.integration.conftest import ServiceProcess
from tests.secure.conftest import REPO, Credentials, SecureBroker, SecureTopics


def test_loadgen_sends_and_reads_back_with_credentials_from_its_properties_file(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
    grant_service_acls: Callable[..., ServiceAcls],
    group_id: str,
    start_service: Callable[..., ServiceProcess],
    tmp_path: Path,
) -> None:
    topics, user = secure_topics_factory(partitions=1), user_factory()
    grant_service_acls(user, topics)
    start_service(user, topics, group_id, "file")
    properties = secure_broker.write_properties(
        tmp_path / "loadgen.properties", secure_broker.admin, {}
    )
    command = [
        sys.executable,
        "-m",
        "loadgen.cli",
        "--bootstrap-servers",
        secure_broker.bootstrap,
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--dlq-topic",
        topics.dlq,
        "--rate",
        "100",
        "--duration",
        "2",
        "--drain-timeout",
        "60",
        "--no-labels",
        "--metrics-url",
        "",
        "--json",
        "--quiet",
    ]
    env = {"PATH": "/usr/bin:/bin", "FRAUD_KAFKA_CONFIG_FILE": str(properties)}

    run = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["sent"] == summary["decided"] == 200
    assert summary["lost"] == summary["failed_sends"] == 0

    # Without the credentials the same run cannot even reach the outcome topics.
    refused = subprocess.run(
        command,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert refused.returncode == 1
    assert "cannot read the outcome topics" in refused.stderr
