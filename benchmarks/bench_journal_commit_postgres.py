"""journal_commit_postgres: microseconds per transition commit of the
PostgreSQL journal.

The same commit as journal_commit (one transition event, one distinct 1 KB
artifact, the compare-and-set on the run's state_version) through
``PostgresRunStore.commit``. Baseline, same run, same server, same driver:
a bare psycopg ``BEGIN``, INSERT of the event, INSERT of the same 1 KB,
UPDATE of the run row, ``COMMIT``. Both wait for the server's WAL flush
(``synchronous_commit = on``, fsync on), which is the floor.

The server: ``LOOPLEDGER_BENCH_POSTGRES`` (a URL whose user may create
databases), else one started for the run from the distribution's binaries
with durable settings (tests/postgres_kit.py), on loopback.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from _common import quick_flag, report
from bench_journal_commit import BODY, commit_loop

from loopledger.engine import PostgresRunStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import postgres_kit  # noqa: E402 - the tests' server helper, found through the line above


def bench_store(url: str, n: int) -> float:
    return commit_loop(PostgresRunStore(url), n)


def bench_bare(url: str, n: int) -> float:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, state_version BIGINT, last_seq BIGINT)")
    conn.execute("CREATE TABLE events (run_id TEXT, seq BIGINT, payload TEXT, PRIMARY KEY (run_id, seq))")
    conn.execute("CREATE TABLE artifacts (artifact_id TEXT PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO runs VALUES ('bench', 1, 1)")
    start = time.perf_counter()
    for i in range(n):
        body = '{"body":"' + BODY + f'","i":{i}}}'
        conn.execute("BEGIN")
        conn.execute("INSERT INTO events VALUES ('bench', %s, %s)", (i + 2, f'{{"attempt":{i + 2}}}'))
        conn.execute("INSERT INTO artifacts VALUES (%s, %s)", (f"a{i}", body))
        conn.execute("UPDATE runs SET state_version = %s, last_seq = %s WHERE run_id = 'bench'", (i + 2, i + 2))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / n * 1e6


def main() -> None:
    n = 300 if quick_flag() else 3000
    url = os.environ.get("LOOPLEDGER_BENCH_POSTGRES")
    server: postgres_kit.Server
    if url:
        server = postgres_kit.external_server(url)
    else:
        bin_dir = postgres_kit.find_bin_dir()
        if bin_dir is None:
            sys.exit("journal_commit_postgres: no PostgreSQL server binaries; set LOOPLEDGER_BENCH_POSTGRES")
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
