"""The case store: users, sessions, cases and the append-only audit log in one SQLite file.

SQLite rather than a server: one console needs no set-up, and a restart keeps everything (WAL
mode, one write transaction per batch of decisions). One connection, guarded by a lock, serves
the ingest thread and the HTTP threads; a batch of decisions is one transaction, so the lock is
held for milliseconds. The audit log refuses UPDATE and DELETE in the database itself
(triggers), not only in this code.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple

from contracts.errors import ConfigurationError

Role = Literal["analyst", "lead"]
ROLES: tuple[Role, ...] = ("analyst", "lead")
#: Cases a listing returns at most (the page shows the top of the queue).
MAX_LISTED = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL, role TEXT NOT NULL,
    created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    token_hash TEXT PRIMARY KEY, user TEXT NOT NULL REFERENCES users(name),
    csrf TEXT NOT NULL, expires_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cases (
    transaction_id TEXT PRIMARY KEY, card_id TEXT NOT NULL, score REAL NOT NULL,
    decision TEXT NOT NULL, model_version TEXT NOT NULL, event_time INTEGER NOT NULL,
    decided_at INTEGER NOT NULL, reasons TEXT NOT NULL, rules TEXT NOT NULL,
    amount REAL, currency TEXT, merchant_id TEXT, terminal_id TEXT, country TEXT,
    channel TEXT, utc_offset_minutes INTEGER, expected_loss REAL NOT NULL,
    timeline TEXT NOT NULL, status TEXT NOT NULL, opened_at INTEGER NOT NULL,
    fraud INTEGER, reviewer TEXT, note TEXT, closed_at INTEGER);
CREATE INDEX IF NOT EXISTS cases_queue ON cases(status, expected_loss DESC);
CREATE INDEX IF NOT EXISTS cases_age ON cases(status, opened_at);
CREATE INDEX IF NOT EXISTS cases_card ON cases(card_id, event_time);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, actor TEXT NOT NULL,
    transaction_id TEXT NOT NULL, action TEXT NOT NULL, before TEXT, after TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""

#: The columns a case shows, in the JSON API's order.
CASE_FIELDS = (
    "transaction_id",
    "card_id",
    "score",
    "decision",
    "model_version",
    "event_time",
    "decided_at",
    "reasons",
    "rules",
    "amount",
    "currency",
    "merchant_id",
    "terminal_id",
    "country",
    "channel",
    "utc_offset_minutes",
    "expected_loss",
    "status",
    "opened_at",
    "fraud",
    "reviewer",
    "note",
    "closed_at",
)
_JSON_FIELDS = frozenset({"reasons", "rules", "timeline"})


class TransactionDetails(NamedTuple):
    """What a case takes from the transactions topic."""

    amount: float
    currency: str
    merchant_id: str
    terminal_id: str | None
    country: str
    channel: str
    utc_offset_minutes: int | None


class NewCase(NamedTuple):
    """A flagged decision, as it opens a case."""

    transaction_id: str
    card_id: str
    score: float
    decision: str
    model_version: str
    event_time: int
    decided_at: int
    #: JSON-ready: [{"feature", "label", "contribution"}…] and the rules' names.
    reasons: list[dict[str, Any]]
    rules: list[str]
    details: TransactionDetails | None
    #: The card's decisions before this one: [{"transaction_id", "event_time", "score",
    #: "decision"}…], oldest first.
    timeline: list[dict[str, Any]]


class User(NamedTuple):
    name: str
    role: Role


class CaseStore:
    """The console's state in one SQLite file."""

    def __init__(self, path: Path) -> None:
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"cannot open the review database {path}: {exc}; set FRAUD_REVIEW_DB to a "
                "writable file"
            ) from exc
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # Users and sessions

    def add_user(self, name: str, password_hash: str, role: Role) -> None:
        """Create a user, or replace the password and role of an existing one."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO users VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                "password_hash = excluded.password_hash, role = excluded.role",
                (name, password_hash, role, _now_ms()),
            )

    def password_hash(self, name: str) -> tuple[str, Role] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT password_hash, role FROM users WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else (row["password_hash"], row["role"])

    def add_session(self, token_hash: str, user: str, csrf: str, expires_at: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM sessions WHERE expires_at < ?", (_now_ms(),))
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?)", (token_hash, user, csrf, expires_at)
            )

    def session(self, token_hash: str) -> tuple[User, str] | None:
        """The session's user and CSRF token; None when unknown or expired."""
        with self._lock:
            row = self._db.execute(
                "SELECT u.name, u.role, s.csrf FROM sessions s JOIN users u ON u.name = s.user "
                "WHERE s.token_hash = ? AND s.expires_at >= ?",
                (token_hash, _now_ms()),
            ).fetchone()
        return None if row is None else (User(row["name"], row["role"]), row["csrf"])

    def end_session(self, token_hash: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM sessions WHERE token_hash = ?", (token_hash,))

    # Cases, written by the ingest thread

    def open_cases(self, cases: Iterable[NewCase]) -> int:
        """Open a case per decision not seen before (a re-decision of the same transaction is
        ignored); return how many were opened."""
        now = _now_ms()
        rows = [_case_row(case, now) for case in cases]
        if not rows:
            return 0
        with self._transaction() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO cases (transaction_id, card_id, score, decision, "
                "model_version, event_time, decided_at, reasons, rules, amount, currency, "
                "merchant_id, terminal_id, country, channel, utc_offset_minutes, expected_loss, "
                "timeline, status, opened_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?)",
                rows,
            )
            return db.total_changes - before

    def add_details(self, found: Iterable[tuple[str, TransactionDetails]]) -> None:
        """Fill in the transaction's fields of cases opened before their transaction was read."""
        rows = [(*details, details.amount, transaction_id) for transaction_id, details in found]
        if not rows:
            return
        with self._transaction() as db:
            db.executemany(
                "UPDATE cases SET amount = ?, currency = ?, merchant_id = ?, terminal_id = ?, "
                "country = ?, channel = ?, utc_offset_minutes = ?, "
                "expected_loss = score * ? WHERE transaction_id = ? AND amount IS NULL",
                rows,
            )

    def awaiting_details(self, limit: int) -> list[str]:
        """Open cases still without their transaction's fields (at most `limit`)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT transaction_id FROM cases WHERE status = 'open' AND amount IS NULL LIMIT ?",
                (limit,),
            ).fetchall()
        return [row[0] for row in rows]

    def purge_closed(self, retention_ms: int) -> int:
        """Delete the closed cases closed more than `retention_ms` ago; return how many."""
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM cases WHERE status = 'closed' AND closed_at < ?",
                (_now_ms() - retention_ms,),
            )
            return cursor.rowcount

    # Cases, read and closed by the console

    def list_cases(self, status: Literal["open", "closed"], limit: int) -> list[dict[str, Any]]:
        """Open cases by expected loss (score x amount), highest first; closed ones newest
        first."""
        order = "expected_loss DESC" if status == "open" else "closed_at DESC"
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join(CASE_FIELDS)} FROM cases WHERE status = ? "
                f"ORDER BY {order} LIMIT ?",
                (status, min(limit, MAX_LISTED)),
            ).fetchall()
        return [_case_dict(row) for row in rows]

    def case(self, transaction_id: str) -> dict[str, Any] | None:
        """One case with its timeline: the card's earlier decisions and its other cases."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {', '.join(CASE_FIELDS)}, timeline FROM cases WHERE transaction_id = ?",
                (transaction_id,),
            ).fetchone()
            if row is None:
                return None
            others = self._db.execute(
                "SELECT transaction_id, event_time, score, decision, status, fraud FROM cases "
                "WHERE card_id = ? AND transaction_id != ? ORDER BY event_time DESC LIMIT 20",
                (row["card_id"], transaction_id),
            ).fetchall()
        case = _case_dict(row)
        case["card_cases"] = [dict(other) for other in others]
        return case

    def close_case(
        self,
        transaction_id: str,
        fraud: bool,
        note: str,
        actor: User,
        action: str,
        before: dict[str, Any] | None,
    ) -> None:
        """Record a verdict on a case and its line in the audit log, in one transaction."""
        now = _now_ms()
        after = {"fraud": fraud, "note": note, "reviewer": actor.name}
        with self._transaction() as db:
            db.execute(
                "UPDATE cases SET status = 'closed', fraud = ?, reviewer = ?, note = ?, "
                "closed_at = ? WHERE transaction_id = ?",
                (int(fraud), actor.name, note, now, transaction_id),
            )
            db.execute(
                "INSERT INTO audit (at, actor, transaction_id, action, before, after) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    now,
                    actor.name,
                    transaction_id,
                    action,
                    None if before is None else json.dumps(before),
                    json.dumps(after),
                ),
            )

    def audit(self, transaction_id: str) -> list[dict[str, Any]]:
        """The audit log's lines of one case, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT at, actor, action, before, after FROM audit WHERE transaction_id = ? "
                "ORDER BY id",
                (transaction_id,),
            ).fetchall()
        return [
            {
                **dict(row),
                "before": row["before"] and json.loads(row["before"]),
                "after": json.loads(row["after"]),
            }
            for row in rows
        ]

    def queue_state(self) -> tuple[int, int | None]:
        """How many cases are open, and when the oldest was opened (epoch ms; None: none)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*), MIN(opened_at) FROM cases WHERE status = 'open'"
            ).fetchone()
        return int(row[0]), row[1]


def _case_row(case: NewCase, now: int) -> tuple[Any, ...]:
    details = case.details
    amount = None if details is None else details.amount
    return (
        case.transaction_id,
        case.card_id,
        case.score,
        case.decision,
        case.model_version,
        case.event_time,
        case.decided_at,
        json.dumps(case.reasons),
        json.dumps(case.rules),
        *(details if details is not None else (None,) * len(TransactionDetails._fields)),
        # Without the amount, the score alone orders the case (below any case with one).
        case.score * amount if amount is not None else case.score,
        json.dumps(case.timeline),
        now,
    )


def _case_dict(row: sqlite3.Row) -> dict[str, Any]:
    case = dict(row)
    for name in _JSON_FIELDS & case.keys():
        case[name] = json.loads(case[name])
    if case.get("fraud") is not None:
        case["fraud"] = bool(case["fraud"])
    return case


def _now_ms() -> int:
    return int(time.time() * 1000)
