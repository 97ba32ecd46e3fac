"""Reading a trace directory: checking it, and cutting it into partitions.

A trace directory (``<home>/traces``) holds one folder of Parquet files per
table. Before anything is computed, :func:`open_traces` checks every file a
replay reads: the tables exist, each file's footer is readable Parquet, the
columns the replay needs are there, and no row was written by a newer
schema than this code understands. Problems are one :class:`TracesError`
naming the file (or table) and what was expected.

Why partitions: a run's facts are spread over tables written in different
orders (events by run, artifacts by creation time), and the artifacts of a
run are looked up by content id (a context shared by two runs is stored
once). One DuckDB pass joins and hashes every row to a partition by run
(``hash(run_id) % parts``) and writes each partition's rows to its own
small files; DuckDB streams and spills, so memory stays bounded whatever
the trace size. Each partition then fits in a worker's memory and is
replayed independently, because every decision reads only its own run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopledger._parquet import first_unreadable, one_line, repair_hint

from ._errors import TracesError
from ._labels import SOURCES

#: Columns a replay reads, per table (CONTRACT.md names). Each table is
#: required: ``run``, ``export`` and ``import`` write every one (at least an
#: empty file), so a missing ``labels`` is a lost table, not "no labels" (its
#: regressions would pass as changes).
REQUIRED: dict[str, tuple[str, ...]] = {
    "runs": ("run_id", "task_id", "tenant", "prompt_version", "model_route", "status", "reason"),
    "events": ("run_id", "seq", "kind", "to_state", "step", "attempt", "payload_json"),
    "artifacts": ("artifact_id", "kind", "body"),
    "candidates": ("run_id", "step", "attempt", "candidate_id", "context_artifact_id"),
    "validations": ("run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                    "suite_version", "verdict", "code"),
    "labels": ("run_id", "step", "attempt", "candidate_id", "validator", "expected_verdict", "source", "note"),
}
#: Required columns holding whole numbers; every other required column holds text.
INTEGER_COLUMNS = frozenset({"seq", "step", "attempt"})
#: Required columns that hold a value in every row: what names a run, an
#: event, a candidate or a decision (a label's ``candidate_id`` and
#: ``validator`` may be empty: the step's candidate, the candidate as a whole).
NOT_NULL: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "events": ("run_id", "seq", "kind"),
    "artifacts": ("artifact_id", "kind"),
    "candidates": ("run_id", "step", "attempt", "candidate_id"),
    "validations": ("run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                    "suite_version", "code"),
    "labels": ("run_id", "step", "attempt"),
}
NOT_NULL["decisions"] = NOT_NULL["validations"]
#: Columns holding a verdict, with the values they may take.
VERDICT_COLUMNS = {"validations": "verdict", "decisions": "verdict", "labels": "expected_verdict"}
VERDICTS = ("accept", "repair", "ask", "reject")
#: The columns of a replay's ``decisions`` table read back as a baseline.
BASELINE_COLUMNS = REQUIRED["validations"]


def schema_version() -> int:
    from loopledger.engine import SCHEMA_VERSION

    return SCHEMA_VERSION


@dataclass(frozen=True)
class TableFiles:
    name: str
    files: tuple[Path, ...]
    columns: frozenset[str]
    rows: int


@dataclass(frozen=True)
class TraceSet:
    """A checked trace directory: the files of each table a replay reads."""

    root: Path
    tables: dict[str, TableFiles]

    @property
    def candidates(self) -> int:
        return self.tables["candidates"].rows


def table_files(folder: Path, name: str, required: Sequence[str], versioned: bool = True) -> TableFiles:
    """Check every Parquet file of one table by its footer (cheap: no data
    pages are read) and return them."""
    import pyarrow.parquet as pq

    if not folder.is_dir():
        raise TracesError(str(folder), f"missing table {name!r}: expected a folder of Parquet files")
    files = tuple(sorted(p for p in folder.rglob("*.parquet") if p.is_file()))
    if not files:
        raise TracesError(str(folder), f"missing table {name!r}: the folder holds no *.parquet file")
    columns: frozenset[str] | None = None
    rows = 0
    newest = schema_version()
    uncounted: list[Path] = []
    for path in files:
        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a broken file
            raise _unreadable(path, one_line(exc)) from None
        arrow = meta.schema.to_arrow_schema()
        names = frozenset(arrow.names)  # top-level: a struct's fields are not the table's columns
        missing = [c for c in required if c not in names]
        if missing:
            raise TracesError(str(path), f"table {name!r} lacks column(s) {', '.join(missing)}")
        _check_types(path, name, arrow, required)
        _check_schema_version(path, meta, arrow.names, newest, versioned)
        if not _nulls_counted(path, name, meta):
            uncounted.append(path)
        columns = names if columns is None else columns & names
        rows += meta.num_rows
    _check_not_null(name, uncounted)
    return TableFiles(name, files, columns or frozenset(), rows)


def _unreadable(path: Path, why: str) -> TracesError:
    """A trace file that is not readable Parquet, with how to write it again."""
    return TracesError(str(path), f"not a readable Parquet file ({why}){repair_hint(path)}")


def _read_failed(files: Sequence[Path], where: Path, what: str, exc: Exception) -> TracesError:
    """A DuckDB read of ``files`` failed: the file whose footer read but
    whose pages do not (DuckDB does not always say which), else the read
    itself, at ``where``."""
    culprit = first_unreadable(files)
    if culprit is not None:
        return _unreadable(*culprit)
    return TracesError(str(where), f"cannot read {what} ({one_line(exc)})")


def _null_in(path: Path, table: str, column: str, n: int) -> TracesError:
    return TracesError(str(path), f"table {table!r}: column {column!r} is empty (null) in {n} row(s); "
                                  "expected a value in every row")


def _nulls_counted(path: Path, table: str, meta: Any) -> bool:
    """No row of the file leaves a :data:`NOT_NULL` column empty, by each
    row group's null count (no data is read). False: the writer kept no
    count somewhere; :func:`_check_not_null` reads the columns instead."""
    for column in NOT_NULL.get(table, ()):
        index = _leaf(meta, column)
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(index).statistics
            if stats is None or not stats.has_null_count:
                return False
            if stats.null_count:
                raise _null_in(path, table, column, stats.null_count)
    return True


def _check_not_null(table: str, files: Sequence[Path]) -> None:
    """:func:`_nulls_counted` for files without null counts, by a scan."""
    if not files:
        return
    columns = NOT_NULL[table]
    nulls = ", ".join(f"count(*) - count({c})" for c in columns)
    listed = ", ".join(_quoted(p) for p in files)
    for path, *counts in _scan(f"SELECT filename, {nulls} FROM read_parquet([{listed}], union_by_name = true, "
                               "filename = true) GROUP BY filename ORDER BY filename", files):
        for column, n in zip(columns, counts):
            if n:
                raise _null_in(Path(path), table, column, n)


def _leaf(meta: Any, column: str) -> int:
    """The Parquet column index of the top-level column ``column`` (a field
    of the same name inside a struct of another column is not it)."""
    return next(i for i in range(meta.num_columns) if meta.schema.column(i).path == column)


def _scan(sql: str, files: Sequence[Path]) -> list[tuple[Any, ...]]:
    """The rows of a query over ``files``; a file whose pages cannot be
    read (its footer could) is named, with how to write it again."""
    import duckdb

    try:
        return duckdb.sql(sql).fetchall()
    except duckdb.Error as exc:
        raise _read_failed(files, files[0].parent, "the table", exc) from None


def _check_types(path: Path, table: str, schema: Any, required: Sequence[str]) -> None:
    """Each required column holds whole numbers or text, as the table's
    writer made it (a column that is null throughout may have no type)."""
    import pyarrow as pa

    for column in required:
        kind = schema.field(column).type
        if pa.types.is_dictionary(kind):  # categorical text, as pandas, polars and pyarrow may write it
            kind = kind.value_type
        if pa.types.is_null(kind):
            continue
        if column in INTEGER_COLUMNS:
            ok, expected = pa.types.is_integer(kind), "whole numbers"
        else:
            ok = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            expected = "text"
        if not ok:
            raise TracesError(str(path), f"table {table!r}: column {column!r} is {kind}; expected {expected}")


def check_verdicts(table: str, files: Sequence[Path]) -> None:
    """Every verdict in ``files`` is one the validators give: a baseline or
    a label with another value would be compared as if it meant something;
    and every label's source is one that ranks its word."""
    if not files:
        return
    _check_values(table, files, VERDICT_COLUMNS[table], VERDICTS)
    if table == "labels":
        _check_values(table, files, "source", SOURCES)


def _check_values(table: str, files: Sequence[Path], column: str, allowed: Sequence[str]) -> None:
    listed = ", ".join(f"'{v}'" for v in allowed)
    rows = _scan(f"SELECT filename, {column} FROM read_parquet([{', '.join(_quoted(p) for p in files)}], "
                 f"union_by_name = true, filename = true) WHERE {column} IS NULL OR {column} NOT IN ({listed}) LIMIT 1",
                 files)
    if rows:
        path, value = rows[0]
        raise TracesError(str(path), f"table {table!r}: {column} {value!r}; expected one of {', '.join(allowed)}")


def _quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _check_schema_version(path: Path, meta: Any, names: Sequence[str], newest: int, required: bool) -> None:
    """Every ``schema_version`` of a file (from its row-group statistics)
    is a version this build reads: a whole number from 1 to ``newest``,
    never missing. A trace table (``required``) has the column: every row
    the recorder writes carries one; a replay's tables read back as a
    baseline have none."""
    if "schema_version" not in names:  # top-level columns
        if required:
            raise TracesError(str(path), f"no column 'schema_version'; expected one, 1 to {newest} in every row "
                                         "(the recorder writes it)")
        return
    index = _leaf(meta, "schema_version")
    if meta.schema.column(index).physical_type not in ("INT32", "INT64"):
        raise TracesError(str(path), "column 'schema_version' holds no whole numbers; expected 1 to "
                                     f"{newest}")
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None:
            continue
        if stats.has_null_count and stats.null_count:
            raise TracesError(str(path), f"schema_version missing in {stats.null_count} row(s); expected 1 to "
                                         f"{newest}")
        if stats.has_min_max and int(stats.max) > newest:
            raise TracesError(str(path), f"schema_version {int(stats.max)}; this loopledger reads up to {newest}")
        if stats.has_min_max and int(stats.min) < 1:
            raise TracesError(str(path), f"schema_version {int(stats.min)}; expected 1 to {newest}")


def open_traces(root: str | Path, *, need_validations: bool = True) -> TraceSet:
    root = Path(root)
    if not root.is_dir():
        what = "not a directory" if root.exists() else "no such trace directory"
        raise TracesError(str(root), f"{what} (expected <home>/traces, written by `loopledger run`)")
    tables = {}
    for name, required in REQUIRED.items():
        if name == "validations" and not need_validations:
            continue
        tables[name] = table_files(root / name, name, required)
    return TraceSet(root, tables)


# --- partitions -----------------------------------------------------------------


def _files_sql(files: Iterable[Path]) -> str:
    listed = ", ".join(_quoted(p) for p in files)
    return f"read_parquet([{listed}], union_by_name = true)"


def _connect(tmp: Path, threads: int, memory: str) -> Any:
    import duckdb

    # No progress bar: DuckDB draws one on stderr for a long query when it
    # takes the caller for an interactive session; the replay reports its own.
    conn = duckdb.connect(config={"threads": threads, "memory_limit": memory,
                                  "temp_directory": str(tmp / "spill"), "preserve_insertion_order": False})
    conn.execute("SET enable_progress_bar = false")
    return conn


def write_partitions(traces: TraceSet, baseline_files: Sequence[Path] | None, out: Path, parts: int,
                     *, threads: int = 2, memory: str = "1GB") -> None:
    """Write each relation a worker needs, hashed by run into ``parts``
    partitions: ``out/<relation>/part=<k>/*.parquet``.

    ``baseline_files``: the decisions to compare with (the ``validations``
    table, or an earlier replay's ``decisions``); None: no baseline."""
    import duckdb

    out.mkdir(parents=True, exist_ok=True)
    conn = _connect(out, threads, memory)
    part = f"(hash(run_id) % {int(parts)})"
    runs_cols = "run_id, task_id, tenant, prompt_version, model_route, status, reason"
    spec = "spec_json" if "spec_json" in traces.tables["runs"].columns else "NULL::VARCHAR AS spec_json"
    queries = {
        "runs": f"SELECT {runs_cols}, {spec}, {part} AS part FROM {_files_sql(traces.tables['runs'].files)}",
        "events": (
            "SELECT run_id, seq, kind, to_state, step, attempt, payload_json, "
            f"{part} AS part FROM {_files_sql(traces.tables['events'].files)}"
        ),
        "candidates": (
            "SELECT run_id, step, attempt, candidate_id, context_artifact_id, "
            f"{part} AS part FROM {_files_sql(traces.tables['candidates'].files)}"
        ),
        # Bodies travel with the runs that read them: a context shared by
        # runs in two partitions is written to both.
        "bodies": (
            f"WITH c AS (SELECT run_id, candidate_id, context_artifact_id FROM "
            f"{_files_sql(traces.tables['candidates'].files)}), "
            f"refs AS (SELECT DISTINCT id, part FROM ("
            f"SELECT candidate_id AS id, {part} AS part FROM c UNION ALL "
            f"SELECT context_artifact_id AS id, {part} AS part FROM c WHERE context_artifact_id IS NOT NULL UNION ALL "
            # Contexts name their tool registry snapshot by id: the (few)
            # snapshots go to every partition.
            f"SELECT r.artifact_id AS id, p.part FROM (SELECT artifact_id FROM "
            f"{_files_sql(traces.tables['artifacts'].files)} WHERE kind = 'tool_registry') r "
            f"CROSS JOIN (SELECT DISTINCT {part} AS part FROM c) p)) "
            f"SELECT a.artifact_id, a.body, refs.part FROM refs JOIN "
            f"(SELECT artifact_id, body FROM {_files_sql(traces.tables['artifacts'].files)}) a "
            f"ON a.artifact_id = refs.id"
        ),
    }
    if baseline_files:
        cols = ", ".join(BASELINE_COLUMNS)
        queries["baseline"] = f"SELECT {cols}, {part} AS part FROM {_files_sql(baseline_files)}"
    labels = traces.tables["labels"]
    order = "label_id" if "label_id" in labels.columns else "0"
    queries["labels"] = (
        "SELECT run_id, step, attempt, candidate_id, validator, expected_verdict, source, "
        f"COALESCE(note, '') AS note, {order} AS label_order, {part} AS part FROM {_files_sql(labels.files)}"
    )
    try:
        for name, query in queries.items():
            target = str(out / name).replace("'", "''")
            conn.execute(f"COPY ({query}) TO '{target}' (FORMAT parquet, PARTITION_BY (part), "
                         "OVERWRITE_OR_IGNORE true, COMPRESSION zstd)")
    except duckdb.Error as exc:
        # A file whose footer is fine but whose pages are not (truncated
        # data, bad compression) surfaces here, and DuckDB does not always
        # say which file it was reading: find it.
        files = [f for table in traces.tables.values() for f in table.files] + list(baseline_files or ())
        raise _read_failed(files, traces.root, "the traces", exc) from None
    finally:
        conn.close()


def read_partition(out: Path, relation: str, part: int) -> Any:
    """One relation of one partition as a pyarrow table (None when empty)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = out / relation / f"part={part}"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return None
    # ParquetFile.read, not read_table: the latter loads pyarrow.dataset
    # (and pandas with it), a second per worker for nothing.
    tables = [pq.ParquetFile(f).read() for f in files]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
