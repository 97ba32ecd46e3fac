"""journal_commit: microseconds per transition commit of the SQLite journal.

One commit = one transition event, one distinct 1 KB artifact and the
compare-and-set on the run's state_version, through ``SQLiteRunStore.commit``.
Baseline, same run, same pragmas (WAL, synchronous=FULL): a bare sqlite3
``BEGIN IMMEDIATE``, UPDATE of the run row, INSERT of the event, INSERT of
the artifact, COMMIT, writing the same bytes as the store (the same columns
and values, the artifact under its sha256 id) into plain tables. Both pay
the same fsync, which is the physical floor.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import quick_flag, report

from loopledger.engine import Artifact, Commit, NewRun, SQLiteRunStore, State

BODY = "x" * 1000


def commit_loop(store: Any, n: int) -> float:
    """µs per commit of ``n`` transitions, each with a distinct 1 KB
    artifact, on a new run of ``store`` (closed afterwards)."""
    side = StoreSide(store)
    try:
        return side.chunk(n)
    finally:
        side.close()


class StoreSide:
    """A run of ``store`` committed to in chunks: MODEL_RUNNING ->
    MODEL_RUNNING (the next attempt, a legal transition), each commit with
    one transition event and a distinct 1 KB artifact."""

    def __init__(self, store: Any) -> None:
        self.store = store
        store.create_run(NewRun(run_id="bench", task_id="bench", tenant="bench"))
        self.version = store.commit(Commit("bench", 1, State.MODEL_RUNNING, step=1, attempt=1)).state_version
        self.done = 0

    def chunk(self, n: int) -> float:
        """µs per commit of the next ``n`` commits."""
        store, version, first = self.store, self.version, self.done
        start = time.perf_counter()
        for i in range(first, first + n):
            version = store.commit(
                Commit("bench", version, State.MODEL_RUNNING, attempt=i + 2, payload={"attempt": i + 2},
                       artifacts=(Artifact("candidate", {"i": i, "body": BODY}),))
            ).state_version
        elapsed = time.perf_counter() - start
        self.version, self.done = version, first + n
        return elapsed / n * 1e6

    def close(self) -> None:
        self.store.close()


#: What the bare side writes per commit (``?`` placeholders): the run row's
#: changed columns under the compare-and-set's WHERE, the 11-column event,
#: the artifact.
BARE_WRITES = (
    "UPDATE runs SET state_version = ?, last_seq = ?, step = ?, attempt = ?, updated_at = ?"
    " WHERE run_id = ? AND state_version = ?",
    "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO artifacts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
)
#: The bare side's plain tables, keyed as the journal's (no secondary index,
#: no foreign key), in SQLite's words; ``{int}`` is the integer type and
#: ``{clustered}`` what makes events a table of its key.
BARE_TABLES = (
    "CREATE TABLE runs (run_id TEXT PRIMARY KEY, state TEXT, state_version {int}, last_seq {int}, step {int},"
    " attempt {int}, updated_at {int})",
    "CREATE TABLE events (run_id TEXT, seq {int}, ts {int}, kind TEXT, from_state TEXT, to_state TEXT,"
    " step {int}, attempt {int}, state_version {int}, payload_json TEXT, schema_version {int},"
    " PRIMARY KEY (run_id, seq)){clustered}",
    "CREATE TABLE artifacts (artifact_id TEXT PRIMARY KEY, kind TEXT, created_at {int}, size_bytes {int},"
    " body TEXT, first_run_id TEXT, first_seq {int}, schema_version {int})",
    "INSERT INTO runs VALUES ('bench', 'MODEL_RUNNING', 1, 1, 1, 1, 0)",
)


class BareSide:
    """Bare commits of the rows the store writes for one transition
    (:data:`BARE_WRITES`), the 1 KB artifact under its 64-hex id; ids are
    computed before the clock starts (hashing is the store's work, not the
    database's). ``conn``: a DB-API connection in autocommit mode whose
    tables :data:`BARE_TABLES` made; ``begin`` and ``placeholder`` in its
    dialect."""

    def __init__(self, conn: Any, begin: str = "BEGIN IMMEDIATE", placeholder: str = "?") -> None:
        self.conn, self.begin = conn, begin
        self.writes = tuple(sql.replace("?", placeholder) for sql in BARE_WRITES)
        self.done = 0

    @classmethod
    def sqlite(cls, path: Path) -> BareSide:
        conn = sqlite3.connect(path, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=30000"):
            conn.execute(f"PRAGMA {pragma}")
        for sql in BARE_TABLES:
            conn.execute(sql.format(int="INTEGER", clustered=" WITHOUT ROWID"))
        return cls(conn)

    def chunk(self, n: int) -> float:
        conn, first = self.conn, self.done
        update, insert_event, insert_artifact = self.writes
        bodies = ['{"body":"' + BODY + f'","i":{i}}}' for i in range(first, first + n)]
        ids = [hashlib.sha256(body.encode()).hexdigest() for body in bodies]
        start = time.perf_counter()
        for k in range(n):
            seq = first + k + 2
            now = time.time_ns() // 1000
            body = bodies[k]
            conn.execute(self.begin)
            conn.execute(update, (seq, seq, 1, seq, now, "bench", seq - 1))
            conn.execute(insert_event, ("bench", seq, now, "transition", "MODEL_RUNNING", "MODEL_RUNNING", 1, seq,
                                        seq, f'{{"attempt":{seq}}}', 1))
            conn.execute(insert_artifact, (ids[k], "candidate", now, len(body), body, "bench", seq, 1))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        self.done = first + n
        return elapsed / n * 1e6

    def close(self) -> None:
        self.conn.close()


def bench_bare(path: Path, n: int) -> float:
    """µs per bare commit (:class:`BareSide`), ``n`` of them on a new file:
    the baseline the engine benchmarks measure against."""
    side = BareSide.sqlite(path)
    try:
        return side.chunk(n)
    finally:
        side.close()


def bench_bare_minimal(path: Path, n: int) -> float:
    """The smallest commit of the same shape, for reference (not the
    baseline): a 3-column event, the artifact under a short id."""
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
    quick = quick_flag()
    rounds, n = (4, 250) if quick else (12, 500)
    with tempfile.TemporaryDirectory(dir=os.environ.get("LOOPLEDGER_BENCH_DIR")) as tmp:
        # Paired chunks, alternating which side goes first: the disk's speed
        # drifts by 20-30% over seconds, and each pair meets the same disk.
        store = StoreSide(SQLiteRunStore(Path(tmp) / "journal.sqlite"))
        bare = BareSide.sqlite(Path(tmp) / "bare.sqlite")
        store_us, bare_us = [], []
        try:
            for r in range(rounds):
                if r % 2:
                    bare_us.append(bare.chunk(n))
                    store_us.append(store.chunk(n))
                else:
                    store_us.append(store.chunk(n))
                    bare_us.append(bare.chunk(n))
        finally:
            store.close()
            bare.close()
        minimal = min(bench_bare_minimal(Path(tmp) / f"minimal{r}.sqlite", n) for r in range(2))
    value, baseline = statistics.median(store_us), statistics.median(bare_us)
    pairs = sorted(s / b for s, b in zip(store_us, bare_us))
    print(f"store commit {value:.1f} us, bare commit of the same rows {baseline:.1f} us (medians of {rounds} "
          f"paired chunks of {n}; pair ratios {pairs[0]:.2f}-{pairs[-1]:.2f}); smallest commit of this shape "
          f"{minimal:.1f} us")
    report("journal_commit", value=value, unit="us/commit", baseline=baseline, goal=1.5, n=rounds * n,
           pair_ratio_min=round(pairs[0], 4), pair_ratio_max=round(pairs[-1], 4),
           minimal_commit_us=round(minimal, 1), ratio_to_minimal=round(value / minimal, 4))


if __name__ == "__main__":
    main()
