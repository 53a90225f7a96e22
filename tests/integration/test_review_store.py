"""The review console's store on both of its databases, real ones: a SQLite file, and the
PostgreSQL server `make test` starts (ops/postgres/postgres.sh, 127.0.0.1:15432), a database of
its own per test. A decision opens one case however often it is read, the audit log cannot be
changed, closed cases leave after their retention, the queue is ordered by expected loss, and on
PostgreSQL two consoles sharing the store never both record a verdict on one case."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from plumbing.errors import ConfigurationError
from review.cases import CaseStore, NewCase, TransactionDetails, User
from review.metrics import ReviewMetrics
from review.verdicts import LabelPublisher, ReversalRefused, VerdictDesk
from tests.integration.conftest import BOOTSTRAP, read_topic
from tests.support.topics import create_topics, delete_topics

DETAILS = TransactionDetails(200.0, "EUR", "m-1", "T-1", "FR", "ecom", 60)


def case(tid: str, score: float, details: TransactionDetails | None = DETAILS) -> NewCase:
    now = int(time.time() * 1000)
    return NewCase(tid, "card-1", score, "review", "m", now, now, [], [], details, [])


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "review.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(location: str) -> Iterator[CaseStore]:
    store = CaseStore(location)
    yield store
    store.close()


def raw_statement(location: str) -> Callable[[str], None]:
    """Run a statement on the store's database directly, past the store's code."""
    if location.startswith("postgresql://"):

        def run(sql: str) -> None:
            with psycopg.connect(location, autocommit=True) as connection:
                connection.execute(sql)

        return run
    import sqlite3

    def run_sqlite(sql: str) -> None:
        connection = sqlite3.connect(location)
        try:
            connection.execute(sql)
            connection.commit()
        finally:
            connection.close()

    return run_sqlite


def test_a_decision_read_again_opens_no_second_case(store: CaseStore) -> None:
    assert store.open_cases([case("t-1", 0.5), case("t-2", 0.1)]) == 2
    assert store.open_cases([case("t-1", 0.9), case("t-3", 0.2)]) == 1
    assert [c["transaction_id"] for c in store.list_cases("open", 10)] == ["t-1", "t-3", "t-2"]
    assert store.queue_state()[0] == 3


def test_a_case_without_its_transaction_queues_by_score_until_the_fields_come(
    store: CaseStore,
) -> None:
    store.open_cases([case("t-1", 0.9, None), case("t-2", 0.01)])
    assert [c["transaction_id"] for c in store.list_cases("open", 10)] == ["t-2", "t-1"]
    assert store.awaiting_details(10) == ["t-1"]
    store.add_details([("t-1", DETAILS)])
    first = store.list_cases("open", 10)[0]
    assert (first["transaction_id"], first["expected_loss"], first["merchant_id"]) == (
        "t-1",
        pytest.approx(180.0),
        "m-1",
    )
    assert store.awaiting_details(10) == []


def test_the_audit_log_refuses_updates_and_deletes(location: str, store: CaseStore) -> None:
    store.open_cases([case("t-1", 0.5)])
    with store.deciding("t-1"):
        store.close_case("t-1", True, "note", User("ana", "analyst"), "closed", None)
    run = raw_statement(location)
    for statement in ("UPDATE audit SET actor = 'mallory'", "DELETE FROM audit"):
        with pytest.raises(Exception, match="append-only"):
            run(statement)
    assert [line["actor"] for line in store.audit("t-1")] == ["ana"]


def test_closed_cases_leave_after_their_retention_and_their_audit_stays(
    store: CaseStore,
) -> None:
    store.open_cases([case("t-1", 0.5), case("t-2", 0.5)])
    store.close_case("t-1", False, "", User("ana", "analyst"), "closed", None)
    time.sleep(0.01)
    assert store.purge_closed(retention_ms=60_000) == 0
    assert store.purge_closed(retention_ms=0) == 1
    assert store.case("t-1") is None
    assert store.case("t-2") is not None  # open cases are never purged
    assert len(store.audit("t-1")) == 1


def test_sessions_and_users_survive_a_new_store_on_the_same_database(location: str) -> None:
    first = CaseStore(location)
    first.add_user("ana", "hash", "lead")
    first.add_session("token", "ana", "csrf", int(time.time() * 1000) + 60_000)
    first.close()
    second = CaseStore(location)
    assert second.password_hash("ana") == ("hash", "lead")
    assert second.session("token") == (User("ana", "lead"), "csrf")
    second.close()


def test_an_unusable_database_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="FRAUD_REVIEW_DB"):
        CaseStore(str(tmp_path / "missing-folder" / "review.db"))
    with pytest.raises(ConfigurationError, match=r"postgresql://\*\*\*@127.0.0.1:1/x"):
        CaseStore("postgresql://user:secret@127.0.0.1:1/x")


class SlowPublisher(LabelPublisher):
    """The real publisher, holding each label a moment longer: the window in which a second
    console's verdict on the same case would slip in without the row lock."""

    def publish(self, label: Any) -> None:
        time.sleep(0.5)
        super().publish(label)


def test_two_consoles_on_one_postgres_never_both_decide_a_case(
    postgres_url: str, admin: AdminClient
) -> None:
    labels = f"labels-{uuid.uuid4().hex[:10]}"
    create_topics(admin, [NewTopic(labels, 1, 1)])
    stores = [CaseStore(postgres_url), CaseStore(postgres_url)]
    publishers = [SlowPublisher({"bootstrap.servers": BOOTSTRAP}, labels) for _ in stores]
    try:
        stores[0].open_cases([case("t-1", 0.5)])
        desks = [
            VerdictDesk(store, publisher, ReviewMetrics(60))
            for store, publisher in zip(stores, publishers, strict=True)
        ]
        results: list[str] = []
        analysts = (User("ana", "analyst"), User("bob", "analyst"))

        def decide(desk: VerdictDesk, user: User) -> None:
            try:
                results.append(desk.record("t-1", True, user.name, user))
            except ReversalRefused:
                results.append("refused")

        threads = [
            threading.Thread(target=decide, args=(desk, user))
            for desk, user in zip(desks, analysts, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == ["closed", "unchanged"]
        assert len(read_topic(labels, 1, timeout_s=10, settle_s=2)) == 1
        assert len(stores[1].audit("t-1")) == 1
    finally:
        for publisher in publishers:
            publisher.close()
        for store in stores:
            store.close()
        delete_topics(admin, [labels])


def test_a_postgres_connection_the_server_dropped_is_replaced(postgres_url: str) -> None:
    store = CaseStore(postgres_url)
    try:
        store.open_cases([case("t-1", 0.5)])
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        # A verdict checks its connection first: it does not fail on the dropped one.
        with store.deciding("t-1") as found:
            assert found is not None
            store.close_case("t-1", True, "", User("ana", "analyst"), "closed", None)
        # The shared connection fails the call that finds it dropped; the next gets a new one.
        with pytest.raises(psycopg.OperationalError):
            store.queue_state()
        assert store.queue_state() == (0, None)
    finally:
        store.close()
