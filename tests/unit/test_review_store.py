"""The review console's store, on a real SQLite file: a decision opens one case however often it
is read, the audit log cannot be changed, closed cases leave after their retention, and the
queue is ordered by expected loss."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from review.cases import CaseStore, NewCase, TransactionDetails, User

DETAILS = TransactionDetails(200.0, "EUR", "m-1", "T-1", "FR", "ecom", 60)


def case(tid: str, score: float, details: TransactionDetails | None = DETAILS) -> NewCase:
    now = int(time.time() * 1000)
    return NewCase(tid, "card-1", score, "review", "m", now, now, [], [], details, [])


@pytest.fixture
def store(tmp_path: Path):
    store = CaseStore(tmp_path / "review.db")
    yield store
    store.close()


def test_a_decision_read_again_opens_no_second_case(store: CaseStore) -> None:
    assert store.open_cases([case("t-1", 0.5), case("t-2", 0.1)]) == 2
    assert store.open_cases([case("t-1", 0.9)]) == 0
    assert [c["transaction_id"] for c in store.list_cases("open", 10)] == ["t-1", "t-2"]
    assert store.queue_state()[0] == 2


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


def test_the_audit_log_refuses_updates_and_deletes(tmp_path: Path, store: CaseStore) -> None:
    store.open_cases([case("t-1", 0.5)])
    store.close_case("t-1", True, "note", User("ana", "analyst"), "closed", None)
    assert [line["actor"] for line in store.audit("t-1")] == ["ana"]
    raw = sqlite3.connect(tmp_path / "review.db")
    for statement in ("UPDATE audit SET actor = 'mallory'", "DELETE FROM audit"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            raw.execute(statement)
    raw.close()
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


def test_an_unwritable_database_is_a_configuration_error(tmp_path: Path) -> None:
    from contracts.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="FRAUD_REVIEW_DB"):
        CaseStore(tmp_path / "missing-folder" / "review.db")
