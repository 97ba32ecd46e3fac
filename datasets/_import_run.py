"""``import_traces``: read every file, then turn them into trace-table rows,
then publish those.

Every file is read and checked whole before anything is written, so a bad
file (another format, a truncated file, an unknown role) stops the import
with nothing recorded. Then every run becomes rows of the trace tables
(:mod:`._import_tables`: imported runs are over, so they go straight to the
tables rather than through the journal), and the recorder publishes them as
one segment per table: the whole import lands, or none of it. Runs already
in the trace tables or the journal (same source, file name and source id:
the run id is derived from them) are skipped, so importing a file twice adds
nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._import_model import Conversation, ImportInputError
from ._import_openai import read_openai_jsonl, read_toolbench
from ._import_tau import expand, read_tau2, read_tau_bench

Reader = Callable[[Path, "Path | None"], list[Conversation]]

#: Format name → (reader, file patterns a folder is searched for).
FORMATS: dict[str, tuple[Reader, tuple[str, ...]]] = {
    "tau-bench": (read_tau_bench, ("*.json",)),
    "tau2": (read_tau2, ("*.json", "*.json.gz")),
    "openai-jsonl": (read_openai_jsonl, ("*.jsonl",)),
    "toolbench": (read_toolbench, ("*.json",)),
}


@dataclass(frozen=True)
class FileImport:
    """What one file gave."""

    path: str
    runs: int  # runs written
    skipped: int  # runs already in the journal
    candidates: int
    operations: int
    user_tool_calls: int
    failed_operations: int


@dataclass
class ImportResult:
    files: list[FileImport] = field(default_factory=list)
    export_rows: dict[str, int] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return sum(f.runs for f in self.files)

    @property
    def skipped(self) -> int:
        return sum(f.skipped for f in self.files)


def read_conversations(fmt: str, paths: Iterable[str | os.PathLike[str]],
                       tools: str | os.PathLike[str] | None = None) -> list[tuple[Path, list[Conversation]]]:
    """Read and check every file; raise :class:`ImportInputError` on the first bad one."""
    if fmt not in FORMATS:
        raise ImportInputError("FORMAT", None, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    reader, patterns = FORMATS[fmt]
    tools_path = Path(tools) if tools is not None else None
    if tools_path is not None and not tools_path.is_file():
        raise ImportInputError(str(tools_path), None, "--tools: no such file")
    out = []
    for path in expand([Path(p) for p in paths], patterns):
        conversations = reader(path, tools_path)
        if not conversations and fmt != "toolbench":  # toolbench: see read_toolbench
            raise ImportInputError(str(path), None, f"no runs in this file; is it {fmt}?")
        for conv in conversations:
            if not any(m.role == "assistant" for m in conv.messages):
                raise ImportInputError(str(path), conv.record, "no assistant message: nothing the agent decided")
        out.append((path, conversations))
    return out


def import_traces(fmt: str, paths: Sequence[str | os.PathLike[str]], *, home: str | os.PathLike[str] | None = None,
                  tools: str | os.PathLike[str] | None = None, decide: Any = None) -> ImportResult:
    """Import external traces into the trace tables of ``home`` (default:
    ``$LOOPLEDGER_HOME``, else ``./loopledger-data``).

    ``decide``: a suite (name, file or :class:`~loopledger.validators.Suite`)
    whose decisions are recorded at import time as the runs' baseline; None
    records none (docs/importers.md, "Baseline")."""
    from loopledger.engine import Home, Recorder
    from loopledger.validators import Suite, SuiteError, load_suite

    files = read_conversations(fmt, paths, tools)
    suite = None
    if decide is not None:
        try:
            suite = decide if isinstance(decide, Suite) else load_suite(decide)
        except SuiteError as exc:
            raise ImportInputError(exc.where, None, exc.reason) from None
    where = Home.resolve(home)
    store = where.open_store()
    result = ImportResult()

    def build(known: Callable[[str, str], set[Any]]) -> dict[str, Any]:
        from ._import_tables import TraceRows

        existing = known("runs", "run_id") | store.existing_runs(c.run_id for _, convs in files for c in convs)
        plan = []
        for path, conversations in files:
            todo = []
            for conv in conversations:
                if conv.run_id not in existing:
                    existing.add(conv.run_id)  # a run repeated (in a file or across files) is imported once
                    todo.append(conv)
            plan.append((path, len(conversations), todo))
        rows = TraceRows(known("artifacts", "artifact_id"))
        result.files.extend(_write_all(rows, plan, suite))
        return rows.tables()

    try:
        result.export_rows = Recorder(store, where.traces).publish_import(build)
    finally:
        store.close()
    return result


#: Below this many runs an import is written in this process alone.
PARALLEL_FROM = 64
#: Work of the processes of one import, inherited by fork (see _write_all).
_PLAN: list[list[tuple[Path, int, list[Conversation]]]] = []


def _write_all(rows: Any, plan: list[tuple[Path, int, list[Conversation]]], suite: Any) -> list[FileImport]:
    """Write the planned runs into ``rows``. A large import is cut into
    contiguous groups of files, one per core, written by forked processes
    (they inherit the conversations, so nothing is sent to them) and
    absorbed here in file order: the same rows as writing them in order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    runs = sum(len(todo) for _, _, todo in plan)
    workers = min(len(plan), os.cpu_count() or 1)
    if runs < PARALLEL_FROM or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [write_file(rows, path, total, todo, suite) for path, total, todo in plan]
    groups: list[list[tuple[Path, int, list[Conversation]]]] = [[] for _ in range(workers)]
    done = 0
    for item in plan:
        groups[min(workers - 1, done * workers // runs)].append(item)
        done += len(item[2])
    _PLAN[:] = [g for g in groups if g]
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(len(_PLAN), mp_context=context) as pool:
            outcomes = list(pool.map(_write_group, range(len(_PLAN)), [suite] * len(_PLAN)))
    finally:
        _PLAN.clear()
    stats: list[FileImport] = []
    for files, parts in outcomes:
        stats += files
        rows.absorb(parts)
    return stats


def _write_group(index: int, suite: Any) -> tuple[list[FileImport], tuple[Any, ...]]:
    from ._import_tables import TraceRows

    rows = TraceRows()
    files = [write_file(rows, path, total, todo, suite) for path, total, todo in _PLAN[index]]
    return files, rows.parts()


def write_file(rows: Any, path: Path, total: int, conversations: Sequence[Conversation],
               suite: Any = None) -> FileImport:
    """Commit ``conversations`` (the runs of the file at ``path`` that are
    new, of ``total``) to ``rows``, a :class:`~._import_tables.TraceRows`."""
    from ._import_writer import RunWriter

    totals = {"candidates": 0, "operations": 0, "user_tool_calls": 0, "failed": 0}
    for conv in conversations:
        stats = RunWriter(rows, conv, suite).write()
        for key, value in stats.items():
            totals[key] += value
    return FileImport(str(path), len(conversations), total - len(conversations), totals["candidates"],
                      totals["operations"], totals["user_tool_calls"], totals["failed"])
