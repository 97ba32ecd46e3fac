"""The SQLite run store: the embedded default.

WAL journal with ``synchronous=FULL`` (a commit is on disk before ``commit()``
returns), ``BEGIN IMMEDIATE`` for every write (the write lock is taken up
front, so two writers never both read an old ``state_version``), and a busy
timeout so that concurrent processes wait instead of failing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import struct
import time
from pathlib import Path
from typing import Any

from ._clock import now_us
from ._errors import JournalError, JournalTooNew
from ._migrate import MigrationTarget, current_version, load_migrations, migrate
from ._store import SQLRunStore, claim_key

BUSY_TIMEOUT_S = 30.0


def _enable_wal(conn: sqlite3.Connection, timeout: float) -> None:
    # Switching a new file to WAL can report "database is locked" at once,
    # without waiting on the busy timeout, while another process opens the
    # same file; so wait here, within the same timeout.
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def connect(path: str | Path, timeout: float = BUSY_TIMEOUT_S, *, read_only: bool = False) -> sqlite3.Connection:
    """A connection with the journal's pragmas; autocommit, transactions
    explicit. ``read_only``: one that never writes, for a journal in a
    folder this process may not write (an archived data directory)."""
    try:
        if read_only:
            return _connect_read_only(Path(path), timeout)
        conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        _enable_wal(conn, timeout)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.Error as exc:
        raise JournalError(f"{path}: cannot open the journal: {exc}") from exc
    return conn


def _connect_read_only(path: Path, timeout: float) -> sqlite3.Connection:
    if not path.is_file():
        raise JournalError(f"{path}: no journal to read")
    # A WAL journal whose last writer closed it cleanly has no -wal file, and
    # a reader that may not create the -shm file beside it can open it only
    # as immutable. With a -wal file (a writer is at work, or died), the
    # committed transactions in it count: a plain read-only open reads them.
    immutable = "&immutable=1" if not Path(f"{path}-wal").exists() else ""
    uri = f"{path.absolute().as_uri()}?mode=ro{immutable}"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return conn


def _schema_as_is(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of a journal opened to read only, which must be
    the newest this version knows: it cannot be migrated."""
    try:
        version = current_version(conn)
    except sqlite3.Error as exc:
        raise JournalError(f"{path}: cannot read the journal: {exc}") from exc
    newest = max((m.version for m in load_migrations("sqlite")), default=0)
    if version != newest:
        raise JournalError(f"{path}: the journal is at schema version {version}, this loopledger reads {newest}; "
                           "open it once where it can be written, to migrate it")
    return version


class _SQLiteMigrations(MigrationTarget):
    dialect = "sqlite"

    def begin_exclusive(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def is_complete(self, sql: str) -> bool:
        return sqlite3.complete_statement(sql)


SQLITE_MIGRATIONS = _SQLiteMigrations()


def _byte_lock(fd: int, kind: int, offset: int) -> None:
    """Lock (``F_WRLCK``, without waiting) or unlock (``F_UNLCK``) one byte of
    ``fd`` at ``offset``: an open-file-description lock where the system has
    them, else a process-wide POSIX one."""
    command = getattr(fcntl, "F_OFD_SETLK", None)
    if command is None:  # not Linux: per process (two stores of a process share their claims)
        fcntl.lockf(fd, fcntl.LOCK_UN if kind == fcntl.F_UNLCK else fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
        return
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for these locks)
    fcntl.fcntl(fd, command, struct.pack("hhqqi", kind, os.SEEK_SET, offset, 1, 0))


def _byte_held(fd: int, offset: int) -> bool:
    """Whether another open file description (another store, or another
    process) holds the lock on one byte of ``fd`` at ``offset``, asked
    without taking it (``F_OFD_GETLK``, Linux)."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    return struct.unpack("hhqqi", answer)[0] != fcntl.F_UNLCK


class SQLiteRunStore(SQLRunStore):
    dialect = "sqlite"

    def __init__(self, path: str | Path, *, migrate_to: int | None = None, read_only: bool = False) -> None:
        """``read_only``: a store that reads and never writes (no migration,
        no claims), for a journal this process may not write; it must be
        at this version's schema already."""
        super().__init__()
        self.path = Path(path)
        self.read_only = read_only
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = self._connect()
        try:
            if read_only:
                self.schema_version = _schema_as_is(self._conn, self.path)
            else:
                self.schema_version = migrate(self._conn, SQLITE_MIGRATIONS, now_us(), upto=migrate_to)
        except JournalTooNew as exc:
            self._conn.close()
            raise JournalTooNew(exc.found, exc.known, str(self.path)) from None
        except Exception:
            self._conn.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, read_only=self.read_only)

    # Claims: a one-byte lock per run, at the run's key, in a file beside the
    # journal: an open-file-description lock (Linux), so two stores of one
    # process exclude each other as two processes do, and closing one store
    # does not drop another's. The kernel drops a process's locks when it
    # ends, however it ends: a killed driver leaves no claim behind.

    def _open_drivers(self) -> int:
        if self.read_only:
            raise JournalError(f"{self.path}: opened to read only; a run cannot be driven through it")
        return os.open(f"{self.path}-drivers", os.O_RDWR | os.O_CREAT, 0o644)

    def _claim_outside(self, name: str) -> bool:
        try:
            _byte_lock(self._drivers, fcntl.F_WRLCK, claim_key(name))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        return True

    def _release_outside(self, name: str) -> None:
        _byte_lock(self._drivers, fcntl.F_UNLCK, claim_key(name))

    def _held_outside(self, name: str) -> bool:
        if not hasattr(fcntl, "F_OFD_GETLK"):  # not Linux: take the claim, and let go of it
            if not self._claim_outside(name):
                return True
            self._release_outside(name)
            return False
        return _byte_held(self._drivers, claim_key(name))

    def _close_drivers(self, drivers: int) -> None:
        os.close(drivers)

    def _begin_write(self, conn: Any) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def _lock_run_sql(self) -> str:
        # BEGIN IMMEDIATE already holds the database's write lock.
        return "SELECT state, state_version, last_seq, step, attempt FROM runs WHERE run_id = ?"

    def read_connection(self) -> sqlite3.Connection:
        return connect(self.path, read_only=self.read_only)
