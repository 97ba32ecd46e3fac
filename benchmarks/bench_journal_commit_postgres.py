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

import hashlib
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
    """The rows the store writes for one transition (as journal_commit's
    bare side: the run row's changed columns under the compare-and-set's
    WHERE, the 11-column event, the 1 KB artifact under its sha256 id), in
    plain tables keyed as the journal's."""
    import psycopg

    bodies = ['{"body":"' + BODY + f'","i":{i}}}' for i in range(n)]
    ids = [hashlib.sha256(body.encode()).hexdigest() for body in bodies]
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT, state_version BIGINT, last_seq BIGINT,"
                 " step BIGINT, attempt BIGINT, updated_at BIGINT)")
    conn.execute("CREATE TABLE events (run_id TEXT, seq BIGINT, ts BIGINT, kind TEXT, from_state TEXT,"
                 " to_state TEXT, step BIGINT, attempt BIGINT, state_version BIGINT, payload_json TEXT,"
                 " schema_version BIGINT, PRIMARY KEY (run_id, seq))")
    conn.execute("CREATE TABLE artifacts (artifact_id TEXT PRIMARY KEY, kind TEXT, created_at BIGINT,"
                 " size_bytes BIGINT, body TEXT, first_run_id TEXT, first_seq BIGINT, schema_version BIGINT)")
    conn.execute("INSERT INTO runs VALUES ('bench', 'MODEL_RUNNING', 1, 1, 1, 1, 0)")
    start = time.perf_counter()
    for i in range(n):
        seq = i + 2
        now = time.time_ns() // 1000
        body = bodies[i]
        conn.execute("BEGIN")
        conn.execute("UPDATE runs SET state_version = %s, last_seq = %s, step = %s, attempt = %s, updated_at = %s"
                     " WHERE run_id = %s AND state_version = %s", (seq, seq, 1, seq, now, "bench", seq - 1))
        conn.execute("INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                     ("bench", seq, now, "transition", "MODEL_RUNNING", "MODEL_RUNNING", 1, seq, seq,
                      f'{{"attempt":{seq}}}', 1))
        conn.execute("INSERT INTO artifacts VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                     (ids[i], "candidate", now, len(body), body, "bench", seq, 1))
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
