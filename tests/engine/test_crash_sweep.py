"""The crash sweep: every bundled scenario with a side effect, killed by
SIGKILL after each of its journal commits, then resumed.

For a scenario, an uninterrupted child process first counts the commits a
run of it makes (``LOOPLEDGER_CRASH_AFTER_COMMITS`` counts per process:
the run's creation, every transition and event commit, the recorder's
export bookkeeping). Then, for every N from 1 to that count, a forked child
builds a ``Runner`` on the scenario's data directory, creates one run and
drives it (scripted replies included) with ``LOOPLEDGER_CRASH_AFTER_COMMITS=N``;
it dies right after its N-th commit. The parent resumes in-process as
``loopledger resume`` does (a fresh ``Runner(..., auto_reply=False)``,
``drive_all`` over every non-terminal run), and delivers the scenario's
remaining scripted ``user:`` replies through ``Controller.reply``, the path
a person's reply takes. The resume token was shown once, to the process
that died; the parent, holding the data directory's secret, signs the same
token for the recorded wait, as the person who received it would present.

After every kill point:

* the journal, the demo backends and the Parquet traces satisfy the
  CONTRACT's hard rules (``all_violations``): one terminal state entered
  from FINALIZING, contiguous seq, one terminal result per tool request, no
  side effect executed twice for one idempotency key, Parquet = journal;
* the run is terminal, or waits legitimately: the wait its scenario expects,
  or a person's word on a send whose backend cannot confirm whether it ran
  (the deploy API); a send the backend confirms never ran is sent again;
* a terminal run ends as its scenario expects (status, reason, side effects
  per tool, decisions), except where the crash landed between a faulted
  call's dispatch commit and its send: then the fault, bound to the call
  number, was never delivered, the re-send meets a healthy backend, and only
  the hard rules are checked.

The sweep runs the scenarios on two worker processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crash_kit import no_sleep, resume_everything, run_child
from invariants import all_violations
from loopledger.engine._controller import CONFIRM_SCHEMA
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import Scenario, load_scenario
from loopledger.engine._states import TERMINAL, State
from loopledger.engine._tools import TOOL_TRAITS

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "datasets" / "scenarios"
SIDE_EFFECT_TOOLS = frozenset(
    {"payments.refund", "workspace.write_file", "orders.update_address", "reports.export", "deploy.service"})
WORKERS = 2
TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


def has_side_effect(scenario: Scenario) -> bool:
    if SIDE_EFFECT_TOOLS & set(scenario.expect.side_effects):
        return True
    scripts = scenario.model.values() if isinstance(scenario.model, dict) else [scenario.model]
    return any(call.name.split("@")[0] in SIDE_EFFECT_TOOLS
               for script in scripts for entry in script for call in entry.tool_calls)


SWEPT = sorted(p.stem for p in SCENARIOS.glob("*.yaml") if has_side_effect(load_scenario(p)))


def crash_point(home: Path, scenario: Scenario, n: int, known: set[str]) -> dict[str, Any]:
    killed, report = run_child(home, scenario, n)
    runner = Runner(Home.resolve(home), auto_reply=False, sleep=no_sleep)
    try:
        every = {r.run_id for r in runner.store.list_runs()}
        new = every - known
        known |= every
        point: dict[str, Any] = {"n": n, "killed": killed, "report": report, "new_runs": sorted(new)}
        if len(new) != 1:
            return point
        (run_id,) = new
        resume_everything(runner)
        record = runner.store.get_run(run_id)
        outcome = runner.outcome(run_id, scenario)
        ops = {op["operation_id"]: op for op in runner.store.operations(run_id)}
        faulted = {f.tool for f in scenario.faults}
        displaced = any(
            e.kind == "transition" and e.to_state == "RECONCILING" and e.payload.get("why") == "in_flight_at_restart"
            and ops[e.payload["operation_id"]]["tool"] in faulted
            for e in runner.store.events(run_id)
        )
        waiting = record.waiting or {}
        confirm_executions, confirmable = None, None
        if record.state is State.WAITING_USER and waiting.get("schema") == CONFIRM_SCHEMA:
            op = ops[waiting["operation_id"]]
            confirm_executions = runner.backend.execution_count(op["idempotency_key"])
            confirmable = TOOL_TRAITS[op["tool"]].confirms_after_timeout
        # The crash moved an injected fault: the call it was to fail took
        # effect when sent again, so the script's retry of that call repeats
        # an effect, which a person is asked to approve (repeated_side_effect).
        repeat_asked = (record.state is State.WAITING_USER and waiting.get("kind") == "approval" and any(
            v["validator"] == "repeated_side_effect" and v["verdict"] == "ask" and int(v["step"]) == record.step
            for v in runner.store.facts("validations", run_id)))
        # The scenario's expect.decisions, as labels on the candidates the
        # run reached (written before the terminal state: a crash just after
        # it must not lose them).
        reached = {(int(c["step"]), int(c["attempt"])) for c in runner.store.facts("candidates", run_id)}
        labelled = {(lb["step"], lb["attempt"], lb["validator"]) for lb in runner.store.labels(run_id)
                    if lb["source"] == "scenario"}
        missing_labels = [(d.step, d.attempt, d.validator) for d in scenario.expect.decisions
                          if (d.step, d.attempt) in reached and (d.step, d.attempt, d.validator) not in labelled]
        point.update(
            missing_labels=missing_labels,
            run_id=run_id, state=record.state.value, reason=record.reason, mismatches=outcome.mismatches,
            displaced=displaced, repeat_asked=repeat_asked, confirm_question=confirm_executions is not None,
            confirm_executions=confirm_executions, confirmable=confirmable,
        )
    finally:
        runner.close()
    point["violations"] = all_violations(home)
    return point


def sweep(name: str, base: str) -> dict[str, Any]:
    """Count the commits of an uninterrupted run, then kill after each one."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    home = Path(base) / name
    killed, report = run_child(home, scenario, 10**9)
    if killed or not report.isdigit():
        return {"name": name, "commits": None, "error": report, "points": []}
    commits = int(report)
    runner = Runner(Home.resolve(home), auto_reply=False)
    known = {r.run_id for r in runner.store.list_runs()}
    runner.close()
    points = [crash_point(home, scenario, n, known) for n in range(1, commits + 1)]
    return {"name": name, "commits": commits, "points": points, "expect_status": scenario.expect.status}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    # A process killed by SIGKILL leaves the page cache behind: what it
    # committed survives without reaching the disk. So the sweep may keep its
    # data directories in memory (tmpfs), where fsync costs nothing.
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK)
    base = Path(tempfile.mkdtemp(prefix="loopledger-sweep-", dir=shm)) if in_memory else tmp_path_factory.mktemp("sweep")
    try:
        # Not "fork": the test process may hold threads (pytest-xdist's), and a
        # child forked while one of them holds a lock can hang on it.
        context = multiprocessing.get_context("forkserver")
        with context.Pool(WORKERS) as pool:
            results = pool.starmap(sweep, [(name, str(base)) for name in SWEPT])
        yield {r["name"]: r for r in results}
    finally:
        if in_memory:
            shutil.rmtree(base, ignore_errors=True)


def test_the_sweep_covers_every_side_effect_scenario() -> None:
    # Every bundled scenario that names or scripts a side-effecting tool.
    assert len(SWEPT) >= 25
    for expected in ("happy-refund", "happy-write-file", "happy-update-address", "background-export",
                     "approval-deploy-approved", "fault-timeout-after-commit", "unknown-outcome-asks-person"):
        assert expected in SWEPT


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEPT)
def test_a_crash_after_any_commit_then_resume_keeps_the_hard_rules(swept: dict[str, dict[str, Any]],
                                                                     name: str) -> None:
    result = swept[name]
    assert result["commits"], f"the uninterrupted run failed: {result.get('error')}"
    points = result["points"]
    assert [p["n"] for p in points] == list(range(1, result["commits"] + 1))
    for p in points:
        where = f"{name}, killed after commit {p['n']}"
        # The child died by SIGKILL right after its N-th commit (it makes as
        # many commits as the uninterrupted run, unless timing added polls).
        assert p["killed"] or (p["report"].isdigit() and int(p["report"]) < p["n"]), f"{where}: {p['report']}"
        assert len(p["new_runs"]) == 1, f"{where}: {p['new_runs']}"
        assert p["violations"] == [], f"{where}: {p['violations']}"
        if p["state"] in TERMINAL_NAMES:
            assert p["missing_labels"] == [], f"{where}: scenario labels lost: {p['missing_labels']}"
            if not p["displaced"]:
                assert p["mismatches"] == [], f"{where}: {p['mismatches']}"
            continue
        # Not terminal: only a legitimate wait for a person.
        assert p["state"] == "WAITING_USER", f"{where}: left {p['state']}"
        if p["confirm_question"]:
            # Reconciliation asks a person only about a send that never ran,
            # and only when its backend cannot say so (or the scenario's own
            # re-send timed out again): a send the backend confirms never ran
            # is sent again after a crash, however often the crash landed.
            assert p["confirm_executions"] == 0, where
            assert not p["confirmable"] or result["expect_status"] == "WAITING_USER", where
        elif p["displaced"] and p["repeat_asked"]:
            continue  # the fault's call took effect when sent again; its scripted retry asks a person
        else:
            assert p["mismatches"] == [], f"{where}: {p['mismatches']}"



@pytest.mark.slow
def test_sweep_coverage(swept: dict[str, dict[str, Any]]) -> None:
    """Every kill point of every swept scenario ran; how many, for the docs."""
    total = sum(len(r["points"]) for r in swept.values())
    displaced = sum(1 for r in swept.values() for p in r["points"] if p.get("displaced"))
    waits = sum(1 for r in swept.values() for p in r["points"] if p.get("confirm_question"))
    print(f"\ncrash sweep: {len(swept)} scenarios, {total} crash points "
          f"({displaced} moved an injected fault, {waits} ended asking a person to confirm a send)")
    for name, result in sorted(swept.items()):  # the table of docs/crash-recovery.md
        print(f"| `{name}` | {result['commits']} |")
    assert total >= 300
    assert all(r["commits"] and len(r["points"]) == r["commits"] for r in swept.values())


# -- the named crash points, through the real command line -------------------------------

REFUND_FIRST = """\
id: crash-refund
description: the refund is the run's first send
contract:
  goal: Refund order ORD-1041 in full
  required_evidence: ["refund_confirmed:ORD-1041"]
  allowed_tools: [payments.refund]
model:
  - tool_calls: [{name: payments.refund, arguments: {order_id: ORD-1041, amount: 25.0}}]
  - final: Refund of 25.00 issued for ORD-1041.
    claims: [{text: refunded, evidence: ["refund_confirmed:ORD-1041"]}]
expect: {status: SUCCEEDED, reason: completed, side_effects: {payments.refund: 1}}
"""


def loopledger(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_CRASH")}
    merged.update(env or {})
    cmd = [sys.executable, "-c", "from loopledger._cli import main; main()", *args, "--home", str(home)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=merged)


@pytest.mark.parametrize("point", ["after_dispatch", "before_terminal"])
def test_a_named_crash_point_then_resume_finishes_with_one_refund(tmp_path: Path, point: str) -> None:
    scenario = tmp_path / "crash-refund.yaml"
    scenario.write_text(REFUND_FIRST)
    home = tmp_path / "home"

    died = loopledger("run", str(scenario), "--json", home=home, env={"LOOPLEDGER_CRASH_AT": point})
    assert died.returncode == -signal.SIGKILL, died.stderr
    journal = sqlite3.connect(home / "journal.sqlite")
    ((run_id, state),) = journal.execute("SELECT run_id, state FROM runs").fetchall()
    assert state == ("TOOL_RUNNING" if point == "after_dispatch" else "FINALIZING")
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    executions = "SELECT COUNT(*) FROM executions WHERE run_id = ? AND tool = 'payments.refund'"
    assert backend.execute(executions, (run_id,)).fetchone() == (1,), "the refund ran before the crash"

    resumed = loopledger("resume", "--json", home=home)
    assert resumed.returncode == 0, resumed.stderr
    (line,) = [json.loads(x) for x in resumed.stdout.splitlines()]
    assert (line["run_id"], line["status"], line["reason"]) == (run_id, "SUCCEEDED", "completed")

    assert backend.execute(executions, (run_id,)).fetchone() == (1,), "exactly one refund"
    (key, dispatches, outcome), = journal.execute(
        "SELECT idempotency_key, dispatch_count, outcome FROM operations WHERE run_id = ?", (run_id,)).fetchall()
    assert (dispatches, outcome) == (1, "success"), "reconciled, never sent again"
    assert backend.execute("SELECT COUNT(*) FROM deliveries WHERE idempotency_key = ?", (key,)).fetchone() == (1,)
    moves = [row for row in journal.execute(
        "SELECT from_state, to_state, payload_json FROM events WHERE run_id = ? AND kind = 'transition' ORDER BY seq",
        (run_id,))]
    if point == "after_dispatch":
        # The resumed process found the send in flight and asked the backend first.
        reconcile = [json.loads(p) for f, t, p in moves if t == "RECONCILING"]
        assert reconcile == [{"operation_id": reconcile[0]["operation_id"], "why": "in_flight_at_restart"}]
    assert [(f, t) for f, t, _ in moves if t in TERMINAL_NAMES] == [("FINALIZING", "SUCCEEDED")]
    assert all_violations(home) == []
