"""A real PostgreSQL server for the tests, started from the distribution's
binaries (``make test`` installs them) in a temporary folder, on loopback.

``LOOPLEDGER_TEST_POSTGRES=postgresql://...`` points the tests at a server
of your own instead (its user must be allowed to create databases). Each
test gets a database of its own (``Server.new_database``).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

#: Settings of a durable server (the defaults: fsync, synchronous commit) on loopback.
DURABLE_SETTINGS = {"listen_addresses": "127.0.0.1", "max_connections": "200"}
#: Settings for a throwaway test server: no fsync (the tests kill clients,
#: never the server), room for the concurrency tests' connections.
TEST_SETTINGS = {**DURABLE_SETTINGS, "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def find_bin_dir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's layout."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


#: A server's folder: ``loopledger-pg-<pid of the process that made it>-...``.
FOLDER_PREFIX = "loopledger-pg-"


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie that nobody reaped is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def sweep_orphans(bin_dir: Path) -> list[Path]:
    """Stop and remove the servers that processes which are gone left
    behind (a test run killed before its teardown); returns their folders."""
    swept = []
    for folder in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        owner = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)):
            continue
        data = folder / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run([*_as_postgres(), str(bin_dir / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate",
                            "-w"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(folder)
    return swept


def _as_postgres() -> list[str]:
    """The prefix that runs a server binary as ``postgres`` when we are root
    (the server refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A server and the URL of its maintenance database."""

    def __init__(self, admin_url: str, base_url: str) -> None:
        self.admin_url = admin_url
        self._base = base_url  # without the database name
        self._names = itertools.count(1)
        self._prefix = f"t{os.getpid()}_"

    def new_database(self, options: str = "") -> str:
        """A new empty database (``options``: more of CREATE DATABASE); returns its URL."""
        import psycopg

        name = f"{self._prefix}{next(self._names):04d}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" {options}')
        return f"{self._base}/{name}"

    def stop(self) -> None:
        pass


class LocalServer(Server):
    """A cluster of our own: ``initdb`` into a temporary folder, then
    ``pg_ctl start`` on a free loopback port. As root, both run as the
    ``postgres`` user (the server refuses to run as root). Servers left
    behind by killed test runs are swept first (:func:`sweep_orphans`)."""

    def __init__(self, bin_dir: Path, settings: dict[str, str] | None = None) -> None:
        self.bin_dir = bin_dir
        self.settings = TEST_SETTINGS if settings is None else settings
        sweep_orphans(bin_dir)
        self.root = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_user = _as_postgres()
        if self._as_user:
            shutil.chown(self.root, "postgres")
        base = f"postgresql://postgres@127.0.0.1:{self.port}"
        super().__init__(f"{base}/postgres", base)

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr or done.stdout}\n{tail}")

    def start(self) -> LocalServer:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        options = " ".join(f"-c {key}={value}" for key, value in self.settings.items())
        options += f" -p {self.port} -k {self.root}"
        self._run(str(self.bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                  "-l", str(self.root / "server.log"), "-o", options)
        return self

    def stop(self) -> None:
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def external_server(url: str) -> Server:
    base, _, _database = url.rpartition("/")
    return Server(url, base)
