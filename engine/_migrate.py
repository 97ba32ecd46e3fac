"""Versioned migrations: numbered SQL files and a version table.

``migrations/<dialect>/NNNN_name.sql`` are applied in order. Each migration
and the row that records it are one transaction, so a failed migration
leaves the version where it was, and two processes migrating at once apply
each migration exactly once (the second one sees the row and skips). The
checksum of every applied file is kept; an applied migration whose file has
since changed is an error, not something to paper over.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ._errors import JournalTooNew, MigrationError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    checksum   TEXT NOT NULL,
    applied_at INTEGER NOT NULL
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def load_migrations(dialect: str, package: str = "loopledger.engine") -> list[Migration]:
    """The dialect's migrations in version order; numbering must be 1, 2, 3, ..."""
    folder = resources.files(package).joinpath("migrations", dialect)
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(migration.version, migration.name, f"expected number {expected:04d}")
    return found


def split_statements(sql: str, is_complete: Callable[[str], bool]) -> Iterator[str]:
    """Split a script into statements with the dialect's completeness test
    (executescript would commit the surrounding transaction)."""
    buffer: list[str] = []
    for line in sql.splitlines(keepends=True):
        if not buffer and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buffer.append(line)
        statement = "".join(buffer)
        if is_complete(statement):
            yield statement.strip()
            buffer = []
    rest = "".join(buffer).strip()
    if rest:
        yield rest


class MigrationTarget:
    """What a dialect provides to run migrations on one connection."""

    dialect: str

    def create_version_table(self, conn: Any) -> None:
        conn.execute(VERSION_TABLE)

    def has_version_table(self, conn: Any) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
                            ).fetchone() is not None

    def begin_exclusive(self, conn: Any) -> None:
        raise NotImplementedError

    def is_complete(self, sql: str) -> bool:
        raise NotImplementedError

    def placeholder(self) -> str:
        return "?"


def current_version(conn: Any) -> int:
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(row[0])


def migrate(conn: Any, target: MigrationTarget, now_us: int, upto: int | None = None) -> int:
    """Apply every pending migration (up to ``upto``); return the version reached."""
    migrations = load_migrations(target.dialect)
    p = target.placeholder()
    pending = migrations
    if upto is None and target.has_version_table(conn):
        # Every migration applied already (the usual case): nothing to lock
        # or create, so a role that may only read the journal can open it.
        try:
            applied = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
        except Exception:  # noqa: BLE001 - not a version table of ours: the full path says how
            applied = {}
        if applied and all(applied.get(m.version) == m.checksum for m in migrations):
            pending = []
    if pending:
        target.create_version_table(conn)
    for migration in pending:
        if upto is not None and migration.version > upto:
            break
        target.begin_exclusive(conn)
        try:
            applied = conn.execute(
                f"SELECT checksum FROM schema_migrations WHERE version = {p}", (migration.version,)
            ).fetchone()
            if applied is not None:
                conn.execute("ROLLBACK")
                if applied[0] != migration.checksum:
                    raise MigrationError(
                        migration.version, migration.name, "applied migration's file has changed"
                    )
                continue
            for statement in split_statements(migration.sql, target.is_complete):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                f"VALUES ({p}, {p}, {p}, {p})",
                (migration.version, migration.name, migration.checksum, now_us),
            )
            conn.execute("COMMIT")
        except MigrationError:
            raise
        except Exception as exc:
            try:
                conn.execute("ROLLBACK")
            except Exception:  # the failed statement may already have ended it
                pass
            raise MigrationError(migration.version, migration.name, str(exc)) from exc
    version = current_version(conn)
    if upto is None and version > len(migrations):
        # Migrated by a newer loopledger (every migration this one knows was
        # found applied, so nothing was written): its tables may have changed
        # in ways this version would misread or damage.
        raise JournalTooNew(version, len(migrations))
    return version
