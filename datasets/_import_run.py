"""``import_traces``: read and check every file, turn its runs into
trace-table rows, then publish those.

A bad file (another format, a truncated file, an unknown role) stops the
import with nothing recorded: rows are only published once every file has
been read and checked and every run written, and a data folder that does not
exist yet is not created. Every run becomes rows of the trace tables
(:mod:`._import_tables`: imported runs are over, so they go straight to the
tables rather than through the journal), and the recorder publishes them as
one segment per table: the whole import lands, or none of it. Runs already in
the trace tables or the journal (the run id is derived from the source and
the run's own id or its record's content, never from the file's name or the
record's position) are skipped, so importing a file twice, a gzipped copy of
it, or the file with records added adds only what is new.
"""

from __future__ import annotations

import gc
import os
import re
import reprlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from loopledger._args import as_path
from loopledger._procs import die_with_parent, remove_if_abandoned

from ._import_model import Conversation, ImportInputError
from ._import_openai import read_openai_jsonl, read_toolbench
from ._import_tau import catalogue_in_tools, expand, read_bytes, read_tau2, read_tau_bench

#: A format's reader: a file, the ``--tools`` file and the file's name in the
#: import → its runs, each converted when asked for (a
#: :class:`~._import_model.Runs`) or all at once.
Reader = Callable[[Path, "Path | None", "str | None"], Sequence[Conversation]]

#: What a file's name ends with that its runs' task ids leave out.
_FILE_SUFFIX = re.compile(r"\.jsonl?(\.gz)?$")

#: Format name → (reader, file patterns a folder is searched for).
#: Every format reads its files gzipped too (by their magic bytes), and a
#: folder search finds both forms.
FORMATS: dict[str, tuple[Reader, tuple[str, ...]]] = {
    "tau-bench": (read_tau_bench, ("*.json", "*.json.gz")),
    "tau2": (read_tau2, ("*.json", "*.json.gz")),
    "openai-jsonl": (read_openai_jsonl, ("*.jsonl", "*.jsonl.gz")),
    "toolbench": (read_toolbench, ("*.json", "*.json.gz")),
}


@dataclass(frozen=True)
class FileImport:
    """What one file gave."""

    path: str
    runs: int  # runs written
    skipped: int  # runs already recorded (trace tables or journal), or repeated in this import
    candidates: int
    operations: int
    user_tool_calls: int
    failed_operations: int
    unanswered_operations: int = 0  # calls the source shows no result for (unknown_outcome)
    invalid: int = 0  # runs the source marks as not usable (ToolBench's valid_data: false), skipped
    unmatched_results: int = 0  # agent tool results that answer no call: kept as messages only
    recorded: int = 0  # of the skipped, those recorded before this import (the rest were given twice)


@dataclass
class ImportResult:
    files: list[FileImport] = field(default_factory=list)
    export_rows: dict[str, int] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return sum(f.runs for f in self.files)

    @property
    def skipped(self) -> int:
        """Runs not imported: already recorded, or marked not valid by their source."""
        return sum(f.skipped + f.invalid for f in self.files)

    @property
    def invalid(self) -> int:
        return sum(f.invalid for f in self.files)


@dataclass(frozen=True)
class _Source:
    """What an import reads: the format, its reader, the files, the ``--tools`` file."""

    fmt: str
    reader: Reader
    files: list[Path]
    tools: Path | None
    #: Each file's name in the import: its path below the folder given, or its own name.
    names: dict[Path, str]


def _refused(argument: str, reason: str, record: str | None = None) -> ImportInputError:
    """Bad input in an argument rather than in a file: named as a Python
    caller knows it (``fmt``, ``paths[1]``, ``decide``...), and kept as
    ``argument`` so that the command line can name its own option instead."""
    error = ImportInputError(argument, record, reason)
    error.argument = argument
    return error


def _path(value: Any, argument: str, what: str) -> Path:
    path = as_path(value)
    if path is None:
        raise _refused(argument, f"expected {what} (a str or os.PathLike), got {reprlib.repr(value)}")
    return path


def _sources(fmt: Any, paths: Any, tools: Any) -> _Source:
    """The format's reader, the files to read and the tools file, the
    arguments checked before any file is read. ``paths``: one path, or a
    list of them."""
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise _refused("fmt", f"unknown format {reprlib.repr(fmt)}; expected one of {', '.join(FORMATS)}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one path, not its characters
    elif not isinstance(paths, Iterable) or isinstance(paths, (bytes, Mapping)):
        raise _refused("paths", f"expected a file or folder path, or a list of them, got {reprlib.repr(paths)}")
    given = [_path(p, f"paths[{i}]", "a file or folder path") for i, p in enumerate(paths)]
    if not given:
        raise _refused("paths", "expected at least one file or folder, got none")
    tools_path = None if tools is None else _path(tools, "tools", "the path of a tools file")
    if tools_path is not None and not tools_path.is_file():
        raise _refused("tools", f"no such file {tools_path}")
    reader, patterns = FORMATS[fmt]
    # A folder of tau-bench or tau2 data holds its catalogues too (tools/):
    # they are read as catalogues, not as traces.
    skip = catalogue_in_tools if fmt in ("tau-bench", "tau2") else None
    found = list(expand(given, patterns, skip))
    return _Source(fmt, reader, [path for path, _ in found], tools_path, _distinct_names(found))


def _distinct_names(found: list[tuple[Path, str]]) -> dict[Path, str]:
    """Each file's name in the import, made distinct where two files in
    different folders share one but for their suffixes (``a/chats.jsonl``
    and ``b/chats.jsonl.gz`` named directly, or two folders' ``chats.jsonl``):
    such a name takes as many of the folders above it as tell them apart,
    so that their runs' default task ids differ."""
    names = dict(found)
    by_stem: dict[str, list[Path]] = defaultdict(list)
    for path, name in names.items():
        by_stem[_FILE_SUFFIX.sub("", name)].append(path)
    for paths in by_stem.values():
        above = {path: path.absolute().parts[:-len(PurePosixPath(names[path]).parts)] for path in paths}
        folders = set(above.values())
        if len(folders) < 2:
            continue  # one folder's chats.jsonl and chats.jsonl.gz: no folder tells them apart
        depth = next(d for d in range(1, max(map(len, folders)) + 1) if len({f[-d:] for f in folders}) == len(folders))
        names.update({path: "/".join((*folder[-depth:], names[path])) for path, folder in above.items()})
    return names


def _read_file(source: _Source, path: Path, lo: float = 0.0, hi: float = 1.0) -> tuple[int, list[Conversation], int]:
    """How many runs one file holds, those of the fraction ``[lo, hi)`` of
    them, converted and checked, and how many runs its source marks as not
    valid (skipped); :class:`ImportInputError` if the file, or a record of
    that part, is bad."""
    from loopledger.canonical import CanonicalJSONError, is_unicode

    fmt = source.fmt
    if not is_unicode(path.name):
        # The name is kept in each run's spec and shown in the trace tables.
        raise ImportInputError(str(path), None, "the file's name is not valid UTF-8; rename the file")
    try:
        runs = source.reader(path, source.tools, source.names.get(path))
        n = len(runs)
        invalid = getattr(runs, "invalid", 0)
        if not n and not invalid and not getattr(runs, "recognised", False):
            if not read_bytes(path).strip():
                return 0, [], 0  # an empty file of lines: no runs, nothing wrong (one of a folder's, say)
            raise ImportInputError(str(path), None, f"no runs in this file; is it {fmt}?")
        conversations = []
        for index in range(int(lo * n), int(hi * n)):  # the first bad record is the one named, in any part
            conv = runs[index]
            if not any(m.role == "assistant" for m in conv.messages):
                raise ImportInputError(str(path), conv.record, "no assistant message: nothing the agent decided")
            conversations.append(conv)
    except CanonicalJSONError as exc:
        # The readers check every field they keep; should one still hold a
        # value JSON cannot carry, it is bad input all the same.
        raise ImportInputError(str(path), None, f"a value cannot be stored as JSON ({exc})") from None
    # A file's invalid runs are counted once, by the share that reads its start.
    return n, conversations, invalid if lo == 0.0 else 0


def read_conversations(fmt: str, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
                       tools: str | os.PathLike[str] | None = None) -> list[tuple[Path, list[Conversation]]]:
    """Read and check every file; raise :class:`ImportInputError` on the first bad one."""
    source = _sources(fmt, paths, tools)
    return [(path, _read_file(source, path)[1]) for path in source.files]


def import_traces(fmt: str, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                  home: str | os.PathLike[str] | None = None, tools: str | os.PathLike[str] | None = None,
                  decide: Any = None) -> ImportResult:
    """Import external traces into the trace tables of ``home`` (default:
    ``$LOOPLEDGER_HOME``, else ``./loopledger-data``).

    ``decide``: a suite (name, file or :class:`~loopledger.validators.Suite`)
    whose decisions are recorded at import time as the runs' baseline; None
    records none (docs/importers.md, "Baseline"). ``paths``: a file or
    folder, or a list of them. A wrong argument is :class:`ImportInputError`
    naming it, before any file is read."""
    from loopledger.engine import Home, Recorder
    from loopledger.validators import SuiteError, load_suite

    home_path = None if home is None else _path(home, "home", "the path of a data folder")
    source = _sources(fmt, paths, tools)
    suite = None
    if decide is not None:
        try:
            suite = load_suite(decide)
        except SuiteError as exc:
            # The reference itself (``suite``) is the argument's fault; a
            # suite file's own place follows the argument's name.
            raise _refused("decide", exc.reason, None if exc.where == "suite" else exc.where) from None
    where = Home.resolve(home_path)
    done: tuple[list[FileImport], dict[str, Any]] | None = None
    if not where.journal_path.exists() and not where.traces.exists():
        # A new data folder: nothing to skip, so every file is read, checked
        # and converted before anything is made; bad input leaves no folder,
        # journal or traces behind.
        done = _write_all(_Job(source, suite, set(), set()))
    store = where.open_store()
    result = ImportResult()

    def build(known: Callable[[str, str], set[Any]]) -> dict[str, Any]:
        existing, artifacts = known("runs", "run_id") | store.run_ids(), known("artifacts", "artifact_id")
        # Done already, unless another process recorded something meanwhile.
        files_written, tables = done if done is not None and not existing and not artifacts \
            else _write_all(_Job(source, suite, existing, artifacts))
        result.files.extend(files_written)
        return tables

    try:
        result.export_rows = Recorder(store, where.traces).publish_import(build)
    finally:
        store.close()
    return result


@dataclass(frozen=True)
class _Job:
    source: _Source
    suite: Any
    existing: set[str]  # run ids already recorded (trace tables and journal)
    known_artifacts: set[str]  # artifact ids the trace tables hold


#: Below this many bytes of input an import is done in this process alone.
PARALLEL_FROM_BYTES = 1 << 20
#: The import under way, each process's share of it and the folder its tables
#: go back through, inherited by fork (see _write_all).
_SHARES: list[Any] = []

Piece = tuple[int, float, float]  # a file (its index) and the fraction of its runs [lo, hi) to write


def _write_all(job: _Job) -> tuple[list[FileImport], dict[str, Any]]:
    """Read, check and write every file of ``job``; return what each file
    gave and the trace tables' new rows.

    A large import is cut into one share of the input per core, by bytes of
    JSON (a file on a cut is shared: each side reads it and converts and
    writes its part of its runs), done by forked processes that inherit the
    job and hand their tables back as Arrow files, and put together here in
    order: the same rows as doing it all in one process.
    Should two processes write the same run (a run id repeated across the
    cut, which a single process imports once), the import is redone in one
    process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ._import_tables import concat_tables, load_tables

    _sweep_scratch()  # what killed imports left
    files = job.source.files
    sizes = [max(1, path.stat().st_size) for path in files]
    workers = min(os.cpu_count() or 1, len(files) * 4)
    if sum(sizes) < PARALLEL_FROM_BYTES or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return _in_one_process(job)
    shares = _cut([_json_bytes(path, size) for path, size in zip(files, sizes)], workers)
    # Each process hands its tables back as Arrow files in a scratch folder,
    # which this one maps into memory: pickled through a pipe, a share's 30 MB
    # of tables cost ~0.1 s of copying after the share was done.
    with _scratch_folder() as scratch:
        _SHARES[:] = [job, shares, scratch]
        # The forked processes share this one's objects until they write to
        # them, and a full collection there writes to every one it visits
        # (most of a share's collection time, and a copy of each page it
        # touches): frozen, they are left out of collections until the
        # processes are done.
        gc.freeze()
        try:
            with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("fork"),
                                     initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
                outcomes = list(pool.map(_write_share, range(len(shares))))
        finally:
            gc.unfreeze()
            _SHARES.clear()
        written = [run_ids for _, _, run_ids, _ in outcomes]
        if sum(map(len, written)) != len(set().union(*written)):
            return _in_one_process(job)  # a run written by two shares
        # Mapped, the files can go: what is mapped stays readable.
        parts = [load_tables(folder) for *_, folder in outcomes]
    counts: defaultdict[int, Counter[str]] = defaultdict(Counter)
    totals: dict[int, int] = {}
    for share_counts, share_totals, _, _ in outcomes:
        for index, counted in share_counts.items():
            counts[index].update(counted)
        totals.update(share_totals)
    return _file_imports(files, counts, totals), concat_tables(parts)


#: The shares' scratch folders: ``<temp>/loopledger-import-<random>``, each
#: holding a lock file its import keeps locked while it lives.
SCRATCH_PREFIX = "loopledger-import-"
_SCRATCH_LOCK = ".owner.lock"


@contextmanager
def _scratch_folder() -> Iterator[str]:
    """A scratch folder for the shares' tables, removed when the import is
    done. An import killed on the way (SIGKILL, a crash) cannot remove its
    own: it holds a lock on a file inside while it lives, and the next
    import removes every such folder whose lock it can take (the operating
    system lets go of a dead process's locks, whatever its pid and however
    processes see each other)."""
    import fcntl
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    lock = os.open(os.path.join(scratch, _SCRATCH_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock)


def _sweep_scratch() -> None:
    """Remove the scratch folders left by imports that are gone: those whose
    lock file nobody holds. A folder without one is being made: left alone."""
    import tempfile

    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        remove_if_abandoned(folder, folder / _SCRATCH_LOCK)


def _json_bytes(path: Path, size: int) -> int:
    """About how many bytes of JSON the file of ``size`` bytes holds, to
    weigh the shares: a gzip file's own record of its uncompressed size (its
    last four bytes, modulo 4 GiB), else its size. tau2's files compress 5
    to 15 times: cut by their gzip bytes, one share of the benchmark's tau2
    import had a third more work than the other."""
    try:
        with open(path, "rb") as handle:
            if size < 18 or handle.read(2) != b"\x1f\x8b":
                return size
            handle.seek(-4, os.SEEK_END)
            return max(1, int.from_bytes(handle.read(4), "little"))
    except OSError:
        return size  # reading it will say what is wrong


def _cut(sizes: list[int], parts: int) -> list[list[Piece]]:
    """``parts`` shares of about equal bytes, in file order."""
    total = sum(sizes)
    shares: list[list[Piece]] = []
    for k in range(parts):
        start, end = total * k / parts, total * (k + 1) / parts
        share, at = [], 0
        for index, size in enumerate(sizes):
            lo, hi = max(at, start), min(at + size, end)
            if lo < hi:
                share.append((index, (lo - at) / size, (hi - at) / size))
            at += size
        if share:
            shares.append(share)
    return shares


def _in_one_process(job: _Job) -> tuple[list[FileImport], dict[str, Any]]:
    from ._import_tables import TraceRows

    rows = TraceRows(job.known_artifacts)
    counts, totals, _ = _write_pieces(job, [(index, 0.0, 1.0) for index in range(len(job.source.files))], rows)
    return _file_imports(job.source.files, counts, totals), rows.tables()


def _write_share(number: int) -> tuple[Any, ...]:
    from ._import_tables import TraceRows, save_tables

    # A forked process that ends with the import: what it makes is kept to
    # the end (the rows) or freed as it is dropped, with no cycles to find.
    gc.disable()
    job, shares, scratch = _SHARES
    rows = TraceRows(job.known_artifacts)
    counts, totals, run_ids = _write_pieces(job, shares[number], rows)
    folder = os.path.join(scratch, str(number))
    save_tables(rows.tables(), folder)
    return counts, totals, run_ids, folder


def _write_pieces(job: _Job, pieces: Sequence[Piece], rows: Any) -> tuple[Any, dict[int, int], set[str]]:
    """Read and check each piece's file, and commit its new runs to ``rows``
    (a :class:`~._import_tables.TraceRows`); count what each file gave and
    return the run ids written."""
    from loopledger.canonical import CanonicalJSONError

    from ._import_writer import RunWriter

    counts: defaultdict[int, Counter[str]] = defaultdict(Counter)
    totals: dict[int, int] = {}
    seen: set[str] = set()
    existing = job.existing
    for index, lo, hi in pieces:
        # Only this piece's runs are converted and checked: those of a file
        # cut between shares are checked by one share or the other.
        totals[index], conversations, invalid = _read_file(job.source, job.source.files[index], lo, hi)
        counts[index]["invalid"] += invalid
        for conv in conversations:
            run_id = conv.run_id
            if run_id in existing or (existing and not existing.isdisjoint(conv.legacy_run_ids)):
                # One imported by an earlier version is known by its old id.
                counts[index]["recorded"] += 1
                continue
            if run_id in seen:
                continue  # a run repeated (in a file or across files) is imported once
            seen.add(run_id)
            counts[index]["runs"] += 1
            try:
                counts[index].update(RunWriter(rows, conv, job.suite).write())
            except CanonicalJSONError as exc:
                # What the readers' checks missed: bad input, named, never a traceback.
                raise ImportInputError(str(job.source.files[index]), conv.record,
                                       f"a value cannot be stored as JSON ({exc})") from None
    return counts, totals, seen


def _file_imports(files: list[Path], counts: Any, totals: dict[int, int]) -> list[FileImport]:
    out = []
    for index, path in enumerate(files):
        c = counts[index]
        out.append(FileImport(str(path), c["runs"], totals[index] - c["runs"], c["candidates"], c["operations"],
                              c["user_tool_calls"], c["failed"], c["unanswered"], c["invalid"], c["unmatched"],
                              c["recorded"]))
    return out
