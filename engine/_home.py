"""The data directory (``--home``): where the journal and the traces live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._errors import BadInput

DEFAULT_HOME = "loopledger-data"


@dataclass(frozen=True)
class Home:
    root: Path
    store_url: str | None = None  # None: the SQLite journal inside root

    @classmethod
    def resolve(cls, home: str | os.PathLike[str] | None = None, store_url: str | None = None) -> Home:
        """``--home``, else ``$LOOPLEDGER_HOME``, else ``./loopledger-data``."""
        chosen = home or os.environ.get("LOOPLEDGER_HOME") or DEFAULT_HOME
        root = Path(chosen).expanduser()
        if root.exists() and not root.is_dir():
            raise BadInput(str(root), "--home must be a directory")
        return cls(root, store_url)

    @property
    def journal_path(self) -> Path:
        return self.root / "journal.sqlite"

    @property
    def journal_file(self) -> Path | None:
        """The journal's SQLite file (in the data directory, or named by
        ``--store sqlite:PATH``); None for a server's database."""
        if self.store_url is None:
            return self.journal_path
        if self.store_url.startswith("sqlite:"):
            return Path(self.store_url.removeprefix("sqlite:"))
        return None

    @property
    def has_journal(self) -> bool:
        """Whether there is a journal to read: commands that only look at
        runs must not create one by opening it."""
        journal = self.journal_file
        return journal.exists() if journal is not None else True  # a server's: opening it makes nothing

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def prompts(self) -> Path:
        """The data directory's own prompt versions (``NAME.md``)."""
        return self.root / "prompts"

    @property
    def replays(self) -> Path:
        return self.root / "replays"

    def describe_journal(self) -> str:
        """Where the journal is, for people (a password in the URL masked)."""
        if self.store_url is None:
            return f"SQLite journal in {self.root}"
        from ._postgres import is_postgres_url, redact

        if is_postgres_url(self.store_url):
            return f"PostgreSQL journal at {redact(self.store_url)}"
        return f"SQLite journal {self.store_url.removeprefix('sqlite:')}"

    def options(self) -> str:
        """``--home`` (and ``--store``) as a command that reaches this data
        directory would spell them (a password in the URL masked)."""
        from shlex import quote

        from ._postgres import redact

        spelled = f"--home {quote(str(self.root))}"
        if self.store_url is not None:
            spelled += f" --store {quote(redact(self.store_url))}"
        return spelled

    def open_store(self, *, to_read: bool = False):  # -> RunStore; typed loosely to keep imports light
        """Open (creating and migrating as needed) the journal. ``to_read``:
        the caller only reads; a SQLite journal this process may not write
        (an archived data directory) is then opened read-only instead of
        failing."""
        if self.store_url is None:
            if to_read and not _writable(self.journal_path):
                from ._sqlite import SQLiteRunStore

                return SQLiteRunStore(self.journal_path, read_only=True)
            self.root.mkdir(parents=True, exist_ok=True)
            return open_journal(f"sqlite:{self.journal_path}")
        return open_journal(self.store_url)


def _writable(journal: Path) -> bool:
    """Whether this process may write the journal and the folder it keeps
    its -wal and -shm files in."""
    return os.access(journal, os.W_OK) and os.access(journal.parent, os.W_OK)


def open_journal(url: str):  # -> RunStore
    """The journal a store URL names: ``sqlite:PATH`` or ``postgresql://...``
    (``postgres://`` too). Anything else is :class:`BadInput`."""
    from ._postgres import PostgresRunStore, is_postgres_url

    if not isinstance(url, str):
        raise BadInput("url", "expected a store URL string (sqlite:PATH or postgresql://...), "
                              f"got {type(url).__name__}")

    if is_postgres_url(url):
        return PostgresRunStore(url)
    if url.startswith("sqlite:"):
        from ._sqlite import SQLiteRunStore

        path = url.removeprefix("sqlite:")
        if not path.strip() or path.endswith("/"):
            raise BadInput("--store", f"{url!r} names no file; expected sqlite:PATH of the journal file")
        return SQLiteRunStore(path)
    from ._postgres import redact

    # Whatever the URL is, a password in it is not printed.
    raise BadInput("--store", f"unsupported store URL {redact(url)!r}; expected sqlite:PATH or postgresql://...")
