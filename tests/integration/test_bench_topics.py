"""The benchmark leaves the broker as it found it: a card-state changelog that a service created
for a contender's group is deleted with the topics the benchmark created itself."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import Broker
from tests.integration.conftest import BOOTSTRAP

GONE_TIMEOUT_S = 30.0


def _existing(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def _wait_gone(admin: AdminClient, names: set[str]) -> set[str]:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := names & _existing(admin)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_delete_topics_takes_the_services_changelogs_and_spares_what_it_is_told_to_keep(
    admin: AdminClient,
) -> None:
    broker = Broker(BOOTSTRAP)
    backlog = broker.topic("backlog", 1)
    output = broker.topic("pipeline-1-out", 1)
    # What a service started for the contender's group creates on its own.
    changelog = f"{broker.group('pipeline-1')}-card-state-changelog"
    unrelated = f"not-bench-{broker.run_id}"
    for future in admin.create_topics(
        [NewTopic(changelog, 1, 1), NewTopic(unrelated, 1, 1)]
    ).values():
        future.result(timeout=30)
    try:
        broker.delete_topics(keep=(backlog,))
        assert _wait_gone(admin, {output, changelog}) == set()
        assert {backlog, unrelated} <= _existing(admin)

        broker.delete_topics()
        assert _wait_gone(admin, {backlog}) == set()
        assert unrelated in _existing(admin)
    finally:
        for future in admin.delete_topics([unrelated]).values():
            future.result(timeout=30)
