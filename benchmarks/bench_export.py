"""export: seconds to export 1M journal events with their artifacts to Parquet.

The journal is filled directly through SQL (the commit path has its own
benchmark): 1,000 runs of 1,000 events each, every event with a ~120-byte
payload, and one ~1 KB artifact per 4 events (250,000 artifacts). The
value is one ``Recorder.export()`` of all of it: reading the journal,
building Arrow batches, writing zstd Parquet, publishing atomically.

Baseline, same run: the same rows already in memory as Arrow tables,
written with a bare ``pyarrow.parquet.write_table`` (same compression).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from _common import quick_flag, report

from loopledger.engine import Recorder, SQLiteRunStore, arrow_schema
from loopledger.engine._recorder import COMPRESSION

EVENTS_PER_RUN = 1000


def fill(store: SQLiteRunStore, runs: int) -> None:
    conn = store._conn
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO runs (run_id, thread_id, task_id, tenant, prompt_version, model_route, state,"
        " state_version, last_seq, step, attempt, started_at, updated_at, schema_version)"
        " VALUES (?, ?, 'task', 'acme', 'v1', 'scripted', 'READY', ?, ?, 0, 0, 0, 0, 1)",
        ((f"run-{r:05d}", f"run-{r:05d}", EVENTS_PER_RUN, EVENTS_PER_RUN) for r in range(runs)),
    )
    conn.executemany("INSERT INTO run_specs (run_id, spec_json, schema_version) VALUES (?, '{}', 1)",
                     ((f"run-{r:05d}",) for r in range(runs)))
    payload = '{"detail":"' + "p" * 100 + '","n":%d}'
    conn.executemany(
        "INSERT INTO events (run_id, seq, ts, kind, from_state, to_state, step, attempt, state_version,"
        " payload_json, schema_version) VALUES (?, ?, ?, 'transition', 'READY', 'MODEL_RUNNING', ?, 1, ?, ?, 1)",
        (
            (f"run-{r:05d}", s, 1_700_000_000_000_000 + s, s // 4, s, payload % s)
            for r in range(runs)
            for s in range(1, EVENTS_PER_RUN + 1)
        ),
    )
    body = '{"body":"' + "b" * 1000 + '","n":%d}'
    conn.executemany(
        "INSERT INTO artifacts (artifact_id, kind, created_at, size_bytes, body, first_run_id, first_seq,"
        " schema_version) VALUES (?, 'candidate', 1700000000000000, ?, ?, ?, ?, 1)",
        (
            (f"{r:05d}{s:06d}".ljust(64, "0"), 1015, body % (r * EVENTS_PER_RUN + s), f"run-{r:05d}", s)
            for r in range(runs)
            for s in range(4, EVENTS_PER_RUN + 1, 4)
        ),
    )
    conn.execute("COMMIT")


def in_memory_tables(store: SQLiteRunStore) -> dict[str, object]:
    """The same rows as Arrow tables, read before timing the baseline."""
    import pyarrow as pa

    from loopledger.engine import TABLES

    tables = {}
    for name in ("runs", "events", "artifacts"):
        spec = TABLES[name]
        # The runs snapshot joins each run with its spec; the others are read whole.
        source = spec.source if name == "runs" else f"{name} t"
        sql = f"SELECT {', '.join(c.expr for c in spec.columns)} FROM {source}"
        columns = list(zip(*store._conn.execute(sql).fetchall()))
        schema = arrow_schema(name)
        arrays = [
            pa.array(col, pa.int64()).cast(schema.field(i).type) if spec.columns[i].kind == "ts"
            else pa.array(col, schema.field(i).type)
            for i, col in enumerate(columns)
        ]
        tables[name] = pa.Table.from_arrays(arrays, schema=schema)
    return tables


def main() -> None:
    import pyarrow.parquet as pq

    runs = 50 if quick_flag() else 1000
    with tempfile.TemporaryDirectory(dir=os.environ.get("LOOPLEDGER_BENCH_DIR")) as tmp:
        root = Path(tmp)
        store = SQLiteRunStore(root / "journal.sqlite")
        fill(store, runs)
        tables = in_memory_tables(store)

        start = time.perf_counter()
        result = Recorder(store, root / "traces").export()
        value = time.perf_counter() - start

        start = time.perf_counter()
        for name, table in tables.items():
            pq.write_table(table, root / f"bare-{name}.parquet", compression=COMPRESSION)
        baseline = time.perf_counter() - start
        store.close()
    n = runs * EVENTS_PER_RUN
    assert result.rows["events"] == n, result.rows
    print(f"export {value:.2f} s ({result.rows['events']} events, {result.rows['artifacts']} artifacts); "
          f"bare write_table {baseline:.2f} s")
    report("export", value=value, unit="s", baseline=baseline, goal=2.0, n=n)


if __name__ == "__main__":
    main()
