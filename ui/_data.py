"""Read-only access to a data directory's Parquet traces and replays.

Every page's data comes from plain functions over a :class:`Traces`
(``_queries``, ``_compare``), so the benchmark and the tests call exactly
what the pages call, without Streamlit. All of them aggregate in DuckDB and
hand back small frames; no table is ever loaded whole into pandas.

Errors a page turns into a message instead of a traceback::

    DataError                 the traces could not be read
    ├── NoData                a table the page needs has no file at all
    └── CorruptData           DuckDB refused a file (not Parquet, truncated, ...)
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopledger.engine._states import TERMINAL, WAITING
from loopledger.engine._tables import TABLES
from loopledger.replay._result import REPLAY_ID

TERMINAL_STATES: tuple[str, ...] = tuple(sorted(s.value for s in TERMINAL))
WAITING_STATES: tuple[str, ...] = tuple(sorted(s.value for s in WAITING))
# Ordered as validators.Verdict.severity: the worst verdict names a decision.
VERDICTS: tuple[str, ...] = ("accept", "repair", "ask", "reject")
#: What the engine itself decided and found while the runs ran (the trace
#: tables), as opposed to what a replay computed over them.
RECORDED = "recorded"

_SQL_TYPES = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "ts": "TIMESTAMPTZ", "bool": "BOOLEAN"}

_DECISION_COLUMNS = {c.name: c.kind for c in TABLES["validations"].columns}
# The replay tables of CONTRACT.md ("Parquet tables"); a replay may write
# more columns, these are the ones the pages rely on.
REPLAY_TABLES: dict[str, dict[str, str]] = {
    "decisions": _DECISION_COLUMNS,
    "diffs": {
        "run_id": "str", "step": "int", "attempt": "int", "candidate_id": "str", "validator": "str",
        "baseline_verdict": "str", "replay_verdict": "str", "baseline_code": "str", "replay_code": "str",
        "kind": "str", "baseline_validator_version": "str", "replay_validator_version": "str",
    },
    "loop_diagnoses": {c.name: c.kind for c in TABLES["loop_diagnoses"].columns},
    "summary": {
        "replay_id": "str", "suite_version": "str", "baseline": "str", "candidates": "int",
        "decisions": "int", "flips": "int", "regressions": "int", "runs_diverged": "int", "seconds": "float",
    },
}
TRACE_TABLES: dict[str, dict[str, str]] = {
    name: {c.name: c.kind for c in spec.columns} for name, spec in TABLES.items()
}
Params = Sequence[Any] | dict[str, Any] | None


# Scenario labels are rows of the labels table for runs recorded since the
# runner writes them; for older traces the replay derives them from each
# run's frozen scenario (``runs.spec_json`` → expect.decisions, see
# loopledger.replay._labels), and so does this view where no row says the
# same, so the pages count the same labels a replay does.
# ``effective_labels`` keeps the one label that decides per decision: a
# person's over an importer's over a scenario's, within a source the latest.
# The ``contains`` test skips the JSON parse for the many runs that expect no
# decisions.
_LABEL_VIEWS = ("""
CREATE VIEW scenario_labels AS
WITH expected AS (
    SELECT run_id, unnest(json_extract(spec_json, '$.expect.decisions[*]')) AS d
    FROM runs WHERE contains(spec_json, '"decisions":[{')
), keyed AS (
    SELECT run_id, TRY_CAST(d->>'step' AS BIGINT) AS step, coalesce(TRY_CAST(d->>'attempt' AS BIGINT), 1) AS attempt,
           coalesce(d->>'validator', '') AS validator, d->>'verdict' AS expected_verdict
    FROM expected
)
SELECT CAST(NULL AS BIGINT) AS label_id, k.run_id, k.step, k.attempt, c.candidate_id, k.validator,
       k.expected_verdict, 'scenario' AS source, 'expect.decisions' AS note,
       CAST(NULL AS TIMESTAMPTZ) AS created_at
FROM keyed k JOIN candidates c ON c.run_id = k.run_id AND c.step = k.step AND c.attempt = k.attempt
WHERE k.expected_verdict IN ('accept', 'repair', 'ask', 'reject')
  AND NOT EXISTS (SELECT 1 FROM labels l WHERE l.source = 'scenario' AND l.run_id = k.run_id AND l.step = k.step
                  AND l.attempt = k.attempt AND coalesce(l.validator, '') = k.validator)
""", """
CREATE VIEW all_labels AS
SELECT label_id, run_id, step, attempt, candidate_id, coalesce(validator, '') AS validator, expected_verdict,
       source, note, created_at FROM labels
UNION ALL BY NAME SELECT * FROM scenario_labels
""", """
CREATE VIEW effective_labels AS
SELECT * FROM all_labels
QUALIFY row_number() OVER (
    PARTITION BY run_id, step, attempt, candidate_id, validator
    ORDER BY CASE source WHEN 'human' THEN 2 WHEN 'import' THEN 1 ELSE 0 END DESC, label_id DESC NULLS LAST
) = 1
""")


class DataError(Exception):
    """The traces could not be read; the message is meant for the page."""


class NoData(DataError):
    """A table the page needs has no Parquet file."""


class CorruptData(DataError):
    """DuckDB could not read a file."""


def _parquet_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*.parquet") if p.is_file())


def _empty_select(columns: dict[str, str]) -> str:
    cols = ", ".join(f"CAST(NULL AS {_SQL_TYPES[k]}) AS {n}" for n, k in columns.items())
    return f"SELECT {cols} WHERE false"


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


@dataclass
class Traces:
    """One data directory, read through an in-memory DuckDB connection.

    Each trace table is a view named after it; a table without files is an
    empty view with the CONTRACT columns, so a home holding only some tables
    still answers (``has()`` tells the pages which ones are real). Replay
    tables are views named ``replay_<table>`` over every replay, with a
    ``replay_dir`` column taken from the folder name.
    """

    home: Path
    _con: Any = field(default=None, repr=False)
    _files: dict[str, list[Path]] = field(default_factory=dict, repr=False)
    _replays: dict[str, dict[str, list[Path]]] = field(default_factory=dict, repr=False)
    #: Replays left out of the replay views because DuckDB cannot read one of
    #: their files, and why (known once the connection is open).
    unreadable_replays: dict[str, str] = field(default_factory=dict, repr=False)
    #: Tables of :data:`SECONDARY_TABLES` with a file that cannot be read:
    #: empty views, and what to tell (known once the connection is open).
    unreadable_tables: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self._files = {name: _parquet_files(self.traces / name) for name in TRACE_TABLES}
        self._replays = {}
        if self.replays_dir.is_dir():
            for folder in sorted(p for p in self.replays_dir.iterdir() if p.is_dir()):
                # A replay still being written (``<id>.partial``) is not one yet.
                if REPLAY_ID.fullmatch(folder.name) and not folder.name.endswith(".partial"):
                    self._replays[folder.name] = {t: _parquet_files(folder / t) for t in REPLAY_TABLES}

    @property
    def traces(self) -> Path:
        return self.home / "traces"

    @property
    def replays_dir(self) -> Path:
        return self.home / "replays"

    # -- what exists --------------------------------------------------------

    def has(self, table: str) -> bool:
        return bool(self._files.get(table))

    def require(self, *tables: str) -> None:
        """Raise :class:`NoData` naming the first table without files."""
        for table in tables:
            if not self.has(table):
                raise NoData(
                    f"No `{table}` table in {self.traces}. Record some runs first, e.g. "
                    f"`loopledger demo --home {shlex.quote(str(self.home))}`."
                )

    def replay_ids(self) -> list[str]:
        """Replays that wrote decisions (the others cannot be compared)."""
        return [rid for rid, tables in self._replays.items() if tables["decisions"]]

    def readable_replay_ids(self) -> list[str]:
        """:meth:`replay_ids` but those whose files DuckDB cannot read (which
        the replay views leave out): what a page may offer as a choice."""
        self.con  # noqa: B018 - opening the connection finds the unreadable replays
        return [rid for rid in self.replay_ids() if rid not in self.unreadable_replays]

    def replay_has(self, replay_id: str, table: str) -> bool:
        return bool(self._replays.get(replay_id, {}).get(table))

    # -- the connection -----------------------------------------------------

    @property
    def con(self) -> Any:
        if self._con is None:
            self._con = self._connect()
        return self._con

    def _connect(self) -> Any:
        import duckdb

        con = duckdb.connect(":memory:")
        for name, columns in TRACE_TABLES.items():
            files = self._files[name]
            if any(_foreign_column(name, path) for path in files):
                # A file written by something else, with a column of
                # another kind: the table has no view, so every query that
                # reads it says so (``_run`` names the file and column),
                # not only those DuckDB cannot bind.
                continue
            if name in SECONDARY_TABLES:
                broken = _first_unreadable_cached(files)
                if broken is not None:
                    self.unreadable_tables[name] = _not_parquet(name, *broken)
                    files = []
            body = f"SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true)" if files else None
            try:
                con.execute(f"CREATE VIEW {name} AS {body or _empty_select(columns)}")
            except duckdb.Error:
                # A file whose footer cannot be read: the table has no view.
                # The pages that do not need it still answer; a query that
                # reads it fails, and ``_run`` names the file.
                pass
        # ``replay_dir`` (the folder name) identifies a replay in every view,
        # whatever the files themselves say.
        parts = {
            (rid, table): f"SELECT '{rid}' AS replay_dir, * FROM read_parquet({_sql_list(tables[table])}, "
                          f"union_by_name = true)"
            for rid, tables in self._replays.items()
            for table in REPLAY_TABLES if tables[table]
        }
        try:
            for table in REPLAY_TABLES:
                con.execute(self._replay_view(table, parts))
        except duckdb.Error:
            # One broken replay leaves the others readable, and every page
            # that does not compare it: it is left out of every replay view,
            # and comparing it says why (``require_replay``).
            for (rid, _table), part in parts.items():
                if rid not in self.unreadable_replays:
                    try:
                        con.execute(f"DESCRIBE {part}")
                    except duckdb.Error as exc:
                        self.unreadable_replays[rid] = _first_line(exc)
            for table in REPLAY_TABLES:
                con.execute(self._replay_view(table, parts))
        for statement in _LABEL_VIEWS:
            try:
                con.execute(statement)
            except duckdb.Error:
                pass  # over a table without a view (above): it has none either
        return con

    def _replay_view(self, table: str, parts: dict[tuple[str, str], str]) -> str:
        chosen = [part for (rid, t), part in parts.items() if t == table and rid not in self.unreadable_replays]
        # The empty, typed select first: a column the pages read that a
        # replay written by an earlier version lacks is NULL, not an error.
        empty = f"SELECT CAST(NULL AS VARCHAR) AS replay_dir, * FROM ({_empty_select(REPLAY_TABLES[table])})"
        return f"CREATE OR REPLACE VIEW replay_{table} AS {' UNION ALL BY NAME '.join([empty, *chosen])}"

    def require_replay(self, replay_id: str) -> None:
        """Raise :class:`CorruptData` naming the file when a replay cannot be read."""
        from loopledger._parquet import first_unreadable

        self.con  # noqa: B018 - opening the connection finds the unreadable replays
        if replay_id in self.unreadable_replays:
            found = first_unreadable(path for files in self._replays[replay_id].values() for path in files)
            why = f"{found[0]} is not a readable Parquet file ({found[1]})" if found \
                else self.unreadable_replays[replay_id]
            raise CorruptData(f"Could not read the replay `{replay_id}`: {why}.")

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    # -- queries --------------------------------------------------------------

    def cursor(self) -> Any:
        """A cursor of its own: Streamlit serves sessions from several threads,
        and temporary tables live as long as the cursor that made them."""
        return self.con.cursor()

    def df(self, sql: str, params: Params = None, cur: Any = None) -> Any:
        """A small result as a pandas DataFrame; DuckDB errors become :class:`CorruptData`."""
        # Through Arrow: DuckDB's own pandas path warns on pandas 3.
        return self._run(sql, params, cur).to_arrow_table().to_pandas()

    def rows(self, sql: str, params: Params = None, cur: Any = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params, cur).fetchall()

    def one(self, sql: str, params: Params = None, cur: Any = None) -> tuple[Any, ...]:
        row = self._run(sql, params, cur).fetchone()
        assert row is not None, "aggregate queries return one row"
        return row

    def _run(self, sql: str, params: Params, cur: Any) -> Any:
        import duckdb

        try:
            return (cur or self.cursor()).execute(sql, params or [])
        except duckdb.Error as exc:
            broken = self._broken_file()
            if broken is not None:
                (table, path), why = broken
                raise CorruptData(f"{_not_parquet(table, path, why)}.") from exc
            foreign = self._foreign_file()
            if foreign is not None:
                table, path, why = foreign
                # (DuckDB's own words add nothing: the table has no view for that file.)
                raise CorruptData(f"Could not read the `{table}` table: {path} {why}.") from exc
            raise CorruptData(f"Could not read the traces under {self.home}: {_first_line(exc)}") from exc

    def _foreign_file(self) -> tuple[str, Path, str] | None:
        """A readable trace file with a column of another kind than its
        table's (a file written by something else): the table, the file and
        which column; None when every file's columns are of their kind."""
        for table, files in self._files.items():
            for path in files:
                why = _foreign_column(table, path)
                if why is not None:
                    return table, path, why
        return None

    def _broken_file(self) -> tuple[tuple[str, Path], str] | None:
        """The table and file DuckDB could not read (it does not always say
        which), and why; None when every file reads."""
        from loopledger._parquet import first_unreadable

        owners = {path: name for name, files in self._files.items() for path in files}
        for rid, tables in self._replays.items():
            if rid in self.unreadable_replays:
                continue  # left out of the views: not what this query read
            owners.update({path: f"replays/{rid}/{name}" for name, files in tables.items() for path in files})
        found = first_unreadable(owners)
        return ((owners[found[0]], found[0]), found[1]) if found is not None else None


#: Tables that only some figures count (the loop findings: a loop rate, a
#: flag): a file of theirs that cannot be read leaves them empty, and the
#: pages say so beside the figures that count them, instead of failing
#: every figure of the page that comes after the first such query.
SECONDARY_TABLES = ("loop_diagnoses",)

#: (what was asked, file, its inode, mtime and size) -> the answer: each
#: file is read once per process for each question (until it is rewritten
#: or replaced), not for every page's connection. Bounded: a long-running
#: workbench over growing traces starts over past it.
_PER_FILE: dict[tuple[str, str, int, int, int], str | None] = {}
_PER_FILE_MAX = 100_000


def _per_file(question: str, path: Path, answer: Callable[[Path], str | None]) -> str | None:
    """``answer(path)``, remembered for the file as it is now; None for a
    file gone meanwhile (a compaction removed it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (question, str(path), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _PER_FILE:
        if len(_PER_FILE) >= _PER_FILE_MAX:
            _PER_FILE.clear()
        _PER_FILE[key] = answer(path)
    return _PER_FILE[key]


def _not_parquet(table: str, path: Path, why: str) -> str:
    """What the pages say of a trace file that is not readable Parquet."""
    from loopledger._parquet import repair_hint

    return f"Could not read the `{table}` table: {path} is not a readable Parquet file ({why}){repair_hint(path)}"


def _unreadable_why(path: Path) -> str | None:
    from loopledger._parquet import first_unreadable

    found = first_unreadable([path])
    return found[1] if found is not None else None


def _first_unreadable_cached(files: Sequence[Path]) -> tuple[Path, str] | None:
    """``first_unreadable`` of ``files``, each file read once (:func:`_per_file`)."""
    for path in files:
        why = _per_file("unreadable", path, _unreadable_why)
        if why is not None:
            return path, why
    return None


def _foreign_column(table: str, path: Path) -> str | None:
    """Which column of a trace file is of another kind than its table's
    (said as the workbench says it), or None: every column is of its kind,
    or the file cannot be read at all (that is ``_broken_file``'s to name)."""

    def read(path: Path) -> str | None:
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception:  # noqa: BLE001 - an unreadable file is _broken_file's to name
            return None
        kinds = TRACE_TABLES.get(table, {})
        for name in schema.names:
            kind = kinds.get(name)
            if kind is not None and not _of_kind(schema.field(name).type, kind):
                return f"holds column `{name}` as {schema.field(name).type}, expected {kind}"
        return None

    return _per_file(f"foreign in {table}", path, read)


def _of_kind(arrow: Any, kind: str) -> bool:
    """Whether a column of Arrow type ``arrow`` can be read as ``kind``."""
    import pyarrow.types as pt

    if pt.is_null(arrow):
        return True  # a column with no value at all
    if pt.is_dictionary(arrow):
        arrow = arrow.value_type  # categorical, as pandas, polars and pyarrow may write text
    return {"str": pt.is_string(arrow) or pt.is_large_string(arrow) or pt.is_string_view(arrow),
            "int": pt.is_integer(arrow),
            "float": pt.is_floating(arrow) or pt.is_integer(arrow) or pt.is_decimal(arrow),
            "ts": pt.is_timestamp(arrow),
            "bool": pt.is_boolean(arrow)}.get(kind, True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fingerprint(home: Path) -> str:
    """Changes whenever a trace or replay file is added, removed or rewritten:
    the cache key that keeps the pages' cached results honest."""
    digest = hashlib.sha1()
    for root in (home / "traces", home / "replays"):
        if not root.is_dir():
            continue
        for dirpath, _dirs, names in os.walk(root):
            for name in sorted(names):
                if name.endswith(".parquet"):
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:  # removed by a compaction meanwhile
                        continue
                    digest.update(f"{dirpath}/{name}:{st.st_mtime_ns}:{st.st_size};".encode())
    return digest.hexdigest()
