"""journal_commit_postgres: microseconds per transition commit of the
PostgreSQL journal.

The same commit as journal_commit (one transition event, one distinct 1 KB
artifact, the compare-and-set on the run's state_version) through
``PostgresRunStore.commit``. Baseline, same run, same server, same driver:
a bare psycopg ``BEGIN``, UPDATE of the run row, INSERT of the event,
INSERT of the artifact, ``COMMIT``, writing the same rows as the store (see
``bench_journal_commit.BareSide``). Both wait for the server's WAL flush
(``synchronous_commit = on``, fsync on), which is the floor.

The server: ``LOOPLEDGER_BENCH_POSTGRES`` (a URL whose user may create
databases), else one started for the run from the distribution's binaries
with durable settings (tests/postgres_kit.py), on loopback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import quick_flag, report
from bench_journal_commit import BARE_TABLES, BareSide, commit_loop

from loopledger.engine import PostgresRunStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import postgres_kit  # noqa: E402 - the tests' server helper, found through the line above


def bench_store(url: str, n: int) -> float:
    return commit_loop(PostgresRunStore(url), n)


def bench_bare(url: str, n: int) -> float:
    """The rows the store writes for one transition, as journal_commit's
    bare side writes them (``bench_journal_commit.BareSide``), in plain
    tables keyed as the journal's."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    for sql in BARE_TABLES:
        conn.execute(sql.format(int="BIGINT", clustered=""))
    side = BareSide(conn, begin="BEGIN", placeholder="%s")
    try:
        return side.chunk(n)
    finally:
        side.close()


def main() -> None:
    n = 300 if quick_flag() else 3000
    try:
        import psycopg  # noqa: F401
    except ImportError:
        # Reported, not failed, as the other benchmarks' missing prerequisites.
        report("journal_commit_postgres", value=None, unit="us/commit", baseline=None, goal=1.5, n=0,
               missing="psycopg: pip install -e '.[postgres]' (make test installs it)")
        return
    url = os.environ.get("LOOPLEDGER_BENCH_POSTGRES")
    server: postgres_kit.Server
    if url:
        server = postgres_kit.external_server(url)
    else:
        bin_dir = postgres_kit.find_bin_dir()
        if bin_dir is None:
            report("journal_commit_postgres", value=None, unit="us/commit", baseline=None, goal=1.5, n=0,
                   missing="PostgreSQL server binaries: install them, or set LOOPLEDGER_BENCH_POSTGRES")
            return
        server = postgres_kit.LocalServer(bin_dir, postgres_kit.DURABLE_SETTINGS).start()
    try:
        store_us, bare_us = [], []
        for _ in range(3):  # interleaved, best round kept
            store_us.append(bench_store(server.new_database(), n))
            bare_us.append(bench_bare(server.new_database(), n))
    finally:
        server.stop()
    value, baseline = min(store_us), min(bare_us)
    print(f"store commit {value:.1f} us, bare commit {baseline:.1f} us")
    report("journal_commit_postgres", value=value, unit="us/commit", baseline=baseline, goal=1.5, n=n)


if __name__ == "__main__":
    main()
