"""The case store: users, sessions, cases and the append-only audit log, in a SQLite file or a
PostgreSQL database (`review/database.py`).

A batch of decisions is one transaction, so the database is held for milliseconds. A verdict
reads its case under `deciding`, which holds the case against other verdicts (in other consoles
too, on PostgreSQL) until the label is acknowledged and the verdict written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple

from review.database import open_database

Role = Literal["analyst", "lead"]
ROLES: tuple[Role, ...] = ("analyst", "lead")
#: Cases a listing returns at most (the page shows the top of the queue).
MAX_LISTED = 500

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
    #: JSON-ready: [{"feature", "text", "label", "contribution"}…] (`case_reason`) and the
    #: rules' names.
    reasons: list[dict[str, Any]]
    rules: list[str]
    details: TransactionDetails | None
    #: The card's decisions before this one: [{"event_time", "score", "decision"}…], oldest
    #: first.
    timeline: list[dict[str, Any]]


class User(NamedTuple):
    name: str
    role: Role


class CaseStore:
    """The console's state, in the database FRAUD_REVIEW_DB names."""

    def __init__(self, location: str) -> None:
        """Raises ConfigurationError when the database cannot be opened or set up."""
        self._db = open_database(location)

    @property
    def shared(self) -> bool:
        """Whether other consoles may share this store (PostgreSQL)."""
        return self._db.shared

    def close(self) -> None:
        self._db.close()

    # Users and sessions

    def add_user(self, name: str, password_hash: str, role: Role) -> None:
        """Create a user, or replace the password and role of an existing one."""
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO users VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "password_hash = excluded.password_hash, role = excluded.role",
                (name, password_hash, role, _now_ms()),
            )
            # A new password or role ends the sessions opened with the old one.
            db.execute('DELETE FROM sessions WHERE "user" = ?', (name,))

    def password_hash(self, name: str) -> tuple[str, Role] | None:
        rows = self._db.execute("SELECT password_hash, role FROM users WHERE name = ?", (name,))
        return (rows[0]["password_hash"], rows[0]["role"]) if rows else None

    def add_session(self, token_hash: str, user: str, csrf: str, expires_at: int) -> None:
        with self._db.transaction() as db:
            db.execute("DELETE FROM sessions WHERE expires_at < ?", (_now_ms(),))
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?)", (token_hash, user, csrf, expires_at)
            )

    def session(self, token_hash: str) -> tuple[User, str] | None:
        """The session's user and CSRF token; None when unknown or expired."""
        rows = self._db.execute(
            'SELECT u.name, u.role, s.csrf FROM sessions s JOIN users u ON u.name = s."user" '
            "WHERE s.token_hash = ? AND s.expires_at >= ?",
            (token_hash, _now_ms()),
        )
        return (User(rows[0]["name"], rows[0]["role"]), rows[0]["csrf"]) if rows else None

    def end_session(self, token_hash: str) -> None:
        with self._db.transaction() as db:
            db.execute("DELETE FROM sessions WHERE token_hash = ?", (token_hash,))

    # Cases, written by the ingest thread

    def open_cases(self, cases: Iterable[NewCase]) -> int:
        """Open a case per decision not seen before (a re-decision of the same transaction is
        ignored); return how many were opened."""
        now = _now_ms()
        rows = [_case_row(case, now) for case in cases]
        if not rows:
            return 0
        with self._db.transaction() as db:
            return db.executemany(
                "INSERT INTO cases (transaction_id, card_id, score, decision, "
                "model_version, event_time, decided_at, reasons, rules, amount, currency, "
                "merchant_id, terminal_id, country, channel, utc_offset_minutes, expected_loss, "
                "timeline, status, opened_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?) "
                "ON CONFLICT (transaction_id) DO NOTHING",
                rows,
            )

    def add_details(self, found: Iterable[tuple[str, TransactionDetails]]) -> None:
        """Fill in the transaction's fields of cases opened before their transaction was read."""
        rows = [(*details, details.amount, transaction_id) for transaction_id, details in found]
        if not rows:
            return
        with self._db.transaction() as db:
            db.executemany(
                "UPDATE cases SET amount = ?, currency = ?, merchant_id = ?, terminal_id = ?, "
                "country = ?, channel = ?, utc_offset_minutes = ?, "
                "expected_loss = score * ? WHERE transaction_id = ? AND amount IS NULL",
                rows,
            )

    def awaiting_details(self, limit: int) -> list[str]:
        """Open cases still without their transaction's fields: the newest `limit`, oldest
        first."""
        rows = self._db.execute(
            "SELECT transaction_id FROM cases WHERE status = 'open' AND amount IS NULL "
            "ORDER BY opened_at DESC LIMIT ?",
            (limit,),
        )
        return [row["transaction_id"] for row in reversed(rows)]

    def purge_closed(self, retention_ms: int) -> int:
        """Delete the closed cases closed more than `retention_ms` ago; return how many."""
        with self._db.transaction() as db:
            cursor = db.execute(
                "DELETE FROM cases WHERE status = 'closed' AND closed_at < ?",
                (_now_ms() - retention_ms,),
            )
            return int(cursor.rowcount)

    # Cases, read and closed by the console

    def list_cases(self, status: Literal["open", "closed"], limit: int) -> list[dict[str, Any]]:
        """Open cases by expected loss (score x amount), highest first; closed ones newest
        first."""
        order = "expected_loss DESC" if status == "open" else "closed_at DESC"
        rows = self._db.execute(
            f"SELECT {', '.join(CASE_FIELDS)} FROM cases WHERE status = ? "
            f"ORDER BY {order}, transaction_id LIMIT ?",
            (status, min(limit, MAX_LISTED)),
        )
        return [_case_dict(row) for row in rows]

    def case(self, transaction_id: str) -> dict[str, Any] | None:
        """One case with its timeline: the card's earlier decisions and its other cases."""
        rows = self._db.execute(_ONE_CASE, (transaction_id,))
        if not rows:
            return None
        others = self._db.execute(
            "SELECT transaction_id, event_time, score, decision, status, fraud FROM cases "
            "WHERE card_id = ? AND transaction_id != ? ORDER BY event_time DESC LIMIT 20",
            (rows[0]["card_id"], transaction_id),
        )
        case = _case_dict(rows[0])
        case["card_cases"] = [_case_dict(other) for other in others]
        return case

    @contextmanager
    def deciding(self, transaction_id: str) -> Iterator[dict[str, Any] | None]:
        """The case (None: unknown), held against any other verdict on it until the block
        ends; `close_case` in the block commits with it."""
        with self._db.exclusive(_ONE_CASE, (transaction_id,)) as rows:
            yield _case_dict(rows[0]) if rows else None

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
        with self._db.transaction() as db:
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
        rows = self._db.execute(
            "SELECT at, actor, action, before, after FROM audit WHERE transaction_id = ? "
            "ORDER BY id",
            (transaction_id,),
        )
        return [
            {
                **row,
                "before": row["before"] and json.loads(row["before"]),
                "after": json.loads(row["after"]),
            }
            for row in rows
        ]

    def queue_state(self) -> tuple[int, int | None]:
        """How many cases are open, and when the oldest was opened (epoch ms; None: none)."""
        (row,) = self._db.execute(
            "SELECT COUNT(*) AS open_cases, MIN(opened_at) AS oldest FROM cases "
            "WHERE status = 'open'"
        )
        return int(row["open_cases"]), row["oldest"]


_ONE_CASE = f"SELECT {', '.join(CASE_FIELDS)}, timeline FROM cases WHERE transaction_id = ?"


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


def case_reason(reason: Mapping[str, Any]) -> dict[str, Any]:
    """A reason as a case keeps it and the API answers it: `{"feature", "text", "label",
    "contribution"}`, `label` the same as `text` (deprecated, as on the decisions topic; kept so
    that a console rolled back to release 0.1.0 still shows the cases stored since). A decision
    of release 0.1.0, and a case a 0.1.0 console stored, have only `label`: it is the text."""
    text = reason.get("text") or reason.get("label") or ""
    return {
        "feature": reason["feature"],
        "text": text,
        "label": text,
        "contribution": reason["contribution"],
    }


def _case_dict(row: dict[str, Any]) -> dict[str, Any]:
    case = dict(row)
    for name in _JSON_FIELDS & case.keys():
        case[name] = json.loads(case[name])
    if "reasons" in case:
        case["reasons"] = [case_reason(reason) for reason in case["reasons"]]
    if case.get("fraud") is not None:
        case["fraud"] = bool(case["fraud"])
    return case


def _now_ms() -> int:
    return int(time.time() * 1000)
