"""``import_traces``: read every file, then write them, then export.

Every file is read and checked whole before anything is written, so a bad
file (another format, a truncated file, an unknown role) stops the import
with nothing recorded. Then each file's runs are written in one journal
transaction (all of them or none), and one export publishes the new rows
as Parquet. Runs already in the journal (same source, file name and source
id: the run id is derived from them) are skipped, so importing a file twice
adds nothing.
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
                  tools: str | os.PathLike[str] | None = None, decide: Any = None,
                  export: bool = True) -> ImportResult:
    """Import external traces into ``home`` (default: ``$LOOPLEDGER_HOME``,
    else ``./loopledger-data``) and export the trace tables.

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
    try:
        for path, conversations in files:
            result.files.append(write_file(store, path, conversations, suite))
        if export:
            result.export_rows = dict(Recorder(store, where.traces).export().rows)
    finally:
        store.close()
    return result


def write_file(store: Any, path: Path, conversations: Sequence[Conversation], suite: Any = None) -> FileImport:
    """One file's runs in one transaction: all written, or none."""
    from ._import_journal import RunWriter

    existing = store.existing_runs(c.run_id for c in conversations)
    totals = {"candidates": 0, "operations": 0, "user_tool_calls": 0, "failed": 0}
    written = 0
    with store.batch():
        for conv in conversations:
            if conv.run_id in existing:
                continue
            existing.add(conv.run_id)  # a file that repeats a run id imports it once
            stats = RunWriter(store, conv, suite).write()
            for key, value in stats.items():
                totals[key] += value
            written += 1
    return FileImport(str(path), written, len(conversations) - written, totals["candidates"],
                      totals["operations"], totals["user_tool_calls"], totals["failed"])
