"""The replay harness: ``replay(traces, suite)`` and ``replay_many(traces, suites)``.

1. Check the trace set (and the baseline) before any work: bad input is
   one :class:`ReplayInputError`, never a half-written replay.
2. Cut it into partitions by run with one streaming DuckDB pass
   (``_traces.write_partitions``), sized so a partition fits in a worker.
3. Replay the partitions on worker processes (``spawn``: a fresh
   interpreter, no threads inherited from DuckDB or polars), each writing
   its own part files of ``decisions``, ``diffs`` and ``loop_diagnoses``.
4. Assemble the per-run results, write the ``summary`` row, and publish
   ``replays/<id>.partial`` as ``replays/<id>`` by one rename, so a replay
   that died half-way is never found as a baseline.

Nothing here imports a model adapter or opens a connection: a replay is a
pure function of the traces and the suite.
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from loopledger._args import as_path
from loopledger._procs import die_with_parent, remove_if_abandoned

from ._errors import BaselineNotFound, ReplayInputError, SuiteNotFound, TracesError, WorkerLost
from ._result import REPLAY_ID, ReplayResult, RunReplay, Summary
from ._traces import (BASELINE_COLUMNS, TraceSet, _files_sql, check_verdicts, open_traces, table_files,
                      write_partitions)
from ._worker import Job, SuiteRef, remember, run_job, warm

#: Candidates per partition: a partition's rows (bodies included) are held
#: in one worker's memory, so this bounds a worker's footprint.
PART_CANDIDATES = 20_000
#: Below this many candidates the replay runs in the caller's process:
#: starting worker interpreters would cost more than it saves.
IN_PROCESS_BELOW = 5_000
#: With several processes, at least this many partitions per process.
PARTS_PER_PROCESS = 4

SuiteLike = Any  # a bundled name, a YAML path, "pkg.mod:attr", or a validators.Suite


def new_replay_id() -> str:
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def _got(value: Any) -> str:
    """A wrong argument as an error message shows it: short, whatever it is."""
    return reprlib.repr(value)


def _path(value: Any, argument: str, expected: str) -> Path:
    path = as_path(value)
    if path is None:
        raise ReplayInputError(argument, f"expected {expected} (a str or os.PathLike), got {_got(value)}")
    return path


def _listed(value: Any, argument: str, single: tuple[type, ...], what: str) -> list[tuple[str, Any]]:
    """``value`` as (argument name, item) pairs: one item of a ``single``
    type is a list of one (``replay_many(traces, "strict")``), a list's items
    are named ``argument[i]``."""
    if isinstance(value, single):
        return [(argument, value)]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return [(f"{argument}[{i}]", item) for i, item in enumerate(value)]
    raise ReplayInputError(argument, f"expected {what}, got {_got(value)}")


@dataclass(frozen=True)
class _Request:
    """A replay's arguments, checked by :func:`_checked`."""

    traces: Path
    #: (result key, suite, how the workers load it), one per suite.
    suites: tuple[tuple[str, Any, SuiteRef], ...]
    baseline: str
    replays: Path  # where baselines are found, and results written when ``write``
    write: bool
    workers: int | None
    ids: tuple[str, ...]
    #: The argument each id came from (``replay_id``, ``replay_ids[1]``).
    id_arguments: tuple[str, ...]


def _checked(traces: Any, suites: list[tuple[str, Any]], baseline: Any, write_to: Any, workers: Any,
             replay_ids: list[tuple[str, Any]] | None) -> _Request:
    """Every argument checked before any work: a wrong one is one
    :class:`ReplayInputError` naming it as the caller spelled it (``suite``,
    ``suites[1]``, ``replay_ids[0]``...) and what was expected. ``suites``
    and ``replay_ids`` come as (argument name, value) pairs."""
    root = _path(traces, "traces", "the path of a traces folder")
    if not isinstance(baseline, str) or not baseline:
        raise ReplayInputError("baseline", f"expected 'recorded' or the id of a finished replay, got {_got(baseline)}")
    if baseline != "recorded" and not REPLAY_ID.fullmatch(baseline):
        raise BaselineNotFound("baseline", f"{baseline!r} is not a replay id; expected 'recorded' or the id of "
                                           "a finished replay")
    write = write_to is not None
    replays = _path(write_to, "write_to", "the path of a replays folder") if write else root.parent / "replays"
    if write and replays.exists() and not replays.is_dir():
        raise ReplayInputError("write_to", f"{replays} is not a folder; expected the folder to write replays into")
    target, folder = replays.resolve(), root.resolve()
    if write and (target == folder or folder in target.parents):
        # Its tables would be read as the traces' own the next time.
        raise ReplayInputError("write_to", f"{replays} is {'' if target == folder else 'in '}the traces folder "
                                           f"{root}; expected a folder outside it, e.g. {root.parent / 'replays'}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ReplayInputError("workers", f"expected a whole number >= 1 (None: automatic), got {_got(workers)}")
    if not suites:
        raise SuiteNotFound("suites", "expected at least one suite")
    if replay_ids is not None and len(replay_ids) != len(suites):
        raise ReplayInputError("replay_ids", f"expected one id per suite ({len(suites)}), got {len(replay_ids)}")
    ids = _new_ids(replay_ids, replays if write else None) if replay_ids else tuple(new_replay_id() for _ in suites)
    arguments = tuple(a for a, _ in replay_ids) if replay_ids else ("replay_id",) * len(ids)
    return _Request(root, _loaded(suites), baseline, replays, write, workers, ids, arguments)


def _new_ids(replay_ids: list[tuple[str, Any]], replays: Path | None) -> tuple[str, ...]:
    """The caller's replay ids: plain names, each once, none already under ``replays``."""
    seen: set[str] = set()
    for argument, rid in replay_ids:
        if not isinstance(rid, str) or not REPLAY_ID.fullmatch(rid) or rid.endswith(".partial"):
            raise ReplayInputError(argument, "expected a plain name (letters, digits, _ . - :, not starting with "
                                             f"'.' nor ending in .partial, at most 128 characters), got {_got(rid)}")
        if rid in seen:
            raise ReplayInputError(argument, f"{rid!r} is given twice; expected one id per suite")
        seen.add(rid)
        if replays is not None and (replays / rid).exists():
            raise ReplayInputError(argument, f"a replay {rid!r} already exists in {replays}; expected a new id")
        if replays is not None and (replays / f"{rid}.partial").exists():
            _sweep(replays)  # a killed replay's folder frees its id
            if (replays / f"{rid}.partial").exists():
                raise ReplayInputError(argument, f"{replays / rid}.partial exists: a replay with this id is under "
                                                 "way (or was killed less than a minute ago); expected a new id")
    return tuple(rid for _, rid in replay_ids)


def _loaded(suites: list[tuple[str, Any]]) -> tuple[tuple[str, Any, SuiteRef], ...]:
    """Each suite loaded, with its key in the results: its name, or
    ``name@version`` when an earlier suite has the name. The same suite
    (name and version) twice is refused: it would be one result."""
    out: list[tuple[str, Any, SuiteRef]] = []
    keys: dict[str, str] = {}  # result key -> the argument that has it
    versions: dict[tuple[str, str], str] = {}  # (name, version) -> the argument that has it
    for argument, ref in suites:
        suite, how = _load(ref, argument)
        key = f"{suite.name}@{suite.version}" if suite.name in keys else suite.name
        same = versions.get((suite.name, suite.version)) or keys.get(key)
        if same is not None:
            raise ReplayInputError(argument, f"{_got(ref)} is suite {suite.name!r} {suite.version}, as {same} is; "
                                             "expected each suite once")
        keys[key] = versions[(suite.name, suite.version)] = argument
        out.append((key, suite, how))
    return tuple(out)


def _load(suite: SuiteLike, argument: str) -> tuple[Any, SuiteRef]:
    from loopledger.validators import Suite, SuiteError, get_factory, load_suite

    if isinstance(suite, Suite):
        modules = tuple(sorted({get_factory(m.name, m.version).fn.__module__ for m in suite.members}))
        return suite, SuiteRef(None, suite.to_dict(), modules)
    try:
        loaded = load_suite(suite)
    except SuiteError as exc:
        # ``suite``: the reference itself is wrong, named as the caller named it;
        # otherwise the suite's file (or object) and field.
        raise SuiteNotFound(argument if exc.where == "suite" else exc.where, exc.reason) from None
    return loaded, SuiteRef(os.fspath(suite))


def _baseline_files(traces: TraceSet, baseline: str, replays: Path) -> list[Path]:
    if baseline == "recorded":
        return list(traces.tables["validations"].files)
    folder = replays / baseline
    if not baseline.endswith(".partial") and (folder / "decisions").is_dir() and not (folder / "summary").is_dir():
        raise TracesError(str(folder / "summary"), f"baseline replay {baseline!r} has no summary table; expected the "
                                                   "summary it wrote (the replay's files were changed)")
    if baseline.endswith(".partial") or not (folder / "summary").is_dir():
        # A .partial folder is a replay that never finished: never a baseline.
        known = sorted(p.name for p in replays.iterdir()
                       if not p.name.endswith(".partial") and (p / "summary").is_dir()) if replays.is_dir() else []
        hint = ""
        if known:
            hint = (f"; finished replays: {', '.join(known)}" if len(known) <= 5
                    else f"; the newest 5 of {len(known)} finished replays: {', '.join(known[-5:])}")
        raise BaselineNotFound("baseline", f"no finished replay {baseline!r} under {replays}{hint}")
    decisions = table_files(folder / "decisions", "decisions", BASELINE_COLUMNS, versioned=False)
    _check_whole(baseline, folder, decisions.rows)
    files = list(decisions.files)
    _check_overlap(traces, baseline, folder, files)
    return files


def _check_whole(baseline: str, folder: Path, held: int) -> None:
    """The baseline's decisions are all those it made, as its summary counts
    them: rows lost (a file deleted, a table rewritten) would drop out of the
    comparison, and the gate would pass on less than was decided."""
    try:
        counted = read_summary(folder)["decisions"]
    except (OSError, ValueError, IndexError, KeyError):  # pyarrow's errors are either; IndexError: no row
        raise TracesError(str(folder / "summary"), f"baseline replay {baseline!r} has no readable summary row "
                                                   "with its 'decisions' count; expected the summary it wrote") from None
    if held != counted:
        raise TracesError(str(folder / "decisions"), f"baseline replay {baseline!r}: its summary counts {counted} "
                                                     f"decisions, its decisions table holds {held}; expected the "
                                                     "table it wrote (the replay's files were changed)")


def _check_overlap(traces: TraceSet, baseline: str, folder: Path, files: Sequence[Path]) -> None:
    """An earlier replay that decided on none of these traces' runs would
    compare nothing (what it did not decide on is not compared): refused,
    naming the traces it replayed, or the runs it could not replay. (Some
    runs in common is normal: traces grow.)"""
    import duckdb

    runs, decided = traces.tables["runs"].files, files
    if not runs or not decided:
        return
    counts = duckdb.sql(
        f"SELECT count(*), count(*) FILTER (WHERE b.run_id IN (SELECT run_id FROM {_files_sql(runs)})) "
        f"FROM (SELECT DISTINCT run_id FROM {_files_sql(decided)}) b").fetchone()
    if counts is None or counts[1] > 0:
        return
    refused = f"replay {baseline!r} covers none of the runs in {traces.root}"
    if counts[0] > 0:
        try:
            other = json.loads((folder / "replay.json").read_text(encoding="utf-8")).get("traces", "?")
        except (OSError, ValueError):
            other = "?"
        raise BaselineNotFound("baseline", f"{refused}: it shares no run with them (it replayed {other}); "
                                           "expected a replay of these traces")
    # It decided nothing. Its runs never validated a candidate: still a
    # replay of them. Its runs could not be replayed: a baseline of nothing.
    try:
        summary = read_summary(folder)
    except (OSError, ValueError, IndexError):  # pyarrow's errors are either; IndexError: no row
        return
    if summary.get("run_errors"):
        raise BaselineNotFound("baseline", f"{refused}: it made no decision, {summary['run_errors']} of its "
                                           f"{summary.get('runs', '?')} run(s) could not be replayed; expected "
                                           "a replay that decided on these runs")


def replay(traces: str | os.PathLike[str], suite: SuiteLike, *, baseline: str = "recorded",
           write_to: str | os.PathLike[str] | None = None, workers: int | None = None,
           replay_id: str | None = None) -> ReplayResult:
    """Re-run ``suite`` over every validated candidate in ``traces`` (a
    ``<home>/traces`` folder) and compare with ``baseline``: ``"recorded"``
    (the decisions the engine made) or the id of an earlier replay under
    ``write_to`` (default: the ``replays`` folder beside ``traces``).

    ``write_to``: the replays folder to write ``<replay_id>/<table>/`` into;
    None writes nothing. ``workers``: processes (default: one per core for
    large trace sets, the caller's own process for small ones).
    ``replay_id``: a plain name not yet in ``write_to`` (:data:`REPLAY_ID`);
    default: a new one. A wrong argument is one :class:`ReplayInputError`
    naming it, raised before any work."""
    request = _checked(traces, [("suite", suite)], baseline, write_to, workers,
                       None if replay_id is None else [("replay_id", replay_id)])
    (result,) = _replay(request).values()
    return result


def replay_many(traces: str | os.PathLike[str], suites: SuiteLike | Sequence[SuiteLike], *,
                baseline: str = "recorded", write_to: str | os.PathLike[str] | None = None,
                workers: int | None = None, replay_ids: Sequence[str] | None = None) -> Mapping[str, ReplayResult]:
    """Replay several suites over the same traces in one pass (each run is
    read and rebuilt once, then judged by every suite): one result per
    suite, keyed by the suite's name (``name@version`` for a second suite of
    that name). A single suite is a list of one; the same suite (name and
    version) twice is refused. ``replay_ids``: one per suite, as ``replay``'s
    ``replay_id``. The mapping is read-only, as the results are frozen."""
    from loopledger.validators import Suite

    named_suites = _listed(suites, "suites", (str, os.PathLike, Suite), "a suite or a list of suites")
    named_ids = None if replay_ids is None else _listed(replay_ids, "replay_ids", (str,), "a list of replay ids")
    return MappingProxyType(_replay(_checked(traces, named_suites, baseline, write_to, workers, named_ids)))


def _replay(request: _Request) -> dict[str, ReplayResult]:
    started = time.perf_counter()
    # Held until the traces are partitioned: exports wait, so every file read
    # belongs to one consistent set (see ReadLock).
    from loopledger.engine._recorder import ReadLock

    reading = ReadLock(request.traces)
    try:
        return _replay_locked(request, reading, started)
    finally:
        reading.release()


def _replay_locked(request: _Request, reading: Any, started: float) -> dict[str, ReplayResult]:
    baseline, replays = request.baseline, request.replays
    trace_set = open_traces(request.traces, need_validations=baseline == "recorded")
    if trace_set.tables["runs"].rows == 0:
        # A gate over nothing would pass: in CI, the traces were not there.
        raise TracesError(str(trace_set.root / "runs"), "no run recorded (the table is empty); expected the runs "
                                                        "to replay (record them with run, import or export first)")
    baseline_files = _baseline_files(trace_set, baseline, replays)
    check_verdicts("validations" if baseline == "recorded" else "decisions", baseline_files)
    check_verdicts("labels", trace_set.tables["labels"].files)
    ids = request.ids
    outputs: list[Path | None] = [replays / f"{rid}.partial" if request.write else None for rid in ids]
    n = trace_set.candidates
    cores = os.cpu_count() or 1
    procs = request.workers if request.workers is not None else (1 if n < IN_PROCESS_BELOW else cores)
    if procs > 1 and (unreachable := _interactive_members(request)):
        if request.workers is not None:
            raise ReplayInputError("workers", f"{', '.join(unreachable)} is defined in this interactive session "
                                              "(python -c, a REPL, a notebook), which worker processes cannot import; "
                                              "expected workers=1, or the validator in a module")
        procs = 1  # automatic: the caller's process alone can run them
    # Several partitions per process, handed out one at a time: the caller's
    # process starts at once while the spawned ones are still importing, and
    # whichever is faster takes more.
    parts = max(procs * PARTS_PER_PROCESS if procs > 1 else 1, math.ceil(n / PART_CANDIDATES), 1)
    holds = _Holds()
    if request.write:
        try:
            replays.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReplayInputError("write_to", f"cannot make the folder {replays} ({exc.strerror or exc})") from None
        _sweep(replays)
    refs = tuple(ref for _, _, ref in request.suites)
    work: Path | None = None
    pool: ProcessPoolExecutor | None = None
    results: dict[str, ReplayResult] = {}
    #: The ``<id>.partial`` folders this replay made (never another's, which
    #: a refused claim found in its way), each listed the moment it exists:
    #: a signal at any point after it leaves none behind.
    claimed: list[Path] = []
    try:
        if request.write:
            _claim_outputs(outputs, ids, request.id_arguments, holds, claimed)
        for _, suite, ref in request.suites:
            remember(ref, ids, suite)
        work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=replays if request.write else None))
        holds.take(work)
        if procs > 1:
            pool = _start_pool(procs - 1, refs, ids)
        write_partitions(trace_set, baseline_files, work, parts, threads=cores)
        reading.release()  # the partitions are the replay's own copy
        jobs = [Job(work, k, refs, ids, tuple(outputs), True, baseline == "recorded") for k in range(parts)]
        per_suite: list[list[RunReplay]] = [[] for _ in request.suites]
        for partial in _run(jobs, pool, procs - 1):
            for i, runs in enumerate(partial):
                per_suite[i].extend(runs)
        seconds = time.perf_counter() - started
        for (key, suite, _), rid, out, runs in zip(request.suites, ids, outputs, per_suite):
            runs.sort(key=lambda r: r.run_id)
            summary = _summary(rid, suite, baseline, runs, seconds)
            path = _publish(out, summary, suite, trace_set.root) if out is not None else None
            results[key] = ReplayResult(summary, MappingProxyType({r.run_id: r for r in runs}), path)
    except BaseException:
        # Whatever failed, no unfinished replay is left behind (those
        # published already are whole, and stay).
        for out in claimed:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        holds.release()
    return results


#: The folder a replay partitions the traces into, beside its outputs.
WORK_PREFIX = ".replay-work-"
#: A working folder younger than this is never swept: its replay locks it
#: the moment it makes it, so an unlocked one this old was left by a replay
#: that was killed.
SWEEP_AFTER_S = 60.0


class _Holds:
    """The replay's working folders (``<id>.partial``, its work folder),
    each locked (``flock`` on the folder) while the replay lives: the kernel
    drops the locks of a process that was killed, which is how a later
    replay tells those folders from the ones of a replay under way."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def take(self, folder: Path) -> None:
        import fcntl

        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fds.append(fd)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _sweep(replays: Path) -> None:
    """Remove the working folders that killed replays left in ``replays``
    (an interrupted replay's ``<id>.partial``, whose id is then free again,
    and its work folder): unlocked, and older than :data:`SWEEP_AFTER_S`."""
    now = time.time()
    for folder in replays.iterdir():
        if not (folder.name.endswith(".partial") or folder.name.startswith(WORK_PREFIX)):
            continue
        try:
            young = not folder.is_dir() or now - folder.stat().st_mtime < SWEEP_AFTER_S
        except OSError:
            continue
        if not young:
            remove_if_abandoned(folder, folder)


def _claim_outputs(outputs: Sequence[Path | None], ids: Sequence[str], arguments: Sequence[str],
                   holds: _Holds, made: list[Path]) -> None:
    """Make each replay's ``<id>.partial`` folder, which is its claim on
    the id, and add it to ``made`` at once: a second replay given the same
    id at the same moment finds the folder made (or the finished replay, if
    the first one was quicker) and is refused before it writes anything. On
    refusal, the folders this call made are removed again; nobody else's
    are touched."""
    try:
        for out, rid, argument in zip(outputs, ids, arguments):
            if out is None:
                continue
            try:
                out.mkdir()
            except FileExistsError:
                raise ReplayInputError(argument, f"{out} exists: a replay with this id is under way (or was "
                                                    "killed less than a minute ago); expected a new id") from None
            made.append(out)
            holds.take(out)
            final = out.with_name(rid)
            if final.exists():
                raise ReplayInputError(argument, f"a replay {rid!r} already exists in {out.parent}; "
                                                    "expected a new id")
    except BaseException:
        for out in made:
            shutil.rmtree(out, ignore_errors=True)
        made.clear()
        holds.release()
        raise


def _interactive_members(request: _Request) -> list[str]:
    """The suites' validators defined in an interactive ``__main__`` (no
    file to import again): spawned worker processes never see them."""
    import sys

    from loopledger.validators import get_factory

    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None):
        return []
    return sorted({m.name for _, suite, _ in request.suites for m in suite.members
                   if get_factory(m.name, m.version).fn.__module__ == "__main__"})


def _start_pool(size: int, refs: tuple[SuiteRef, ...], replay_ids: tuple[str, ...]) -> ProcessPoolExecutor:
    """Spawned worker processes, started now so that their interpreters
    import and load the suites while the traces are being partitioned."""
    import multiprocessing

    # spawn, not fork: the parent may hold DuckDB's and polars' thread pools,
    # which a forked child would inherit half-locked.
    pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))
    for _ in range(size):
        pool.submit(warm, refs, replay_ids)
    return pool


def _run(jobs: Sequence[Job], pool: ProcessPoolExecutor | None, remote: int) -> list[list[list[RunReplay]]]:
    """Run every job: in this process, and on ``remote`` pool processes when
    there is a pool. Each side takes the next partition when it is free."""
    if pool is None:
        return [run_job(job) for job in jobs]
    pending = deque(jobs)
    lock = threading.Lock()
    results: list[list[list[RunReplay]]] = []
    failures: list[BaseException] = []

    def take() -> Job | None:
        with lock:
            return pending.popleft() if pending and not failures else None

    def feed() -> None:
        # One thread per pool process: it waits (without the GIL) while the
        # process replays, so the pool is never left without work.
        try:
            while (job := take()) is not None:
                results.append(pool.submit(run_job, job).result())
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
            with lock:
                failures.append(exc)

    feeders = [threading.Thread(target=feed, daemon=True) for _ in range(remote)]
    for t in feeders:
        t.start()
    try:
        while (job := take()) is not None:
            results.append(run_job(job))
    except BaseException:
        with lock:
            pending.clear()
        raise
    finally:
        for t in feeders:
            t.join()
    if failures:
        if isinstance(failures[0], BrokenProcessPool):
            raise WorkerLost(str(failures[0]) or type(failures[0]).__name__) from None
        raise failures[0]
    return results


def _summary(replay_id: str, suite: Any, baseline: str, runs: Sequence[RunReplay], seconds: float) -> Summary:
    diffs = [d for r in runs for d in r.diffs]
    flips = [d for d in diffs if not d.candidate_level]
    return Summary(
        replay_id=replay_id,
        suite_name=suite.name,
        suite_version=suite.version,
        baseline=baseline,
        runs=len(runs),
        candidates=sum(r.candidates for r in runs),
        candidates_rerun=sum(r.candidates_rerun for r in runs),
        decisions=sum(r.decisions for r in runs),
        flips=len(flips),
        candidate_flips=sum(1 for d in diffs if d.candidate_level),
        regressions=sum(1 for d in diffs if d.kind == "regression"),
        fixes=sum(1 for d in diffs if d.kind == "fix"),
        changes=sum(1 for d in diffs if d.kind == "change"),
        flips_across_versions=sum(1 for d in flips if d.across_versions),
        runs_diverged=sum(1 for r in runs if r.diverged),
        not_in_baseline=sum(r.not_in_baseline for r in runs),
        not_recorded=sum(r.not_recorded for r in runs),
        baseline_suites=len({v for r in runs for v in r.baseline_suites}),
        runs_failed=sum(1 for r in runs if r.run_failed),
        run_errors=sum(1 for r in runs if r.error is not None),
        diagnoses=sum(len(r.diagnoses) for r in runs),
        labels=sum(r.labels for r in runs),
        labels_agreeing=sum(r.labels_agreeing for r in runs),
        seconds=round(seconds, 3),
    )


def _publish(out: Path, summary: Summary, suite: Any, traces: Path) -> Path:
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    import polars as pl

    row = dataclasses.asdict(summary)
    types = {str: (pl.Utf8, pa.string()), int: (pl.Int64, pa.int64()), float: (pl.Float64, pa.float64())}
    kinds = {name: types[type(value)] for name, value in row.items()}
    # Built by polars, cast to the Arrow schema: pyarrow's conversion of
    # Python values imports pandas, a fixed cost for one row.
    frame = pl.DataFrame([pl.Series(name, [value], kinds[name][0]) for name, value in row.items()])
    table = frame.to_arrow().cast(pa.schema([pa.field(name, kinds[name][1]) for name in row]))
    (out / "summary").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "summary" / "summary.parquet", compression="zstd")
    meta = {"replay_id": summary.replay_id, "suite": suite.to_dict(), "suite_version": suite.version,
            "baseline": summary.baseline, "traces": str(traces.resolve())}
    (out / "replay.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    final = out.with_name(out.name.removesuffix(".partial"))
    os.replace(out, final)
    return final


def read_summary(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The summary row of a written replay (``replays/<id>``)."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(path) / "summary").to_pylist()[0]
