"""The two stores the console runs on, behind one small interface: SQLite (a file, the zero-setup
default, one console) and PostgreSQL (a URL, for several consoles sharing their cases).

The store's SQL (`review/cases.py`) is written once, with `?` placeholders, in what both speak
(`INSERT … ON CONFLICT`, no engine-specific functions); only the schema differs here. Rows come
back as dicts. A `Database` runs one statement or one transaction at a time (a lock around its
connection); `Database.exclusive(…)` gives a verdict a transaction of its own in which the case's
row is locked against other consoles until the label is acknowledged and the verdict written.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import redact_urls

_AUDIT_REFUSAL = "the audit log is append-only"

_TABLES = """
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL, role TEXT NOT NULL,
    created_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    token_hash TEXT PRIMARY KEY, "user" TEXT NOT NULL REFERENCES users(name) ON DELETE CASCADE,
    csrf TEXT NOT NULL, expires_at BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS cases (
    transaction_id TEXT PRIMARY KEY, card_id TEXT NOT NULL, score DOUBLE PRECISION NOT NULL,
    decision TEXT NOT NULL, model_version TEXT NOT NULL, event_time BIGINT NOT NULL,
    decided_at BIGINT NOT NULL, reasons TEXT NOT NULL, rules TEXT NOT NULL,
    amount DOUBLE PRECISION, currency TEXT, merchant_id TEXT, terminal_id TEXT, country TEXT,
    channel TEXT, utc_offset_minutes INTEGER, expected_loss DOUBLE PRECISION NOT NULL,
    timeline TEXT NOT NULL, status TEXT NOT NULL, opened_at BIGINT NOT NULL,
    fraud INTEGER, reviewer TEXT, note TEXT, closed_at BIGINT);
CREATE INDEX IF NOT EXISTS cases_queue ON cases(status, expected_loss DESC);
CREATE INDEX IF NOT EXISTS cases_age ON cases(status, opened_at);
CREATE INDEX IF NOT EXISTS cases_card ON cases(card_id, event_time);
"""

_SQLITE_AUDIT = f"""
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at BIGINT NOT NULL, actor TEXT NOT NULL,
    transaction_id TEXT NOT NULL, action TEXT NOT NULL, before TEXT, after TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, '{_AUDIT_REFUSAL}'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, '{_AUDIT_REFUSAL}'); END;
"""

_POSTGRES_AUDIT = (
    "CREATE TABLE IF NOT EXISTS audit (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
    "at BIGINT NOT NULL, actor TEXT NOT NULL, transaction_id TEXT NOT NULL, "
    "action TEXT NOT NULL, before TEXT, after TEXT NOT NULL)",
    "CREATE OR REPLACE FUNCTION fraud_review_audit_append_only() RETURNS trigger "
    f"LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{_AUDIT_REFUSAL}'; END $$",
    "DROP TRIGGER IF EXISTS audit_append_only ON audit",
    "CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit "
    "FOR EACH ROW EXECUTE FUNCTION fraud_review_audit_append_only()",
    "DROP TRIGGER IF EXISTS audit_no_truncate ON audit",
    "CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit "
    "FOR EACH STATEMENT EXECUTE FUNCTION fraud_review_audit_append_only()",
)
#: Consoles starting together create the schema one at a time (any fixed key will do).
_SCHEMA_LOCK = 4_747


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Database:
    """One connection to the console's store, used by one statement or transaction at a time."""

    #: True where `exclusive` locks a case's row in the database (several consoles).
    shared: bool = False
    _begin = "BEGIN"

    def __init__(self, connection: Any, placeholder: str) -> None:
        self._connection = connection
        self._placeholder = placeholder
        self._lock = threading.Lock()
        self._local = threading.local()
        self._verdict_lock = threading.Lock()

    def _sql(self, sql: str) -> str:
        return sql if self._placeholder == "?" else sql.replace("?", self._placeholder)

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run one statement on its own; return its rows."""
        inside = getattr(self._local, "connection", None)
        if inside is not None:
            return _rows(inside.execute(self._sql(sql), parameters))
        with self._lock:
            return _rows(self._main().execute(self._sql(sql), parameters))

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Statements that commit together, or not at all."""
        inside = getattr(self._local, "connection", None)
        if inside is not None:  # already in `exclusive`'s transaction: part of it
            yield Transaction(inside, self._sql)
            return
        with self._lock, self._in_transaction(self._main()) as transaction:
            yield transaction

    def _main(self) -> Any:
        """The shared connection (held under `_lock`)."""
        return self._connection

    @contextmanager
    def _in_transaction(self, connection: Any) -> Iterator[Transaction]:
        connection.execute(self._begin)
        try:
            yield Transaction(connection, self._sql)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    @contextmanager
    def exclusive(self, lock_sql: str, parameters: Sequence[Any]) -> Iterator[list[dict[str, Any]]]:
        """Run `lock_sql` (a SELECT of the rows to decide on) and the block in one transaction;
        other consoles wait for those rows until it ends (one console: a lock in this process)."""
        with self._verdict_lock:
            yield self.execute(lock_sql, parameters)

    def close(self) -> None:
        with self._lock:
            self._connection.close()


class Transaction:
    """The statements of one transaction."""

    def __init__(self, connection: Any, sql: Any) -> None:
        self._connection, self._sql = connection, sql

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        cursor: Cursor = self._connection.execute(self._sql(sql), parameters)
        return cursor

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run `sql` once per row; return how many rows it changed in all."""
        cursor = self._connection.cursor()
        cursor.executemany(self._sql(sql), rows)
        return int(cursor.rowcount)


class SqliteDatabase(Database):
    """A SQLite file (WAL): one console."""

    _begin = "BEGIN IMMEDIATE"

    def __init__(self, path: Path) -> None:
        try:
            connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.executescript(_TABLES + _SQLITE_AUDIT)
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"cannot open the review database {path}: {exc}; set FRAUD_REVIEW_DB to a "
                "writable file"
            ) from exc
        connection.row_factory = _sqlite_dict
        super().__init__(connection, "?")


class PostgresDatabase(Database):
    """A PostgreSQL database: consoles that share it share their cases."""

    shared = True

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg.rows import dict_row
        except ImportError as exc:
            raise ConfigurationError(
                "FRAUD_REVIEW_DB is a PostgreSQL URL, but psycopg is not installed: "
                "pip install 'fraud-scorer[review]'"
            ) from exc

        def connect() -> Any:
            return psycopg.connect(url, autocommit=True, row_factory=dict_row)

        self._connect = connect
        self._lost = psycopg.OperationalError

        try:
            connection = connect()
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in (*_statements(_TABLES), *_POSTGRES_AUDIT):
                    connection.execute(statement)
            #: Verdicts' own connection: its transaction holds a case's row while the label
            #: is produced, without holding up the ingest or the pages.
            self._verdicts = connect()
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"cannot use the review database {redact_urls(url)}: {exc}".rstrip()
            ) from exc
        super().__init__(connection, "%s")

    def _main(self) -> Any:
        # A connection the server dropped (a restart, a failover) fails the call that found it
        # out; the next call gets a new one. (The ingest stops on its failure: exit 1.)
        if self._connection.broken:
            self._connection = self._connect()
        return self._connection

    def _live_verdicts(self) -> Any:
        """The verdicts' connection, checked first: a verdict must not fail on a connection
        the server dropped while no one used it."""
        try:
            if not self._verdicts.broken:
                self._verdicts.execute("SELECT 1")
                return self._verdicts
        except self._lost:
            pass
        self._verdicts = self._connect()
        return self._verdicts

    @contextmanager
    def exclusive(self, lock_sql: str, parameters: Sequence[Any]) -> Iterator[list[dict[str, Any]]]:
        with self._verdict_lock:
            connection = self._live_verdicts()
            with self._in_transaction(connection):
                self._local.connection = connection
                try:
                    sql = self._sql(lock_sql + " FOR UPDATE")
                    yield _rows(connection.execute(sql, parameters))
                finally:
                    self._local.connection = None

    def close(self) -> None:
        super().close()
        self._verdicts.close()


def open_database(location: str) -> Database:
    """The store at `location`: a postgresql:// URL, or the path of a SQLite file."""
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(location)
    return SqliteDatabase(Path(location))


def _statements(script: str) -> list[str]:
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def _rows(cursor: Any) -> list[dict[str, Any]]:
    return list(cursor.fetchall()) if cursor.description is not None else []


def _sqlite_dict(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}
