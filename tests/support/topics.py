"""Topics a test creates on a broker and deletes again, on the plain or the secured cluster."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from confluent_kafka.admin import AdminClient, NewTopic

#: How long one create or delete may take before the test fails.
ADMIN_TIMEOUT_S = 30.0


def create_topics(
    admin: AdminClient, topics: Iterable[NewTopic], timeout_s: float = ADMIN_TIMEOUT_S
) -> list[str]:
    """Create `topics` and wait until the broker has them all; return their names."""
    futures = admin.create_topics(list(topics))
    for future in futures.values():
        future.result(timeout=timeout_s)
    return list(futures)


def delete_topics(
    admin: AdminClient, names: Iterable[str], timeout_s: float = ADMIN_TIMEOUT_S
) -> None:
    """Delete the topics `names` and wait until the broker has deleted them all."""
    wanted = list(names)
    if wanted:
        for future in admin.delete_topics(wanted).values():
            future.result(timeout=timeout_s)


@contextmanager
def temporary_topic(
    admin: AdminClient, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
) -> Iterator[str]:
    """The topic `name`, created on the way in and deleted on the way out."""
    create_topics(admin, [NewTopic(name, partitions, 1, config=dict(config or {}))])
    try:
        yield name
    finally:
        delete_topics(admin, [name])
