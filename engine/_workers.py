"""Driving runs in several processes: ``loopledger run --workers N``.

Threads share one interpreter, so a runner's Python work (validation,
building artifacts, the engine's bookkeeping) uses one core however many
runs it drives at once. With ``workers`` > 1 the runs are dealt out to that
many worker processes, each a :class:`Runner` of its own on the same data
directory, driving its share with ``concurrency / workers`` threads. The
journal keeps its promises across processes as it does across threads:
every commit is a compare-and-set under SQLite's write lock, and each
process gathers its own concurrent commits into one fsync.

Workers start from multiprocessing's fork server, which imports the engine
once: they never inherit the caller's connections, locks or threads. Each
reports back through its own pipe the runs it settled (for the progress
bar), the resume tokens of the waits it began (shown once, by the caller)
and the scripted replies it saw refused. A worker that dies (a crash hook's
SIGKILL, the OOM killer) leaves its runs where their last commit put them,
for ``loopledger resume``; the caller reports it as an infrastructure
failure.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import EngineError
from ._home import Home


class WorkerFailed(EngineError):
    """A worker process died or failed; its runs stay resumable."""

    code = "worker_failed"


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its own runner (pickled to it). The fork
    server was started once, maybe long before: a worker takes the caller's
    environment (crash hooks, ``LOOPLEDGER_NOW``, model keys) and working
    directory as they are now, not as the server inherited them."""

    home: Home
    auto_reply: bool
    backend: Callable[[Path], Any]
    export: bool
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: str = field(default_factory=os.getcwd)


def _work(spec: WorkerSpec, run_ids: Sequence[str], concurrency: int, wait_for_tools: bool, pipe: Any) -> None:
    """A worker's whole life: drive ``run_ids``, report, exit."""
    from ._runner import Runner

    try:
        os.environ.clear()
        os.environ.update(spec.environ)
        os.chdir(spec.cwd)
        runner = Runner(spec.home, auto_reply=spec.auto_reply, backend=spec.backend, export=spec.export)
        try:
            runner.drive_all(run_ids, concurrency, on_settled=lambda run_id: pipe.send(("settled", run_id)),
                             wait_for_tools=wait_for_tools)
        finally:
            runner.close()
        pipe.send(("done", runner.tokens, runner.rejections, time.process_time()))
    except BaseException:
        pipe.send(("failed", traceback.format_exc()))
    finally:
        pipe.close()


@dataclass
class WorkersReport:
    """What the workers of one ``drive_in_workers`` call saw."""

    tokens: dict[str, str] = field(default_factory=dict)  # resume tokens of the waits they began
    rejections: dict[str, str] = field(default_factory=dict)  # why scripted replies were refused
    cpu_s: float = 0.0  # CPU seconds the workers used, in all


def drive_in_workers(
    spec: WorkerSpec,
    run_ids: Sequence[str],
    concurrency: int,
    workers: int,
    on_settled: Callable[[str], None] | None,
    wait_for_tools: bool,
) -> WorkersReport:
    """Deal ``run_ids`` out to ``workers`` processes and wait for all of
    them. Raises :class:`WorkerFailed` once every worker has stopped, if any
    failed."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "loopledger.engine._runner"])
    shares = [list(run_ids[k::workers]) for k in range(min(workers, len(run_ids)))]
    threads = max(1, -(-concurrency // len(shares)))
    running: dict[Any, Any] = {}
    for share in shares:
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_work, args=(spec, share, threads, wait_for_tools, send),
                                  name="loopledger-worker", daemon=True)
        process.start()
        send.close()
        running[receive] = process
    report = WorkersReport()
    failures: list[str] = []
    finished: set[Any] = set()
    while running:
        for receive in wait(list(running)):
            try:
                message = receive.recv()
            except EOFError:
                process = running.pop(receive)
                process.join()
                if receive not in finished:
                    failures.append(f"worker {process.pid} died (exit code {process.exitcode})")
                continue
            kind = message[0]
            if kind == "settled" and on_settled is not None:
                on_settled(message[1])
            elif kind == "done":
                report.tokens.update(message[1])
                report.rejections.update(message[2])
                report.cpu_s += message[3]
                finished.add(receive)
            elif kind == "failed":
                failures.append(message[1].rstrip())
                finished.add(receive)
    if failures:
        raise WorkerFailed("; ".join(failures) + " (its runs stay resumable: loopledger resume)")
    return report
