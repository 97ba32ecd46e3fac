"""journal_commit: microseconds per transition commit of the SQLite journal.

One commit = one transition event, one distinct 1 KB artifact and the
compare-and-set on the run's state_version, through ``SQLiteRunStore.commit``.
Baseline, same run, same pragmas (WAL, synchronous=FULL): a bare sqlite3
``BEGIN IMMEDIATE``, INSERT of the event, INSERT of the same 1 KB, UPDATE of
the run row, COMMIT. Both pay the same fsync, which is the physical floor.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import quick_flag, report

from loopledger.engine import Artifact, Commit, NewRun, SQLiteRunStore, State

BODY = "x" * 1000


def bench_store(path: Path, n: int) -> float:
    return commit_loop(SQLiteRunStore(path), n)


def commit_loop(store: Any, n: int) -> float:
    """µs per commit of ``n`` transitions, each with a distinct 1 KB
    artifact, on a new run of ``store`` (closed afterwards)."""
    store.create_run(NewRun(run_id="bench", task_id="bench", tenant="bench"))
    version = store.commit(Commit("bench", 1, State.MODEL_RUNNING, step=1, attempt=1)).state_version
    start = time.perf_counter()
    for i in range(n):
        # MODEL_RUNNING -> MODEL_RUNNING: the next attempt, a legal transition.
        result = store.commit(
            Commit(
                "bench",
                version,
                State.MODEL_RUNNING,
                attempt=i + 2,
                payload={"attempt": i + 2},
                artifacts=(Artifact("candidate", {"i": i, "body": BODY}),),
            )
        )
        version = result.state_version
    elapsed = time.perf_counter() - start
    store.close()
    return elapsed / n * 1e6


def bench_bare(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=30000"):
        conn.execute(f"PRAGMA {pragma}")
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, state_version INTEGER, last_seq INTEGER)")
    conn.execute("CREATE TABLE events (run_id TEXT, seq INTEGER, payload TEXT, PRIMARY KEY (run_id, seq))")
    conn.execute("CREATE TABLE artifacts (artifact_id TEXT PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO runs VALUES ('bench', 1, 1)")
    start = time.perf_counter()
    for i in range(n):
        body = '{"body":"' + BODY + f'","i":{i}}}'
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO events VALUES ('bench', ?, ?)", (i + 2, f'{{"attempt":{i + 2}}}'))
        conn.execute("INSERT INTO artifacts VALUES (?, ?)", (f"a{i}", body))
        conn.execute("UPDATE runs SET state_version = ?, last_seq = ? WHERE run_id = 'bench'", (i + 2, i + 2))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / n * 1e6


def main() -> None:
    n = 500 if quick_flag() else 5000
    with tempfile.TemporaryDirectory(dir=os.environ.get("LOOPLEDGER_BENCH_DIR")) as tmp:
        # Interleave the two so that disk noise hits both alike; keep the best round.
        store_us, bare_us = [], []
        for round_ in range(3):
            store_us.append(bench_store(Path(tmp) / f"journal{round_}.sqlite", n))
            bare_us.append(bench_bare(Path(tmp) / f"bare{round_}.sqlite", n))
        value, baseline = min(store_us), min(bare_us)
    print(f"store commit {value:.1f} us, bare commit {baseline:.1f} us")
    report("journal_commit", value=value, unit="us/commit", baseline=baseline, goal=1.5, n=n)


if __name__ == "__main__":
    main()
