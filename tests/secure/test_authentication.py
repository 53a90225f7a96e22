"""Authentication on the secured broker: TLS against the local CA, then SCRAM-SHA-512."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.secure.conftest import (
    REPO,
    Credentials,
    SecureBroker,
    SecureTopics,
    raised_error,
    wait_for_error,
)


def test_a_user_gets_in_and_sees_no_topic_it_has_no_acl_for(
    secure_broker: SecureBroker,
    user_factory: Callable[..., Credentials],
    secure_topics_factory: Callable[..., SecureTopics],
) -> None:
    secure_topics_factory()  # topics exist, but none is this user's
    user = user_factory()
    metadata = AdminClient(secure_broker.client_config(user)).list_topics(timeout=30)
    assert list(metadata.brokers) == [1]
    # Without DESCRIBE a topic is not even listed, internal ones included.
    assert metadata.topics == {}


@pytest.mark.parametrize("mistake", ["wrong password", "unknown user"])
def test_bad_credentials_are_one_clear_authentication_error(
    secure_broker: SecureBroker, user_factory: Callable[..., Credentials], mistake: str
) -> None:
    user = user_factory()
    if mistake == "wrong password":
        bad = Credentials(user.username, f"not-{user.password}")
    else:
        bad = Credentials(f"nobody-{uuid.uuid4().hex[:8]}", user.password)
    errors: list[KafkaError] = []
    producer = Producer(secure_broker.client_config(bad, error_cb=errors.append))
    error = wait_for_error(errors, producer.poll)
    assert error.code() == KafkaError._AUTHENTICATION
    assert not error.retriable()
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in error.str()
    assert bad.password not in error.str()


def test_a_client_that_does_not_trust_the_local_ca_is_refused(
    secure_broker: SecureBroker, user_factory: Callable[..., Credentials]
) -> None:
    user = user_factory()
    config = secure_broker.client_config(user)
    del config["ssl.ca.location"]  # the system's CAs only: the broker's certificate is not theirs
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    error = wait_for_error(errors, producer.poll)
    # librdkafka reports the failed handshake as _SSL, or as _TRANSPORT when it fails while
    # reading the handshake (seen once in CI): the message says why either way.
    assert error.code() in (KafkaError._SSL, KafkaError._TRANSPORT)
    assert "certificate verify failed" in error.str()


def test_the_client_listener_accepts_no_plaintext(secure_broker: SecureBroker) -> None:
    errors: list[KafkaError] = []
    settings: dict[str, Any] = {
        "bootstrap.servers": secure_broker.bootstrap,
        "error_cb": errors.append,
    }
    admin = AdminClient(settings)
    with pytest.raises(KafkaException) as raised:
        admin.list_topics(timeout=3)
    assert raised_error(raised.value).code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT)
    assert {e.code() for e in errors} <= {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT}


def _ready(bootstrap: str, config: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ops.kafka.secure_ready", "--bootstrap", bootstrap]
    return subprocess.run(
        [*command, "--config", str(config), "--timeout", str(timeout_s)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_readiness_check_authenticates_and_says_why_it_was_refused(
    secure_broker: SecureBroker, user_factory: Callable[..., Credentials], tmp_path: Path
) -> None:
    user = user_factory()
    good = secure_broker.write_properties(tmp_path / "good.properties", user)
    assert _ready(secure_broker.bootstrap, good, timeout_s=30).returncode == 0

    wrong = Credentials(user.username, f"not-{user.password}")
    bad = secure_broker.write_properties(tmp_path / "bad.properties", wrong)
    # A refusal is retried until the timeout, which then names it.
    result = _ready(secure_broker.bootstrap, bad, timeout_s=2)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in lines[0]
    assert wrong.password not in result.stderr + result.stdout
