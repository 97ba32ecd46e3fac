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
from collections import Counter, defaultdict
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
        existing = known("runs", "run_id") | store.existing_runs(c.run_id for _, convs in files for c in convs)
        plan = []
        for path, conversations in files:
            todo = []
            for conv in conversations:
                if conv.run_id not in existing:
                    existing.add(conv.run_id)  # a run repeated (in a file or across files) is imported once
                    todo.append(conv)
            plan.append((path, len(conversations), todo))
        files_written, tables = _write_all(plan, suite, known("artifacts", "artifact_id"))
        result.files.extend(files_written)
        return tables

    try:
        result.export_rows = Recorder(store, where.traces).publish_import(build)
    finally:
        store.close()
    return result


#: Below this many runs an import is written in this process alone.
PARALLEL_FROM = 64
#: Work of the processes of one import, inherited by fork (see _write_all):
#: per process, (index of the file in the plan, conversation) pairs; and the
#: artifact ids the trace tables already hold.
_GROUPS: list[list[tuple[int, Conversation]]] = []
_KNOWN: list[set[str]] = []

Plan = list[tuple[Path, int, list[Conversation]]]  # per file: path, runs in it, runs to write


def _write_all(plan: Plan, suite: Any, known_artifacts: set[str]) -> tuple[list[FileImport], dict[str, Any]]:
    """Write the planned runs; return what each file gave and the trace
    tables' new rows. A large import is cut into contiguous groups of runs,
    one per core, each written by a forked process (it inherits the
    conversations, so nothing is sent to it but the group's number) into
    Arrow tables, which are put together here in order: the same rows as
    writing every run here."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ._import_tables import TraceRows, concat_tables

    runs = [(index, conv) for index, (_, _, todo) in enumerate(plan) for conv in todo]
    workers = min(os.cpu_count() or 1, len(runs))
    if len(runs) < PARALLEL_FROM or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        rows = TraceRows(known_artifacts)
        counts = _write_runs(rows, runs, suite)
        tables = rows.tables()
    else:
        _GROUPS[:] = [runs[k * len(runs) // workers:(k + 1) * len(runs) // workers] for k in range(workers)]
        _KNOWN[:] = [known_artifacts]
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                outcomes = list(pool.map(_write_group, range(workers), [suite] * workers))
        finally:
            _GROUPS.clear()
            _KNOWN.clear()
        counts = defaultdict(Counter)
        for group_counts, _ in outcomes:
            for index, counted in group_counts.items():
                counts[index].update(counted)
        tables = concat_tables([group_tables for _, group_tables in outcomes])
    out = []
    for index, (path, total, todo) in enumerate(plan):
        c = counts[index]
        out.append(FileImport(str(path), len(todo), total - len(todo), c["candidates"], c["operations"],
                              c["user_tool_calls"], c["failed"]))
    return out, tables


def _write_group(group: int, suite: Any) -> tuple[dict[int, Counter[str]], dict[str, Any]]:
    from ._import_tables import TraceRows

    rows = TraceRows(_KNOWN[0])
    counts = _write_runs(rows, _GROUPS[group], suite)
    return counts, rows.tables()


def _write_runs(rows: Any, runs: Sequence[tuple[int, Conversation]], suite: Any) -> defaultdict[int, Counter[str]]:
    """Commit each conversation to ``rows`` (a :class:`~._import_tables.TraceRows`);
    count what each file gave."""
    from ._import_writer import RunWriter

    counts: defaultdict[int, Counter[str]] = defaultdict(Counter)
    for index, conv in runs:
        counts[index].update(RunWriter(rows, conv, suite).write())
    return counts
