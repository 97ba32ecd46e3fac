"""Kill a child process after its N-th journal commit, then resume: the
pieces the crash sweep and the recovery tests share."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from loopledger.engine import _faults
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import Scenario, parse_scenario
from loopledger.engine._states import TERMINAL, State
from loopledger.engine._waits import Reply, ReplyRejected, TokenClaims, issue_token, load_secret

PROMPT_VERSION = "v1"


def no_sleep(_: float) -> None:
    return None


def _child(home: Path, scenario: Scenario, crash_after: int, report: int) -> None:
    """In the forked child: drive one fresh run; never returns."""
    code = 0
    try:
        os.environ["LOOPLEDGER_CRASH_AFTER_COMMITS"] = str(crash_after)
        _faults._commits = 0  # counted per process, from this process' first commit
        runner = Runner(Home.resolve(home), sleep=no_sleep)
        run_id = runner.create(scenario, PROMPT_VERSION)
        runner.drive_all([run_id])
        runner.close()
        os.write(report, f"{_faults._commits}\n".encode())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        os.write(report, f"error {exc!r}\n".encode())
        code = 1
    finally:
        os._exit(code)


def run_child(home: Path, scenario: Scenario, crash_after: int) -> tuple[bool, str]:
    """Fork a child that drives one run; (killed by SIGKILL, what it reported)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(home, scenario, crash_after, write_end)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return killed, b"".join(chunks).decode().strip()


def resume_everything(runner: Runner) -> None:
    """``loopledger resume``, then the scenarios' scripted replies, until
    nothing moves: every run ends, or waits for a person the script does not
    answer (or whose scripted answer is refused)."""
    secret = load_secret(runner.home.root)
    refused: set[str] = set()
    while True:
        ids = [r.run_id for r in runner.store.list_runs(s for s in State if s not in TERMINAL)]
        runner.drive_all(ids)
        replied = False
        for run_id in ids:
            view = runner.controller.load(run_id)
            if view.state is not State.WAITING_USER or run_id in refused:
                continue
            script = load_spec_scenario(runner, run_id).user
            if view.replies >= len(script):
                continue
            w = view.waiting
            token = issue_token(secret, TokenClaims(run_id, w["wait_id"], w["state_version"], w["expires_at_us"]))
            entry = script[view.replies]
            try:
                runner.controller.reply(run_id, token, Reply(entry.approve, entry.answer))
            except ReplyRejected:
                refused.add(run_id)  # as the runner does: the run keeps waiting
            replied = True
        if not replied:
            runner.recorder.flush()
            return


def load_spec_scenario(runner: Runner, run_id: str) -> Scenario:
    return parse_scenario(runner.store.get_run(run_id).spec, source=f"run {run_id}", stored=True)
