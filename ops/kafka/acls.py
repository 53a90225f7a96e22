"""The ACLs of the service's principal on a secured cluster: what `fraud-scorer run` needs, no more.

`ServiceAcls` names the resources (topics, consumer group, changelog prefix, transactional-id
prefix) and `bindings()` turns them into Kafka ACLs; `grant()` and `revoke()` apply them through
the Admin API as a principal allowed to (a super user) and return only once the broker enforces
them, so a test may act right after. Every binding is an ALLOW; on a broker with
`allow.everyone.if.no.acl.found=false` anything not listed is denied.

| resource | pattern | operations | why |
| --- | --- | --- | --- |
| `transactions`, `labels`, `card-frauds` | literal | READ, DESCRIBE | consume |
| `terminal-risk`, `terminal-risk-progress` | literal | READ, DESCRIBE | consume |
| output topics (`decisions`, the dead-letter topic) | literal | WRITE, DESCRIBE | produce |
| changelogs `<group>-` | prefixed | READ, WRITE, DESCRIBE, CREATE | write, restore, create state |
| consumer group | literal | READ | join, commit and fetch offsets |
| transactional ids `<prefix>` | prefixed | WRITE, DESCRIBE | exactly-once producers |

Not granted, on purpose: CREATE beyond the changelogs, DELETE, ALTER and *_CONFIGS anywhere
(the admin creates the other topics), and IDEMPOTENT_WRITE on the cluster: since Kafka 2.8
(KIP-679) an idempotent producer needs only WRITE on a topic.

Command line (the admin's librdkafka properties file, e.g. the local secured broker's
`.kafka-secure/clients/admin.properties`):

    python -m ops.kafka.acls --config FILE [--bootstrap-servers HOST:PORT] grant [--create-topics]
    python -m ops.kafka.acls --config FILE revoke | show

`grant` adds the bindings (and with `--create-topics` creates the input and output topics where
missing; the features worker's compacted topics are its own to create: `fraud-features
create-topics`), `revoke` deletes every ACL of the principal, `show` lists them. The resource
options (`--principal`, `--input-topic`, `--features-topic`, `--output-topic`, `--group`,
`--transactional-id-prefix`, `--changelog-prefix`) default to the service's own defaults.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException
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

from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import read_kafka_config_file

ADMIN_TIMEOUT_S = 30.0
#: How often to ask the broker whether it enforces a change yet (the controller commits it first,
#: then every broker applies it from the metadata log: milliseconds on one node).
PROPAGATION_POLL_S = 0.05
#: An AclBindingFilter's "any name" (or principal, or host): None, which confluent-kafka documents
#: but its type hints (str) do not allow.
MATCH_ANY = cast(str, None)
ANY_HOST = "*"

_READ = (AclOperation.READ, AclOperation.DESCRIBE)
_WRITE = (AclOperation.WRITE, AclOperation.DESCRIBE)
_READ_WRITE = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)


@dataclass(frozen=True)
class ServiceAcls:
    """The resources one service principal may use; defaults are the service's defaults."""

    #: The SCRAM user name (or any principal name) without the `User:` prefix.
    principal: str = "fraud-scorer"
    input_topics: tuple[str, ...] = ("transactions", "labels")
    #: Compacted topics the scorer reads and does not create (READ, like the inputs): what the
    #: features worker publishes (it creates them: `fraud-features create-topics`), and a rules
    #: topic. `grant --create-topics` leaves them alone.
    features_topics: tuple[str, ...] = ("terminal-risk", "terminal-risk-progress", "card-frauds")
    output_topics: tuple[str, ...] = ("decisions", "transactions.dlq")
    group: str = "fraud-scorer"
    transactional_id_prefix: str = "fraud-scorer"
    #: Prefix of the state changelog topics; None means `<group>-`.
    changelog_prefix: str | None = None

    @property
    def user(self) -> str:
        """The principal as Kafka writes it in ACLs."""
        return f"User:{self.principal}"

    def bindings(self) -> list[AclBinding]:
        """Every ACL of the principal, each an ALLOW from any host."""
        changelog_prefix = (
            f"{self.group}-" if self.changelog_prefix is None else self.changelog_prefix
        )
        topic, literal, prefixed = (
            ResourceType.TOPIC,
            ResourcePatternType.LITERAL,
            ResourcePatternType.PREFIXED,
        )
        wanted: list[tuple[ResourceType, str, ResourcePatternType, Sequence[AclOperation]]] = [
            *((topic, name, literal, _READ) for name in self.input_topics),
            *((topic, name, literal, _READ) for name in self.features_topics),
            *((topic, name, literal, _WRITE) for name in self.output_topics),
            # CREATE: the service creates its card-state changelog when missing.
            (topic, changelog_prefix, prefixed, (*_READ_WRITE, AclOperation.CREATE)),
            (ResourceType.GROUP, self.group, literal, (AclOperation.READ,)),
            (ResourceType.TRANSACTIONAL_ID, self.transactional_id_prefix, prefixed, _WRITE),
        ]
        return [
            AclBinding(kind, name, pattern, self.user, ANY_HOST, operation, AclPermissionType.ALLOW)
            for kind, name, pattern, operations in wanted
            for operation in operations
        ]


def principal_filter(principal: str) -> AclBindingFilter:
    """Matches every ACL of one principal (user name without `User:`)."""
    return AclBindingFilter(
        ResourceType.ANY,
        MATCH_ANY,
        ResourcePatternType.ANY,
        f"User:{principal}",
        MATCH_ANY,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def _exact(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )


def _enforced(admin: AdminClient, binding: AclBinding) -> bool:
    # DescribeAcls is answered from the broker's own authorizer, so what it lists is enforced.
    found = admin.describe_acls(_exact(binding), request_timeout=ADMIN_TIMEOUT_S)
    return bool(found.result(timeout=ADMIN_TIMEOUT_S))


def _wait_until(admin: AdminClient, bindings: list[AclBinding], present: bool) -> None:
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    pending = list(bindings)
    while pending:
        pending = [b for b in pending if _enforced(admin, b) != present]
        if not pending:
            return
        if time.monotonic() > deadline:
            state = "enforced" if present else "removed"
            raise TimeoutError(f"ACL not {state} after {ADMIN_TIMEOUT_S:.0f}s: {pending[0]}")
        time.sleep(PROPAGATION_POLL_S)


def grant(admin: AdminClient, bindings: Iterable[AclBinding]) -> None:
    """Create the ACLs (existing ones are kept) and return when the broker enforces them."""
    wanted = list(bindings)
    if not wanted:
        return
    for future in admin.create_acls(wanted, request_timeout=ADMIN_TIMEOUT_S).values():
        future.result(timeout=ADMIN_TIMEOUT_S)
    _wait_until(admin, wanted, present=True)


def revoke(admin: AdminClient, bindings: Iterable[AclBinding]) -> None:
    """Delete exactly these ACLs and return when the broker no longer enforces them."""
    unwanted = list(bindings)
    if not unwanted:
        return
    filters = [_exact(b) for b in unwanted]
    for future in admin.delete_acls(filters, request_timeout=ADMIN_TIMEOUT_S).values():
        future.result(timeout=ADMIN_TIMEOUT_S)
    _wait_until(admin, unwanted, present=False)


def acls_of(admin: AdminClient, principal: str) -> list[AclBinding]:
    """Every ACL of one principal (user name without `User:`)."""
    found = admin.describe_acls(principal_filter(principal), request_timeout=ADMIN_TIMEOUT_S)
    return list(found.result(timeout=ADMIN_TIMEOUT_S))


def revoke_all(admin: AdminClient, principal: str) -> list[AclBinding]:
    """Delete every ACL of one principal; return those deleted."""
    existing = acls_of(admin, principal)
    revoke(admin, existing)
    return existing


def create_topics(admin: AdminClient, names: Iterable[str], partitions: int) -> list[str]:
    """Create the topics that are missing (one replica each); return those created."""
    futures = admin.create_topics(
        [NewTopic(name, partitions, 1) for name in names], request_timeout=ADMIN_TIMEOUT_S
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def _describe(binding: AclBinding) -> str:
    pattern = "prefixed" if binding.resource_pattern_type == ResourcePatternType.PREFIXED else ""
    return (
        f"{name_of(binding.permission_type)} {binding.principal} {name_of(binding.operation)} "
        f"{name_of(binding.restype)} {binding.name!r} {pattern}"
    ).rstrip()


def name_of(value: Enum | str | int) -> str:
    """The name of one of an AclBinding's enum fields: confluent-kafka turns the str or int it is
    given into the enum, but types the attribute as any of the three."""
    return value.name if isinstance(value, Enum) else str(value)


def _reason(exc: Exception) -> str:
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return str(exc)
    if error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        # The broker's own text for this one is a dump of its request object.
        return f"{error.name()}: the --config principal may not manage ACLs (use the admin's)"
    return f"{error.name()}: {error.str()}"


def _parser() -> argparse.ArgumentParser:
    defaults = ServiceAcls()
    parser = argparse.ArgumentParser(
        prog="python -m ops.kafka.acls",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        help="librdkafka properties file of a principal allowed to manage ACLs (the admin)",
    )
    parser.add_argument(
        "--bootstrap-servers", default="127.0.0.1:9192", help="default: %(default)s"
    )
    parser.add_argument("--principal", default=defaults.principal, help="default: %(default)s")
    parser.add_argument(
        "--input-topic",
        action="append",
        help=f"repeatable (default: {', '.join(defaults.input_topics)})",
    )
    parser.add_argument(
        "--features-topic",
        action="append",
        help="a compacted topic the service reads and does not create (the features worker's "
        "outputs, a rules topic); `grant --create-topics` leaves it alone; repeatable "
        f"(default: {', '.join(defaults.features_topics)})",
    )
    parser.add_argument(
        "--output-topic",
        action="append",
        help=f"repeatable (default: {', '.join(defaults.output_topics)})",
    )
    parser.add_argument("--group", default=defaults.group, help="default: %(default)s")
    parser.add_argument(
        "--transactional-id-prefix",
        default=defaults.transactional_id_prefix,
        help="default: %(default)s",
    )
    parser.add_argument("--changelog-prefix", help="default: <group>-")
    commands = parser.add_subparsers(dest="command", required=True)
    grant_command = commands.add_parser("grant", help="add the principal's ACLs")
    grant_command.add_argument(
        "--create-topics",
        action="store_true",
        help="also create the input and output topics where missing (not the features "
        "topics: the features worker creates those, compacted)",
    )
    grant_command.add_argument(
        "--partitions", type=int, default=3, help="of created topics (default: %(default)s)"
    )
    commands.add_parser("revoke", help="delete every ACL of the principal")
    commands.add_parser("show", help="list the principal's ACLs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings: dict[str, Any] = read_kafka_config_file(args.config)
    except ConfigurationError as exc:
        print(f"acls: --config: {exc}", file=sys.stderr)
        return 2
    spec = ServiceAcls(
        principal=args.principal,
        input_topics=tuple(args.input_topic or ServiceAcls.input_topics),
        features_topics=tuple(args.features_topic or ServiceAcls.features_topics),
        output_topics=tuple(args.output_topic or ServiceAcls.output_topics),
        group=args.group,
        transactional_id_prefix=args.transactional_id_prefix,
        changelog_prefix=args.changelog_prefix,
    )
    admin = AdminClient({**settings, "bootstrap.servers": args.bootstrap_servers})
    try:
        if args.command == "grant":
            if args.create_topics:
                topics = (*spec.input_topics, *spec.output_topics)
                for name in create_topics(admin, topics, args.partitions):
                    print(f"created topic {name!r}")
            grant(admin, spec.bindings())
            print(f"granted {len(spec.bindings())} ACLs to {spec.user}")
        elif args.command == "revoke":
            print(f"revoked {len(revoke_all(admin, spec.principal))} ACLs of {spec.user}")
        existing = sorted(acls_of(admin, spec.principal), key=_describe)
        for binding in existing:
            print(_describe(binding))
        if not existing:
            print(f"no ACLs for {spec.user}")
    except (KafkaException, TimeoutError) as exc:
        print(f"acls: {args.command} failed: {_reason(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
