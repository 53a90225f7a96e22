"""The environment check of the real commands (plumbing/environment.py): a misspelt `FRAUD_*`
variable stops `fraud-scorer run` before it starts, naming it and the setting meant; a variable
of another command given to `fraud-features` is a warning naming its command."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.integration.conftest import BOOTSTRAP, REPO, Topics
from tests.support.network import free_port
from tests.support.topics import delete_topics

#: Long enough for a replica that does start to be seen running, not exiting.
START_TIMEOUT_S = 30.0


def _environment(**variables: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}
    return {**inherited, **variables}


def test_a_misspelt_variable_stops_fraud_scorer_run_naming_it(topics_factory, tmp_path: Path):
    topics: Topics = topics_factory(partitions=1)
    rules = tmp_path / "rules.toml"
    rules.write_text('[deny]\ncard_id = ["stolen"]\n')
    replica = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stream",
            "run",
            "--bootstrap-servers",
            BOOTSTRAP,
            "--input-topic",
            topics.input,
            "--output-topic",
            topics.output,
            "--dlq-topic",
            topics.dlq,
            "--group-id",
            f"env-check-{uuid.uuid4().hex[:8]}",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(free_port()),
        ],
        cwd=REPO,
        env=_environment(FRAUD_RULE=str(rules)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = replica.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        replica.kill()
        replica.communicate()
        raise AssertionError("fraud-scorer run started with FRAUD_RULE set") from None
    assert replica.returncode == 2, stderr
    assert stderr.strip() == (
        "fraud-scorer: configuration error: FRAUD_RULE is not a setting of any command; "
        "did you mean FRAUD_RULES?"
    )


def test_a_scorer_variable_given_to_fraud_features_is_a_warning_naming_the_scorer(
    admin: AdminClient,
):
    suffix = uuid.uuid4().hex[:10]
    names = [f"labels-{suffix}", f"terminal-risk-{suffix}", f"card-frauds-{suffix}"]
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "terminals",
                "create-topics",
                "--partitions",
                "1",
                "--bootstrap-servers",
                BOOTSTRAP,
                "--labels-topic",
                names[0],
                "--terminal-risk-topic",
                names[1],
                "--card-frauds-topic",
                names[2],
            ],
            cwd=REPO,
            env=_environment(FRAUD_METRICS_PORT="9200"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        delete_topics(admin, names)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "FRAUD_METRICS_PORT" in line]
    assert len(warnings) == 1, result.stderr
    assert "WARNING" in warnings[0]
    assert warnings[0].endswith(
        "FRAUD_METRICS_PORT is read by fraud-scorer, not by fraud-features: ignored; "
        "fraud-features's own is FRAUD_FEATURES_METRICS_PORT"
    )
