"""Fixtures for tests against the secured broker that `make test` starts next to the plain one.

The broker (`ops/kafka/kafka.sh up --secure`) listens with SASL_SSL (SCRAM-SHA-512 over TLS) on
`KAFKA_SECURE_BOOTSTRAP_SERVERS` (default 127.0.0.1:9192), authorizes with ACLs and denies what
no ACL allows. Its state folder (`KAFKA_SECURE_STATE_DIR`, default `.kafka-secure/`) holds the
CA that clients trust (`tls/ca.pem`) and the super user's settings (`clients/admin.properties`).
A missing broker fails the run; it is never a silent skip.

Every test works as its own SCRAM user (`user_factory`), on its own topics
(`secure_topics_factory`) with its own group, and grants exactly the ACLs it needs
(`grant_service_acls`, `acls`); users, their ACLs and the topics are removed afterwards.

    def test_x(secure_broker, user_factory, secure_topics_factory, grant_service_acls):
        user, topics = user_factory(), secure_topics_factory()
        spec = grant_service_acls(user, topics)               # what the service may do, no more
        producer = Producer(secure_broker.client_config(user))
        properties = secure_broker.write_properties(tmp_path / "kafka.properties", user)
"""

from __future__ import annotations

import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from contracts.worker_progress import progress_topic_name
from ops.kafka import acls as acl_tools
from ops.kafka.acls import ServiceAcls
from ops.kafka.secure_ready import Refused, brokers_listed
from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import read_kafka_config_file
from tests.integration.conftest import ServiceProcess
from tests.support.network import free_port
from tests.support.topics import ADMIN_TIMEOUT_S, create_topics, delete_topics

REPO = Path(__file__).resolve().parents[2]
SECURE_BOOTSTRAP = os.environ.get("KAFKA_SECURE_BOOTSTRAP_SERVERS", "127.0.0.1:9192")
SECURE_STATE_DIR = Path(os.environ.get("KAFKA_SECURE_STATE_DIR", REPO / ".kafka-secure"))
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: Kafka's default for SCRAM credentials; the hash cost of one authentication.
SCRAM_ITERATIONS = 4096
#: A new user is known to the broker once the controller committed it and the broker applied it.
USER_PROPAGATION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credentials:
    """A SCRAM-SHA-512 user of the secured broker. The password never shows in a repr."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class SecureBroker:
    """Where the secured broker listens, the CA its certificate chains to, and its super user."""

    bootstrap: str
    ca_path: Path
    admin: Credentials

    def security_settings(self, user: Credentials) -> dict[str, str]:
        """The librdkafka settings that authenticate `user` (without bootstrap.servers)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM_MECHANISM,
            "sasl.username": user.username,
            "sasl.password": user.password,
            "ssl.ca.location": str(self.ca_path),
        }

    def client_config(self, user: Credentials, **extra: Any) -> dict[str, Any]:
        """A complete confluent-kafka configuration for `user`, plus `extra` settings
        (pass dotted librdkafka names with a dict: `client_config(u, **{"group.id": g})`)."""
        return {"bootstrap.servers": self.bootstrap, **self.security_settings(user), **extra}

    def write_properties(
        self, path: Path, user: Credentials, extra: Mapping[str, str] | None = None
    ) -> Path:
        """Write a librdkafka properties file (`key=value` lines, as `FRAUD_KAFKA_CONFIG_FILE`
        reads) with `user`'s security settings and `extra`; readable by the owner only."""
        lines = [f"# {user.username} on the secured test broker"]
        lines += [f"{k}={v}" for k, v in {**self.security_settings(user), **(extra or {})}.items()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        path.chmod(0o600)
        return path


@dataclass(frozen=True)
class SecureTopics:
    """One test's topics on the secured broker, named like the service's."""

    input: str
    labels: str
    output: str
    dlq: str
    partitions: int

    @property
    def names(self) -> tuple[str, ...]:
        return (self.input, self.labels, self.output, self.dlq)

    @property
    def control(self) -> tuple[str, ...]:
        """The test's own terminal-risk and card-frauds topics (never created: read as empty
        where the principal may describe them)."""
        return (f"{self.input}-terminal-risk", f"{self.input}-card-frauds")


def _admin_credentials() -> Credentials:
    path = SECURE_STATE_DIR / "clients" / "admin.properties"
    try:
        settings = read_kafka_config_file(path)
    except ConfigurationError as exc:
        pytest.fail(
            f"no secured broker state at {SECURE_STATE_DIR} ({exc}); "
            "start one with `make kafka-up-secure` (or run `make test`)"
        )
    return Credentials(settings["sasl.username"], settings["sasl.password"])


@pytest.fixture(scope="session")
def secure_broker() -> SecureBroker:
    """The secured broker; fails the run when it does not answer as its admin."""
    broker = SecureBroker(
        SECURE_BOOTSTRAP, SECURE_STATE_DIR / "tls" / "ca.pem", _admin_credentials()
    )
    try:
        brokers_listed(broker.client_config(broker.admin), 10.0)
    except (TimeoutError, Refused) as exc:
        pytest.fail(
            f"no secured Kafka broker at {broker.bootstrap} ({exc}); "
            "start one with `make kafka-up-secure` (or run `make test`)"
        )
    return broker


@pytest.fixture(scope="session")
def secure_admin(secure_broker: SecureBroker) -> AdminClient:
    """An AdminClient as the super user: topics, users and ACLs."""
    return AdminClient(secure_broker.client_config(secure_broker.admin))


def can_authenticate(broker: SecureBroker, user: Credentials) -> bool:
    """Whether the broker lets `user` in now (a refusal is not retried)."""
    try:
        brokers_listed(broker.client_config(user), 10.0)
    except Refused:
        return False
    return True


@pytest.fixture
def user_factory(
    secure_broker: SecureBroker, secure_admin: AdminClient
) -> Iterator[Callable[..., Credentials]]:
    """`make(prefix="svc")` creates a SCRAM user with a random name and password and returns once
    the broker accepts it. At teardown its ACLs are deleted and its password is replaced by a
    random one nobody knows.

    The user itself is not deleted: Kafka 4.1.1 replays a user deletion wrongly at start-up
    (`ScramDelta.apply()` drops the whole mechanism when a removal empties its map, and with it
    users added after it in the same delta), so a broker whose metadata log holds one may come
    back from a restart without any SCRAM user, admin included."""
    created: list[Credentials] = []

    def make(prefix: str = "svc") -> Credentials:
        user = Credentials(f"{prefix}-{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(24))
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        upsert = UserScramCredentialUpsertion(user.username, info, user.password.encode())
        for future in secure_admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=ADMIN_TIMEOUT_S)
        created.append(user)
        deadline = time.monotonic() + USER_PROPAGATION_TIMEOUT_S
        while not can_authenticate(secure_broker, user):
            assert time.monotonic() < deadline, f"user {user.username} was never accepted"
            time.sleep(0.05)
        return user

    yield make
    for user in created:
        acl_tools.revoke_all(secure_admin, user.username)
    if created:
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        locked: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(u.username, info, secrets.token_bytes(32)) for u in created
        ]
        for future in secure_admin.alter_user_scram_credentials(locked).values():
            future.result(timeout=ADMIN_TIMEOUT_S)


@pytest.fixture
def secure_topics_factory(secure_admin: AdminClient) -> Iterator[Callable[..., SecureTopics]]:
    """`make(partitions=3)` creates a test's input, labels, decision and dead-letter topics as
    the super user; they are deleted at teardown."""
    created: list[str] = []

    def make(partitions: int = 3) -> SecureTopics:
        suffix = uuid.uuid4().hex[:10]
        topics = SecureTopics(
            f"tx-{suffix}",
            f"labels-{suffix}",
            f"decisions-{suffix}",
            f"tx-{suffix}.dlq",
            partitions,
        )
        new = [NewTopic(n, partitions, 1) for n in topics.names]
        created.extend(create_topics(secure_admin, new))
        return topics

    yield make
    delete_topics(secure_admin, created)


@pytest.fixture
def group_id() -> str:
    """A consumer group (and transactional-id and changelog prefix) of the test's own."""
    return f"fraud-scorer-{uuid.uuid4().hex[:10]}"


def service_acls(user: Credentials, topics: SecureTopics, group: str) -> ServiceAcls:
    """The service principal's ACL set for a test's topics: read the transactions, labels,
    terminal-risk (and its progress) and card-frauds, write the decisions and dead letters,
    changelogs `<group>-`, group `group`, transactional ids `group`."""
    progress = progress_topic_name(topics.control[0])
    return ServiceAcls(
        principal=user.username,
        input_topics=(topics.input, topics.labels),
        features_topics=(*topics.control, progress),
        output_topics=(topics.output, topics.dlq),
        group=group,
        transactional_id_prefix=group,
    )


class Acls:
    """Grant and revoke ACLs as the super user; each call returns once the broker enforces it."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin

    def grant(self, bindings: Iterable[AclBinding]) -> None:
        acl_tools.grant(self._admin, bindings)

    def revoke(self, bindings: Iterable[AclBinding]) -> None:
        acl_tools.revoke(self._admin, bindings)

    def of(self, user: Credentials) -> list[AclBinding]:
        """Every ACL of `user`, as the broker lists them."""
        return acl_tools.acls_of(self._admin, user.username)


def only(
    bindings: Iterable[AclBinding], resource: str, *operations: AclOperation
) -> list[AclBinding]:
    """The bindings on the resource named `resource` (with one of `operations`, if given)."""
    return [
        b for b in bindings if b.name == resource and (not operations or b.operation in operations)
    ]


@pytest.fixture
def acls(secure_admin: AdminClient) -> Acls:
    """Grant/revoke any ACL bindings (e.g. `only(spec.bindings(), topics.dlq, WRITE)`)."""
    return Acls(secure_admin)


@pytest.fixture
def grant_service_acls(acls: Acls, group_id: str) -> Callable[..., ServiceAcls]:
    """`grant(user, topics, group=group_id, without=())` grants `user` the service's ACL set on
    `topics` minus the bindings in `without`, and returns the full set (to grant the rest later
    or to revoke parts). The user's ACLs go with the user at teardown."""

    def grant(
        user: Credentials,
        topics: SecureTopics,
        group: str | None = None,
        without: Iterable[AclBinding] = (),
    ) -> ServiceAcls:
        spec = service_acls(user, topics, group or group_id)
        left_out = set(without)
        acls.grant(b for b in spec.bindings() if b not in left_out)
        return spec

    return grant


def wait_for_error(
    errors: list[KafkaError], poll: Callable[[float], object], timeout_s: float = 30.0
) -> KafkaError:
    """Poll a client until its error callback (appending to `errors`) got one; return the first."""
    deadline = time.monotonic() + timeout_s
    while not errors:
        assert time.monotonic() < deadline, f"no client error within {timeout_s}s"
        poll(0.1)
    return errors[0]


def raised_error(exc: KafkaException) -> KafkaError:
    """The KafkaError a KafkaException carries."""
    error = exc.args[0]
    assert isinstance(error, KafkaError), exc
    return error


SOURCES = ["file", "env"]


def credential_env(
    broker: SecureBroker, user: Credentials, source: str, path: Path, extra: dict[str, str]
) -> dict[str, str]:
    """The environment that hands `user`'s settings (and `extra`) to the service."""
    if source == "file":
        return {"FRAUD_KAFKA_CONFIG_FILE": str(broker.write_properties(path, user, extra))}
    settings = {**broker.security_settings(user), **extra}
    return {"FRAUD_KAFKA_OPTIONS": ",".join(f"{k}={v}" for k, v in settings.items())}


@pytest.fixture
def start_service(
    secure_broker: SecureBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., ServiceProcess]]:
    """`start(user, topics, group, source, *flags, extra={})`: `fraud-scorer run` on the secured
    broker with `user`'s credentials from `source` ("file" or "env")."""
    started: list[ServiceProcess] = []

    def start(
        user: Credentials,
        topics: SecureTopics,
        group: str,
        source: str,
        *flags: str,
        extra: dict[str, str] | None = None,
    ) -> ServiceProcess:
        env = credential_env(
            secure_broker, user, source, tmp_path / f"{user.username}.properties", extra or {}
        )
        for name, value in env.items():
            monkeypatch.setenv(name, value)  # the child inherits it
        port = free_port()
        args = [
            "--bootstrap-servers",
            secure_broker.bootstrap,
            "--input-topic",
            topics.input,
            "--output-topic",
            topics.output,
            "--dlq-topic",
            topics.dlq,
            "--group-id",
            group,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            # The test's own control topics: a control topic the principal may not read keeps
            # the replica not ready (issue 43).
            *("--terminal-risk-topic", topics.control[0]),
            *("--card-frauds-topic", topics.control[1]),
            *flags,
        ]
        service = ServiceProcess(args, tmp_path / f"service-{len(started)}.log", port).start()
        started.append(service)
        return service

    yield start
    for service in started:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait(timeout=30)
