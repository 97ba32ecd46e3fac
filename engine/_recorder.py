"""The recorder: committed journal rows → the Parquet trace tables.

A traces folder belongs to one journal: the first export writes the
journal's id into ``traces/.journal``, and an export from any other journal
is refused, since its segment numbers would overwrite the first one's. One
journal may feed several folders (data directories sharing a ``--store``):
the marker also holds the folder's own id, and the journal keeps what it
exported per folder id, so each folder gets every row.

An export is idempotent. It first records an *intent* in the journal with
the exact per-run seq ranges it covers (and the label id range); its files
are named after the intent's id (``seg-00000042.parquet``), written to a
temporary name, flushed, and renamed into place; only then are the intent
marked done and the per-run high-water marks advanced. An export that dies
half-way is redone from its recorded ranges by the next one, rewriting the
same file names with the same rows, so no row is ever published twice.

Append tables grow by such segments; the snapshot tables ``runs`` and
``operations`` (mutable records) are rewritten whole and replaced
atomically. Every table folder holds at least one file, so a reader always
finds the schema, even before the first run.

``compact()`` merges a table's segments into one file, streaming, and
deletes the originals; an interrupted compaction is finished (or undone)
by the next export.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopledger._args import as_path
from loopledger._parquet import TRACES_MARKER, first_unreadable, one_line

from ._clock import now_us
from ._errors import BadInput, JournalError
from ._store import SQLRunStore
from ._tables import TABLES, TraceTable, arrow_batch, arrow_schema

BATCH_ROWS = 20_000

#: Tables exported by a global sequence range rather than by per-run ranges:
#: name -> (journal table, sequence column). Labels belong to no run's
#: commit; the store makes sure no label is being written while an export
#: reads the range's upper bound (``SQLRunStore._begin_read``).
GLOBAL_SEQUENCES = {"labels": ("labels", "label_id")}
EMPTY_FILE = "empty.parquet"
#: An export's segment is ``seg-<export id>.parquet``; a compaction's merged
#: file ``compact-<compaction id>.parquet``.
SEGMENT_PREFIX = "seg-"
COMPACTED_PREFIX = "compact-"
#: Segments published from outside the journal (imported runs): ``imp-<n>.parquet``.
IMPORT_PREFIX = "imp-"
LOCK_FILE = ".export.lock"
#: The id of the journal the folder's segments come from.
OWNER_FILE = TRACES_MARKER
COMPRESSION = "zstd"


_REMAKE = ("restore the marker, or move {traces} aside and run `loopledger export` to write the traces again from "
           "the journal (imported runs are not in the journal: import them again)")


def has_segments(traces: Path) -> bool:
    """Whether a traces folder holds any table's segment: exported or
    imported rows, which only the journal they belong to may add to."""
    return any(next((traces / name).glob(f"{SEGMENT_PREFIX}*.parquet"), None) for name in TABLES)


class ReadLock:
    """The traces folder's export lock, held shared by a reader (a replay, a
    page of the UI) while it lists and reads the trace files: an export,
    import or compaction (which hold it exclusively while they publish)
    then waits, so the reader sees one consistent set of files, never one
    table's new segment without the others', nor a segment a compaction has
    just removed. Readers read side by side. A folder where the lock file
    cannot be made (a read-only copy, which nobody exports into) is read
    without it."""

    def __init__(self, traces: Path) -> None:
        self._handle: Any = None
        try:
            handle = open(traces / LOCK_FILE, "a+b")  # noqa: SIM115 - released by release()
        except OSError:
            return
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        except BaseException:
            handle.close()
            raise
        self._handle = handle

    def release(self) -> None:
        """Let exports go on (idempotent)."""
        if self._handle is not None:
            self._handle.close()  # closing the file drops its lock
            self._handle = None


@dataclass
class ExportResult:
    export_id: int | None
    rows: dict[str, int] = field(default_factory=dict)  # rows written per table
    runs: int = 0  # runs with new events
    #: Tables written again because their folder was deleted (before the new rows).
    refilled: tuple[str, ...] = ()

    @property
    def appended(self) -> int:
        return sum(n for t, n in self.rows.items() if TABLES[t].kind == "append")


@dataclass
class RepairResult:
    """What :meth:`Recorder.repair` found among the traces folder's files."""

    export: ExportResult
    checked: int = 0
    #: Files written again from the journal, as ``table/file``.
    rewritten: list[str] = field(default_factory=list)
    #: ``(table/file, why it cannot be written again and what to do)``.
    left: list[tuple[str, str]] = field(default_factory=list)


def _numbered(prefix: str, number: int) -> str:
    """The file name of a segment, a merged file or an import (``<prefix><number>.parquet``)."""
    return f"{prefix}{number:08d}.parquet"


def _number(file_name: str, prefix: str) -> int:
    """The number in a file name made by :func:`_numbered`."""
    return int(file_name[len(prefix):-len(".parquet")])


def _some(names: Sequence[str]) -> str:
    """The first few of ``names``, for a message."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_replace(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _batches(cursor: Any, table: TraceTable) -> Iterable[Any]:
    """Arrow record batches from a cursor, ``BATCH_ROWS`` at a time."""
    while True:
        rows = cursor.fetchmany(BATCH_ROWS)
        if not rows:
            return
        yield arrow_batch(table.name, list(zip(*rows)))


def _write_file(path: Path, table: TraceTable, batches: Iterable[Any]) -> int:
    import pyarrow.parquet as pq

    rows = 0
    with pq.ParquetWriter(path, arrow_schema(table.name), compression=COMPRESSION) as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


def write_parquet(path: Path, table: TraceTable, batches: Iterable[Any], *, keep_empty: bool) -> int:
    """Write batches to ``path`` through a temporary file; return the row count.
    With no rows and not ``keep_empty``, nothing is published."""
    tmp = path.with_name(path.name + ".tmp")
    rows = _write_file(tmp, table, batches)
    if rows == 0 and not keep_empty:
        tmp.unlink()
        return 0
    _durable_replace(tmp, path)
    return rows


def _checked(store: Any, traces_dir: Any) -> tuple[SQLRunStore, Path]:
    """The recorder's arguments, checked before it touches anything: a
    journal (:func:`~._home.open_journal`, ``Home.open_store()``) and a
    folder path; otherwise :class:`BadInput` naming the argument."""
    if not isinstance(store, SQLRunStore):
        raise BadInput("store", "expected an open journal (open_journal(url) or Home(...).open_store()), "
                                f"got {type(store).__name__}")
    folder = as_path(traces_dir)
    if folder is None:
        raise BadInput("traces_dir", "expected the path of a traces folder (a str or os.PathLike), "
                                     f"got {type(traces_dir).__name__}")
    if folder.exists() and not folder.is_dir():
        raise BadInput("traces_dir", f"{folder} is not a folder; expected the traces folder")
    return store, folder


class Recorder:
    """Exports one journal into ``traces_dir`` (``<home>/traces``)."""

    def __init__(self, store: SQLRunStore, traces_dir: str | os.PathLike[str]) -> None:
        self.store, self.traces = _checked(store, traces_dir)
        #: The folder's id (``_claim``): the journal tracks what it exported
        #: per folder, so each folder sharing a journal gets every row.
        self._traces_id = ""

    def table_dir(self, name: str) -> Path:
        return self.traces / name

    def _make_table_dirs(self) -> None:
        for name in TABLES:
            self.table_dir(name).mkdir(parents=True, exist_ok=True)

    # -- export ------------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One exporter at a time per traces folder, across processes: two
        exports at once would record overlapping ranges and race on the
        snapshot files. The lock is the kernel's; a killed exporter drops it."""
        self.traces.mkdir(parents=True, exist_ok=True)
        with open(self.traces / LOCK_FILE, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def export(self) -> ExportResult:
        with self._exclusive():
            return self._export()

    def claim(self) -> None:
        """Make sure this traces folder takes this journal's exports (see the
        module's docstring); :class:`JournalError` if it is another's."""
        with self._exclusive():
            self._claim()

    def _claim(self) -> str:
        """Check the folder's marker (or write it); return the folder's id."""
        journal_id = self.store.journal_id()
        marker = self.traces / OWNER_FILE
        segments = has_segments(self.traces)
        if marker.exists():
            owner, traces_id = self._read_marker(marker)
            if owner != journal_id:
                raise JournalError(f"{self.traces}: these traces were exported from another journal (id {owner}; "
                                   f"this one is {journal_id}{self._if_empty()}); give this journal a --home of "
                                   "its own")
            if segments and not self._exported_to(traces_id):
                # Its exports are not this journal's record of the folder: an
                # export would write every row again beside the ones there.
                raise JournalError(f"{marker}: names a folder id ({traces_id or 'none'}) this journal never "
                                   f"exported to, beside exported segments; {_REMAKE.format(traces=self.traces)}")
            self._traces_id = traces_id
            return traces_id
        traces_id = secrets.token_hex(8)
        # Segments written before folders named their journal: adopted by a
        # journal that has exported before (the folder of its exports made
        # before they were tracked per folder, id ''), refused by a new one.
        if segments:
            if not self._exported_to(""):
                raise JournalError(f"{self.traces}: holds exported segments but no marker ({OWNER_FILE}) saying "
                                   f"which journal they came from, and this journal{self._if_empty()} did not "
                                   f"export them before folders were marked; {_REMAKE.format(traces=self.traces)}")
            traces_id = ""
        tmp = marker.with_name(marker.name + ".tmp")
        tmp.write_text(f"{journal_id}\n{traces_id}\n")
        _durable_replace(tmp, marker)
        self._traces_id = traces_id
        return traces_id

    @staticmethod
    def _read_marker(marker: Path) -> tuple[str, str]:
        """(journal id, folder id) from a marker as :meth:`_claim` writes it:
        ``"<journal id>\\n<folder id>\\n"`` (the folder id empty for a
        folder adopted from before markers); anything else is refused."""
        try:
            text = marker.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            text = None
        lines = text.split("\n") if text is not None else []
        if len(lines) == 2 and not lines[1]:
            # The journal's id alone: a marker written before folders had
            # ids of their own (the folder id ''; its exports carry that id
            # since migration 0008, which :meth:`_claim` checks).
            lines.append("")
        if len(lines) != 3 or lines[2] or not lines[0].strip() or lines[0] != lines[0].strip() \
                or lines[1] != lines[1].strip():
            raise JournalError(f"{marker}: not a traces marker (expected the journal's id and the folder's id, one "
                               f"per line, as an export writes it): it was changed or cut short; "
                               f"{_REMAKE.format(traces=marker.parent)}")
        return lines[0], lines[1]

    def _exported_to(self, traces_id: str) -> bool:
        with self.store._lock:
            return self.store.execute(self.store._conn, "SELECT 1 FROM exports WHERE traces_id = ? LIMIT 1",
                                      (traces_id,)).fetchone() is not None

    def _if_empty(self) -> str:
        """A note for a journal that holds no run: a journal file replaced or
        emptied is the likelier story than two journals."""
        with self.store._lock:
            any_run = self.store.execute(self.store._conn, "SELECT 1 FROM runs LIMIT 1").fetchone()
        return "" if any_run is not None else ", and it holds no run: was the journal file replaced or emptied?"

    def _export(self) -> ExportResult:
        traces_id = self._claim()
        # A table folder with no file at all was deleted (an export always
        # leaves at least the empty schema file): what this folder had of it
        # is written again from the journal, before anything new.
        lost = [name for name in TABLES if not any(self.table_dir(name).glob("*.parquet"))]
        self._make_table_dirs()
        self._finish_imports()
        self._finish_compactions()
        with self.store._lock:
            rows = self.store.execute(
                self.store._conn,
                "SELECT export_id, ranges_json, bounds_json FROM exports"
                " WHERE status = 'pending' AND traces_id = ? ORDER BY export_id", (traces_id,)
            ).fetchall()
        pending = [(export_id, json.loads(ranges), json.loads(bounds)) for export_id, ranges, bounds in rows]
        # The refill writes what the finished exports gave the folder; an
        # export that died before its files were written redoes its own rows
        # below (a refill its tables whole). So the refill comes first, from
        # the marks the finished exports left, and leaves a dead refill's
        # tables to its redo: either way, each row is written once. (A folder
        # empty because the first export died is not lost: nothing finished
        # gave it rows.)
        redone = {name for _, _, bounds in pending for name in bounds.get("tables", ())}
        lost = [name for name in lost if name not in redone]
        refilled = self._refill(lost) if lost else None
        result = ExportResult(None)
        for export_id, ranges, bounds in pending:
            result = self._publish(export_id, ranges, bounds)
        fresh = self._export_new()
        self._ensure_schema_files()
        if refilled is None:
            return fresh or result
        # One account of both: the refill's rows, then the new ones.
        rows = dict(refilled.rows)
        for name, n in (fresh.rows if fresh else {}).items():
            rows[name] = rows.get(name, 0) + n
        return ExportResult(fresh.export_id if fresh else refilled.export_id, rows,
                            runs=fresh.runs if fresh else 0, refilled=tuple(refilled.rows))

    def _refill(self, tables: Sequence[str]) -> ExportResult | None:
        """Write ``tables`` again with every row this folder was given before
        (each run's seqs up to its mark, labels up to the last bound), as an
        intent of their own (``bounds["tables"]`` names them, so a redo after
        a crash writes them alone). None when the folder was given nothing."""
        store = self.store
        with store._lock:
            marks = store.execute(
                store._conn, "SELECT run_id, events_hwm FROM export_marks WHERE traces_id = ? ORDER BY run_id",
                (self._traces_id,)).fetchall()
            previous = self._last_bounds(store._conn)
        if not marks and not previous:
            return None
        # The refill writes every row the folder had of these tables, so the
        # record of their compactions, whose files are gone with the folder,
        # no longer describes anything (``repair`` would bring their rows
        # back a second time). Dropped first: a refill that dies is redone.
        with store._write() as conn:
            store.execute_many(conn, "DELETE FROM compactions WHERE traces_id = ? AND table_name = ?",
                               [(self._traces_id, name) for name in tables])
        bounds: dict[str, Any] = {}
        for name in GLOBAL_SEQUENCES:
            upto = previous.get(name, [0, 0])[1]
            bounds[name] = [0 if name in tables else upto, upto]
        bounds["tables"] = sorted(tables)
        ranges = [[run_id, 0, hwm] for run_id, hwm in marks]
        return self._publish(self._intent(ranges, bounds), ranges, bounds)

    def _last_bounds(self, conn: Any) -> dict[str, Any]:
        """The bounds of this folder's last finished export ({} before the first)."""
        row = self.store.execute(
            conn, "SELECT bounds_json FROM exports WHERE status = 'done' AND traces_id = ?"
            " ORDER BY export_id DESC LIMIT 1", (self._traces_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    def _intent(self, ranges: Sequence[Sequence[Any]], bounds: Mapping[str, Any]) -> int:
        """Record what an export will write, before it writes it; its id."""
        store = self.store
        with store._write() as conn:
            cursor = store.execute(
                conn,
                "INSERT INTO exports (created_at, status, ranges_json, bounds_json, traces_id)"
                " VALUES (?, 'pending', ?, ?, ?) RETURNING export_id",
                (now_us(), json.dumps(ranges), json.dumps(bounds, sort_keys=True), self._traces_id),
            )
            return int(cursor.fetchall()[0][0])

    def _export_new(self) -> ExportResult | None:
        store = self.store
        reader = store.read_connection()
        try:
            # One read transaction: the ranges and every row read below come
            # from the same snapshot of the journal.
            store._begin_read(reader)
            traces_id = self._traces_id
            ranges = store.execute(
                reader,
                "SELECT r.run_id, COALESCE(m.events_hwm, 0), r.last_seq FROM runs r"
                " LEFT JOIN export_marks m ON m.traces_id = ? AND m.run_id = r.run_id"
                " WHERE r.last_seq > COALESCE(m.events_hwm, 0) ORDER BY r.run_id", (traces_id,)
            ).fetchall()
            previous = self._last_bounds(reader)
            bounds = {}
            for name, (table, key) in GLOBAL_SEQUENCES.items():
                upto = reader.execute(f"SELECT COALESCE(MAX({key}), 0) FROM {table}").fetchone()[0]
                bounds[name] = [previous.get(name, [0, 0])[1], upto]
            if not ranges and all(after >= upto for after, upto in bounds.values()):
                reader.execute("ROLLBACK")
                return None
            ranges = [list(r) for r in ranges]
            return self._publish(self._intent(ranges, bounds), ranges, bounds, reader=reader)
        finally:
            reader.close()

    def _publish(
        self,
        export_id: int,
        ranges: Sequence[Sequence[Any]],
        bounds: dict[str, Any],
        reader: Any = None,
    ) -> ExportResult:
        store = self.store
        own_reader = reader is None
        if own_reader:
            reader = store.read_connection()
            store._begin_read(reader)
        result = ExportResult(export_id, runs=len(ranges))
        try:
            # The export's per-run seq ranges, which the append tables'
            # queries join (engine/_tables.py).
            reader.execute(store.ranges_table_sql)
            reader.execute("DELETE FROM _export_ranges")
            store.execute_many(reader, "INSERT INTO _export_ranges VALUES (?, ?, ?)", ranges)
            only = bounds.get("tables")  # a refill writes these alone
            for name, table in TABLES.items():
                if only is not None and name not in only:
                    continue
                params: tuple[Any, ...] = tuple(bounds[name]) if table.bounded else ()
                cursor = store._stream(reader, table.select_sql(store.driving_join), params)
                try:
                    if table.kind == "append":
                        path = self.table_dir(name) / _numbered(SEGMENT_PREFIX, export_id)
                        result.rows[name] = write_parquet(path, table, _batches(cursor, table), keep_empty=False)
                    else:
                        path = self.table_dir(name) / f"{name}.parquet"
                        result.rows[name] = write_parquet(path, table, _batches(cursor, table), keep_empty=True)
                finally:
                    cursor.close()
        finally:
            reader.execute("ROLLBACK")
            if own_reader:
                reader.close()
        with store._write() as conn:
            store.execute_many(
                conn,
                "INSERT INTO export_marks (traces_id, run_id, events_hwm) VALUES (?, ?, ?)"
                " ON CONFLICT (traces_id, run_id) DO UPDATE SET events_hwm = excluded.events_hwm"
                " WHERE excluded.events_hwm > export_marks.events_hwm",
                [(self._traces_id, run_id, hi) for run_id, _lo, hi in ranges],
            )
            store.execute(conn, "UPDATE exports SET status = 'done' WHERE export_id = ?", (export_id,))
        return result

    def _ensure_schema_files(self) -> None:
        """A table with no file yet gets an empty one, so its schema is always
        readable; once it has a real file, the empty one goes (it holds no
        rows, so removing it never changes what a reader sees)."""
        for name, table in TABLES.items():
            folder = self.table_dir(name)
            if any(p.name != EMPTY_FILE for p in folder.glob("*.parquet")):
                (folder / EMPTY_FILE).unlink(missing_ok=True)
            elif not (folder / EMPTY_FILE).exists():
                write_parquet(folder / EMPTY_FILE, table, (), keep_empty=True)

    # -- repair -------------------------------------------------------------

    def repair(self) -> RepairResult:
        """Export what is new, then read every trace file whole and write
        each one that cannot be read again from the journal: an exported
        segment with the rows of its recorded export, a snapshot table and
        an empty schema file as any export writes them, a compacted file as
        the segments it merged (then removed); and the journal's rows of a
        compacted file that is gone. Rows that never were in the journal (an
        import's ``imp-`` files, or a compaction that merged them) cannot be
        written again: they are named, with what to do."""
        with self._exclusive():
            result = RepairResult(self._export())
            with self.store._lock:
                exports = {export_id: (json.loads(ranges), json.loads(bounds)) for export_id, ranges, bounds in
                           self.store.execute(self.store._conn, "SELECT export_id, ranges_json, bounds_json FROM "
                                              "exports WHERE status = 'done' AND traces_id = ?", (self._traces_id,))}
            _, merged = self._compactions()
            for name in TABLES:
                for path in sorted(self.table_dir(name).glob("*.parquet")):
                    result.checked += 1
                    found = first_unreadable([path])
                    if found is None:
                        continue
                    where = f"{name}/{path.name}"
                    left = self._remake(name, path, exports, merged)
                    if left is None:
                        result.rewritten.append(where)
                    else:
                        result.left.append((where, f"not readable ({found[1]}); {left}"))
            # A compacted file that is gone (moved aside, deleted) and was not
            # merged again since: the journal's rows it held come back as the
            # segments it merged. (A lone segment that is gone cannot be told
            # from an export that had no rows for its table; a table folder
            # that is gone is written again by every export.)
            compactions, merged = self._compactions()
            inner = {part for files in merged.values() for part in files}
            for cid, name in compactions:
                path = self.table_dir(name) / _numbered(COMPACTED_PREFIX, cid)
                if path.name in inner or path.exists():
                    continue
                where = f"{name}/{path.name}"
                imported = [leaf for leaf in self._leaves(path.name, merged) if not leaf.startswith(SEGMENT_PREFIX)]
                left = self._remake(name, path, exports, merged, only_journal=True)
                if left is not None:
                    result.left.append((where, f"gone; {left}"))
                    continue
                result.rewritten.append(f"{where} (gone: its journal rows)")
                if imported:
                    result.left.append((where, f"gone, with rows that never were in the journal "
                                               f"({_some(imported)}: imported runs); import those runs again"))
            return result

    def _compactions(self) -> tuple[list[tuple[int, str]], dict[str, list[str]]]:
        """This folder's finished compactions: (id, table), and each merged
        file's name -> the names of the files it merged."""
        with self.store._lock:
            rows = self.store.execute(
                self.store._conn, "SELECT compaction_id, table_name, files_json FROM compactions"
                                  " WHERE status = 'done' AND traces_id = ?", (self._traces_id,)).fetchall()
        return ([(cid, name) for cid, name, _ in rows],
                {_numbered(COMPACTED_PREFIX, cid): json.loads(files) for cid, _, files in rows})

    def _remake(self, name: str, path: Path, exports: Mapping[int, tuple[Any, Any]],
                merged: Mapping[str, list[str]], *, only_journal: bool = False) -> str | None:
        """Write ``path`` of table ``name`` again from the journal; None when
        done, otherwise why it cannot be and what to do. ``only_journal``:
        write the journal's rows of a compacted file even if it also held
        imported ones (a file that is gone, whose imported rows are lost
        whatever is done here)."""
        table = TABLES[name]
        if path.name == EMPTY_FILE:
            write_parquet(path, table, (), keep_empty=True)
            return None
        if table.kind == "snapshot" and path.name == f"{name}.parquet":
            with self.store._lock:
                bounds = {**self._last_bounds(self.store._conn), "tables": [name]}
            self._publish(self._intent([], bounds), [], bounds)
            return None
        segments = self._leaves(path.name, merged)
        imported = [leaf for leaf in segments if not leaf.startswith(SEGMENT_PREFIX)]
        if imported and not only_journal:
            return (f"it holds rows that never were in the journal ({_some(imported)}: imported runs); move it "
                    "aside, run `loopledger export --repair` again to write its journal rows, and import those "
                    "runs again")
        ids = [_number(leaf, SEGMENT_PREFIX) for leaf in segments if leaf.startswith(SEGMENT_PREFIX)]
        unknown = [i for i in ids if i not in exports]
        if unknown:
            return (f"this journal records no finished export {unknown[0]} into this folder; move the file aside "
                    "if its rows came from elsewhere")
        for export_id in ids:
            ranges, bounds = exports[export_id]
            self._publish(export_id, ranges, {**bounds, "tables": [name]})
        if path.name not in segments:
            # A compacted file: its segments are back, so the file goes, and
            # so does the record of its compaction (and of those it merged),
            # which would otherwise bring them back again after a later
            # compaction has merged them.
            path.unlink(missing_ok=True)
            _fsync_dir(path.parent)
            with self.store._write() as conn:
                self.store.execute_many(conn, "DELETE FROM compactions WHERE compaction_id = ?",
                                        [(_number(part, COMPACTED_PREFIX),) for part in self._compacted(path.name, merged)])
        return None

    @staticmethod
    def _compacted(file_name: str, merged: Mapping[str, list[str]]) -> list[str]:
        """The compacted files ``file_name`` is made of: itself and those it
        merged, through compactions of compactions."""
        if file_name not in merged:
            return []
        return [file_name, *(c for part in merged[file_name] for c in Recorder._compacted(part, merged))]

    @staticmethod
    def _leaves(file_name: str, merged: Mapping[str, list[str]]) -> list[str]:
        """The segments (``seg-``, ``imp-``) a file holds: itself, or those
        its compaction merged, through compactions of compactions."""
        if file_name not in merged:
            return [file_name]
        return [leaf for part in merged[file_name] for leaf in Recorder._leaves(part, merged)]

    # -- segments made outside the journal ------------------------------------

    def publish_import(self, build: Callable[[Callable[[str, str], set[Any]]], Mapping[str, Any]]) -> dict[str, int]:
        """Publish rows that never were in the journal (imported runs, which
        are over before they arrive) as one new segment per table,
        ``imp-<n>.parquet``: every table's segment or none of them.

        ``build(known)`` makes the tables (name → pyarrow Table) while the
        traces folder is locked against other exporters and importers;
        ``known(table, column)`` returns the values a column already holds,
        so that what is there is not written twice. Returns rows per table.

        All segments are written under temporary names and flushed, then a
        manifest naming them is made durable, then they are renamed into
        place and the manifest removed. An import that dies before its
        manifest leaves only temporary files (removed by the next export or
        import); one that dies after it is finished by the next."""
        with self._exclusive():
            self._make_table_dirs()
            self._finish_imports()
            tables = build(self._column_values)
            return self._publish_import(tables)

    def _column_values(self, name: str, column: str) -> set[Any]:
        import pyarrow.parquet as pq

        values: set[Any] = set()
        for path in sorted(self.table_dir(name).glob("*.parquet")):
            try:
                values.update(pq.read_table(path, columns=[column]).column(0).to_pylist())
            except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors for a broken file
                if isinstance(exc, OSError) and exc.errno is not None:
                    raise  # the system's own failure (a permission, the disk): not the file's content
                raise BadInput(str(path), f"not a readable {name} table file with a {column} column "
                                          f"({one_line(exc)}); nothing was imported") from None
        return values

    def _manifests(self) -> list[Path]:
        return sorted(self.traces.glob(f".{IMPORT_PREFIX}*.json"))

    def _publish_import(self, tables: Mapping[str, Any]) -> dict[str, int]:
        taken = [_number(p.name, IMPORT_PREFIX) for name in TABLES
                 for p in self.table_dir(name).glob(f"{IMPORT_PREFIX}*.parquet")]
        number = max(taken, default=0) + 1
        file_name = _numbered(IMPORT_PREFIX, number)
        from concurrent.futures import ThreadPoolExecutor

        def write(name: str) -> int:
            tmp = self.table_dir(name) / (file_name + ".tmp")
            rows = _write_file(tmp, TABLES[name], tables[name].to_batches(max_chunksize=BATCH_ROWS))
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            return rows

        names = [name for name in TABLES if name in tables and tables[name].num_rows]
        # Compression and fsync release the GIL: the tables are written side by side.
        with ThreadPoolExecutor(min(len(names), os.cpu_count() or 1) or 1) as pool:
            written = dict(zip(names, pool.map(write, names)))
        if not written:
            # Nothing new; every table is still readable (an import into a
            # new folder that found no run leaves its empty tables).
            self._ensure_schema_files()
            return {}
        manifest = self.traces / f".{IMPORT_PREFIX}{number:08d}.json"
        tmp_manifest = manifest.with_name(manifest.name + ".tmp")
        tmp_manifest.write_text(json.dumps({"file": file_name, "tables": sorted(written)}))
        _durable_replace(tmp_manifest, manifest)
        self._finish_import(manifest)
        self._ensure_schema_files()
        return written

    def _finish_import(self, manifest: Path) -> None:
        entry = json.loads(manifest.read_text())
        for name in entry["tables"]:
            final = self.table_dir(name) / entry["file"]
            tmp = final.with_name(final.name + ".tmp")
            if tmp.exists():
                os.replace(tmp, final)
                _fsync_dir(final.parent)
        manifest.unlink()
        _fsync_dir(self.traces)

    def _finish_imports(self) -> None:
        """Finish imports that made their manifest; drop the temporary files of those that did not."""
        for manifest in self._manifests():
            self._finish_import(manifest)
        for name in TABLES:
            for tmp in self.table_dir(name).glob(f"{IMPORT_PREFIX}*.parquet.tmp"):
                tmp.unlink()
        for tmp in self.traces.glob(f".{IMPORT_PREFIX}*.json.tmp"):
            tmp.unlink()

    # -- compaction --------------------------------------------------------

    def segments(self, name: str) -> list[Path]:
        return sorted(
            p for p in self.table_dir(name).glob("*.parquet")
            if p.name.startswith((SEGMENT_PREFIX, COMPACTED_PREFIX, IMPORT_PREFIX))
        )

    def compact(self) -> dict[str, int]:
        """Merge each append table's segments into one file; return files merged per table."""
        with self._exclusive():
            return self._compact()

    def _compact(self) -> dict[str, int]:
        import pyarrow.parquet as pq

        traces_id = self._claim()
        self._finish_compactions()
        merged: dict[str, int] = {}
        for name, table in TABLES.items():
            files = self.segments(name)
            # A pending export's segments are left alone: redoing that export
            # rewrites them, which would duplicate rows already merged. (Its
            # intent is recorded before its files are written, so listing the
            # files first and the pending exports second misses none.)
            with self.store._lock:
                pending = {
                    _numbered(SEGMENT_PREFIX, export_id)
                    for (export_id,) in self.store.execute(
                        self.store._conn, "SELECT export_id FROM exports WHERE status = 'pending' AND traces_id = ?",
                        (traces_id,),
                    ).fetchall()
                }
            files = [f for f in files if f.name not in pending]
            if table.kind != "append" or len(files) < 2:
                continue
            with self.store._write() as conn:
                cursor = self.store.execute(
                    conn,
                    "INSERT INTO compactions (table_name, status, files_json, created_at, traces_id)"
                    " VALUES (?, 'pending', ?, ?, ?) RETURNING compaction_id",
                    (name, json.dumps([f.name for f in files]), now_us(), traces_id),
                )
                compaction_id = int(cursor.fetchall()[0][0])

            def stream(paths: list[Path] = files) -> Iterable[Any]:
                for path in paths:
                    try:
                        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
                    except (OSError, ValueError) as exc:  # pyarrow's errors for a broken file
                        raise JournalError(f"{path}: not a readable Parquet file ({one_line(exc)}); the "
                                           f"{name} table was not compacted, its files are as they were") from exc

            target = self.table_dir(name) / _numbered(COMPACTED_PREFIX, compaction_id)
            write_parquet(target, table, stream(), keep_empty=True)
            self._retire(compaction_id, name, [f.name for f in files])
            merged[name] = len(files)
        return merged

    def _retire(self, compaction_id: int, name: str, files: list[str]) -> None:
        with self.store._write() as conn:
            self.store.execute(conn, "UPDATE compactions SET status = 'published' WHERE compaction_id = ?",
                               (compaction_id,))
        for file_name in files:
            (self.table_dir(name) / file_name).unlink(missing_ok=True)
        _fsync_dir(self.table_dir(name))
        with self.store._write() as conn:
            self.store.execute(conn, "UPDATE compactions SET status = 'done' WHERE compaction_id = ?",
                               (compaction_id,))

    def _finish_compactions(self) -> None:
        """A compaction whose merged file exists is finished (the originals
        are deleted); one whose merged file never appeared is abandoned."""
        with self.store._lock:
            open_ones = self.store.execute(
                self.store._conn,
                "SELECT compaction_id, table_name, files_json FROM compactions WHERE status != 'done'"
                " AND traces_id = ?", (self._traces_id,)
            ).fetchall()
        for compaction_id, name, files_json in open_ones:
            target = self.table_dir(name) / _numbered(COMPACTED_PREFIX, compaction_id)
            if target.exists():
                self._retire(compaction_id, name, json.loads(files_json))
            else:
                target.with_name(target.name + ".tmp").unlink(missing_ok=True)
                with self.store._write() as conn:
                    self.store.execute(conn, "DELETE FROM compactions WHERE compaction_id = ?", (compaction_id,))
