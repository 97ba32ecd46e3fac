"""The PostgreSQL run store: one journal for many processes and machines.

``--store postgresql://user@host/db`` puts the journal in a PostgreSQL
database; everything else (the traces and replays under ``--home``) stays
where it is. The SQL is the shared store's (``SQLRunStore``); this module
supplies the dialect's hooks:

* **Writes** are ``READ COMMITTED`` transactions. A commit's compare-and-set
  is the ``UPDATE runs ... WHERE state_version = expected``: PostgreSQL
  re-checks the condition against the newest row version when another
  transaction moved the run meanwhile, so exactly one of two racing commits
  wins, and the loser finds nothing updated and reads the run under
  ``SELECT ... FOR UPDATE`` for its precise refusal. The run row's lock,
  held to the end of the transaction, is what keeps ``seq`` contiguous.
  Two transactions storing the same new artifacts in different orders can
  deadlock on the artifacts' unique key; the server aborts one, and the
  store does that transaction again from the start (``_is_transient``).
* **Durability** is the server's: with its default ``synchronous_commit =
  on``, ``COMMIT`` returns once the commit is flushed to the server's WAL.
* **Reads** for an export run on a connection of their own, in one
  ``REPEATABLE READ`` transaction (one snapshot for every table), through a
  server-side cursor so a large export streams instead of arriving whole.
  Identity numbers are handed out before their transactions commit, so the
  recorder never exports by a range of them where a writer could still be
  behind: artifacts go by their run's seq ranges, and a snapshot is taken
  only while no label is being written (an advisory lock).
* **Migrations** (``migrations/postgresql``, numbered like SQLite's) take a
  transaction-scoped advisory lock, so processes that open a new database
  at once apply each migration exactly once.

psycopg (``pip install 'loopledger[postgres]'``) is imported only when such
a store is opened.
"""

from __future__ import annotations

import os
import re
import sqlite3
from typing import Any

from ._clock import now_us
from ._errors import BadInput, JournalError, JournalTooNew
from ._migrate import VERSION_TABLE, MigrationTarget, migrate
from ._store import SQLRunStore, claim_key

#: Key of the advisory lock that serialises migrations (any fixed number).
MIGRATION_LOCK = 7_400_000_001
#: Key of the advisory lock held (shared) by every transaction that adds a
#: label, and taken (exclusive) by an export while its snapshot is made.
LABELS_LOCK = 7_400_000_002
URL_PREFIXES = ("postgresql://", "postgres://")
#: A URL in a message (any scheme: a mistyped one is quoted back too),
#: from its scheme to the next space or quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
#: A ``password=`` parameter of a URL's query.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*")
#: A ``password=`` among ``key=value`` connection settings.
_SETTING_PASSWORD = re.compile(r"((?:^|\s)password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")
#: Connection settings a URL does not give: a dead server or network is
#: found out in seconds instead of hanging a commit for ever.
CONNECT_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                    "keepalives_interval": "10", "keepalives_count": "3"}


def is_postgres_url(url: str) -> bool:
    return url.startswith(URL_PREFIXES)


def redact(text: str, url: str | None = None) -> str:
    """``text`` (a URL, or a message that quotes one) with every password
    in it replaced by ``***``: in a URL, all from the user's ``:`` to the
    authority's last ``@`` (a password may hold an unencoded ``@``, ``/``
    or ``?``), and ``password=`` values; never a bare substring elsewhere
    (a short password would mask parts of words, and say what it is).
    ``url``: the URL the message is about, masked where it is quoted whole."""
    if url is not None and url in text:
        text = text.replace(url, _redact_url(url))
    text = _URL.sub(lambda m: _redact_url(m.group(0)), text)
    return _SETTING_PASSWORD.sub(lambda m: m.group(1) + "***", text)


def _redact_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    secret = _url_password(url)
    if secret:
        user_end = rest.find(":")
        rest = f"{rest[:user_end]}:***{rest[user_end + 1 + len(secret):]}"
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + "***", f"{scheme}://{rest}")


def _url_password(url: str) -> str:
    """The password of a URL's user part as written: from the user's ``:``
    to the authority's last ``@`` ("" without one)."""
    rest = url.partition("://")[2]
    at = rest.rfind("@")
    user_end = rest.find(":", 0, at) if at >= 0 else -1
    if user_end < 0 or {"/", "@"} & set(rest[:user_end]):
        return ""
    return rest[user_end + 1:at]


def _quotes_a_piece_of(text: str, url: str) -> bool:
    """Whether ``text`` holds a piece of the URL's password (libpq, reading
    a password with an unencoded ``/`` or ``?``, takes part of it for the
    port, the host or the database, and says so)."""
    secret = _url_password(url)
    return bool(secret) and any(piece in text for piece in re.split(r"[/@?:#]", secret) if len(piece) >= 2)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise JournalError("a postgresql:// store needs psycopg: pip install 'loopledger[postgres]'") from None
    return psycopg


def connect(url: str) -> Any:
    """An autocommit connection (transactions are begun explicitly)."""
    psycopg = _psycopg()
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:  # not a URL libpq can read: the input, not the server
        # libpq's message may quote a piece of a password it could not place.
        why = redact(" ".join(str(exc).split()), url)
        if _quotes_a_piece_of(why, url):
            why = "libpq cannot read it"
        raise BadInput("--store", f"{redact(url)}: {why}; expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
                                  "(special characters percent-encoded)") from None
    if "@" in str(given.get("host") or ""):
        # libpq ends the password at its first "@" and reads the rest as the
        # host: a connection failure naming a piece of the password.
        raise BadInput("--store", f"{redact(url)}: the password holds an unencoded '@'; expected "
                                  "postgresql://USER:PASSWORD@HOST:PORT/DATABASE with '@' in the password "
                                  "written %40 (special characters percent-encoded)")
    _check_settings(url, given)
    if not given.get("dbname") and not os.environ.get("PGDATABASE"):
        # libpq would pick a database named after the user (often the
        # server's maintenance database) and the journal's tables would
        # be made there.
        raise BadInput("--store", f"{redact(url)} names no database; expected postgresql://HOST/DATABASE")
    defaults = {key: value for key, value in CONNECT_DEFAULTS.items() if key not in given}
    try:
        return psycopg.connect(url, autocommit=True, **defaults)
    except psycopg.Error as exc:
        # libpq's lines are sentences of their own ("... refused" / "Is the
        # server running ..."): joined on one line, each keeps its end.
        lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
        reason = redact("; ".join(lines), url)
        if _quotes_a_piece_of(reason, url):
            reason = "the server refused or could not be reached (its message quotes part of the password)"
        raise JournalError(f"{redact(url)}: cannot open the journal: {reason}") from exc


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_WHOLE = re.compile(r"^\d+\Z")


def _check_settings(url: str, given: dict[str, Any]) -> None:
    """Settings libpq would only refuse when connecting (and then as if the
    server had failed): bad input, named."""
    ports = str(given.get("port", "")).split(",") if given.get("port") else []
    if any(not _WHOLE.match(port) or not 1 <= int(port) <= 65535 for port in ports):
        # A password holding "/" makes libpq read part of it as the port:
        # that value is not repeated.
        shown = "" if _quotes_a_piece_of(str(given["port"]), url) else f" {given['port']!r}"
        raise BadInput("--store", f"{redact(url)}: port{shown}; expected a whole number from 1 to 65535 (a "
                                  "password's special characters percent-encoded)")
    if "connect_timeout" in given and not _WHOLE.match(str(given["connect_timeout"])):
        raise BadInput("--store", f"{redact(url)}: connect_timeout {given['connect_timeout']!r}; "
                                  "expected whole seconds")
    if "sslmode" in given and given["sslmode"] not in _SSLMODES:
        raise BadInput("--store", f"{redact(url)}: sslmode {given['sslmode']!r}; expected one of "
                                  f"{', '.join(_SSLMODES)}")


class _PostgresMigrations(MigrationTarget):
    dialect = "postgresql"

    def create_version_table(self, conn: Any) -> None:
        # CREATE TABLE IF NOT EXISTS is not safe against itself in
        # PostgreSQL: two sessions can both decide to create. Hence the lock.
        self.begin_exclusive(conn)
        try:
            conn.execute(VERSION_TABLE.replace("INTEGER", "BIGINT"))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def has_version_table(self, conn: Any) -> bool:
        return conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()[0]

    def begin_exclusive(self, conn: Any) -> None:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def is_complete(self, sql: str) -> bool:
        # The migrations are plain statements ended by ';' (no function
        # bodies), which SQLite's tokenizer delimits the same way.
        return sqlite3.complete_statement(sql)

    def placeholder(self) -> str:
        return "%s"


POSTGRES_MIGRATIONS = _PostgresMigrations()


class PostgresRunStore(SQLRunStore):
    dialect = "postgresql"
    #: The export's ranges; PostgreSQL plans the join itself. Sorted by
    #: code point ("C"), as SQLite sorts, whatever the database's collation:
    #: the Parquet rows come out in the same order from either journal.
    ranges_table_sql = ("CREATE TEMP TABLE IF NOT EXISTS _export_ranges"
                        ' (run_id TEXT COLLATE "C" PRIMARY KEY, lo BIGINT NOT NULL, hi BIGINT NOT NULL)')
    driving_join = "JOIN"

    def __init__(self, url: str, *, migrate_to: int | None = None) -> None:
        super().__init__()
        self.url = url
        self._conn = self._connect()
        try:
            self.schema_version = migrate(self._conn, POSTGRES_MIGRATIONS, now_us(), upto=migrate_to)
        except JournalTooNew as exc:
            self._conn.close()
            raise JournalTooNew(exc.found, exc.known, redact(self.url)) from None
        except Exception:
            self._conn.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresRunStore({redact(self.url)!r})"

    def _connect(self) -> Any:
        return connect(self.url)

    def _begin_write(self, conn: Any) -> None:
        conn.execute("BEGIN")

    def _begin_read(self, conn: Any) -> None:
        # Label ids are handed out when a row is inserted, not when its
        # transaction commits: a snapshot taken while a label is being
        # written could see a higher id committed and miss a lower one
        # still open, and the export's id range would pass over it for good.
        # So the snapshot is taken while no label transaction is open.
        conn.execute("SELECT pg_advisory_lock(%s)", (LABELS_LOCK,))
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT 1")  # the transaction's snapshot is taken here
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LABELS_LOCK,))

    def _writing_labels(self, conn: Any) -> None:
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (LABELS_LOCK,))

    def _lock_run_sql(self) -> str:
        return "SELECT state, state_version, last_seq, step, attempt FROM runs WHERE run_id = ? FOR UPDATE"

    def _is_transient(self, exc: BaseException) -> bool:
        errors = _psycopg().errors
        return isinstance(exc, (errors.DeadlockDetected, errors.SerializationFailure))

    def _sql(self, statement: str) -> str:
        return statement.replace("%", "%%").replace("?", "%s")

    def _stream(self, conn: Any, statement: str, params: Any = ()) -> Any:
        cursor = conn.cursor(name="loopledger_export")
        cursor.itersize = 20_000
        cursor.execute(self._sql(statement), params)
        return cursor

    def read_connection(self) -> Any:
        return self._connect()

    # Claims: a session advisory lock per run, on a connection of their own
    # (a lock belongs to its session, and the commits' connection is shared).
    # The server drops a session's locks when it ends: a dead driver's too.

    def _open_drivers(self) -> Any:
        conn = self._connect()
        # The claims last as long as this session: a server that ends idle
        # sessions would drop them while their runs are driven.
        for setting in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
            try:
                conn.execute(f"SET {setting} = 0")
            except _psycopg().Error:
                pass  # a server without the setting (idle_session_timeout came with PostgreSQL 14)
        return conn

    def _claim_number(self) -> int | None:
        # A transaction id: the server hands them out in order, so the
        # claim taken after another was lost always gets a higher one.
        (number,) = self._drivers.execute("SELECT txid_current()").fetchone()
        return int(number)

    def _claims_alive(self) -> bool:
        try:
            self._drivers.execute("SELECT 1")
        except _psycopg().Error:
            return False
        return True

    def _claim_outside(self, name: str) -> bool:
        (taken,) = self._drivers.execute("SELECT pg_try_advisory_lock(%s)", (claim_key(name),)).fetchone()
        return bool(taken)

    def _release_outside(self, name: str) -> None:
        try:
            self._drivers.execute("SELECT pg_advisory_unlock(%s)", (claim_key(name),))
        except _psycopg().Error:
            # The session is gone, and its locks with it: nothing to let go
            # of (and the error that brought the driver here is the one to tell).
            if not self._drivers.closed:
                raise

    def _held_outside(self, name: str) -> bool:
        # A bigint advisory lock shows in pg_locks as its high and low 32
        # bits (classid, objid) with objsubid 1.
        key = claim_key(name)
        (held,) = self._drivers.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1 AND pid <> pg_backend_pid())",
            (key >> 32, key & 0xFFFFFFFF)).fetchone()
        return bool(held)

    def _close_drivers(self, drivers: Any) -> None:
        drivers.close()
