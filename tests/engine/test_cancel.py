"""``loopledger cancel``: pending work is cancelled, then the run ends
``CANCELLED``, or ``CANCEL_UNKNOWN`` where a backend cannot confirm the stop;
a run that already ended, or that does not exist, is refused (exit 1)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from invariants import all_violations
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenario
from loopledger.engine._states import State

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

DEPLOY = """\
id: cancel-deploy
contract:
  goal: Deploy checkout 1.5.0
  required_evidence: ["deployed:checkout"]
  allowed_tools: [deploy.service]
model:
  - tool_calls: [{name: deploy.service, arguments: {service: checkout, version: 1.5.0}}]
  - final: Deployed.
    claims: [{text: deployed, evidence: ["deployed:checkout"]}]
"""


READ_NOTES = """\
id: read-notes
contract:
  goal: Read the notes
  required_evidence: [file_read]
  allowed_tools: [workspace.read_file]
model:
  - tool_calls: [{name: workspace.read_file, arguments: {path: README.md}}]
  - final: Read it.
    claims: [{text: read, evidence: ["file_read:README.md"]}]
"""


def export_scenario(delay_s: float) -> str:
    """The model starts an export and answers at once: the run waits for the
    export in WAITING_TOOL (docs/tools.md: from 60 s on, the batch cluster
    cannot confirm a cancel)."""
    return f"""\
id: cancel-export-{int(delay_s)}
contract:
  goal: Export the yearly report
  required_evidence: [report_ready]
  allowed_tools: [reports.export]
model:
  - tool_calls: [{{name: reports.export, arguments: {{query: yearly, delay_s: {delay_s}}}}}]
  - final: The yearly report is ready.
    claims: [{{text: ready, evidence: [report_ready]}}]
"""


def refund_scenario(scenario_id: str, order: str) -> str:
    """One full refund of ``order``, then a final answer."""
    return f"""\
id: {scenario_id}
contract:
  goal: Refund {order}
  required_evidence: [refund_confirmed]
  allowed_tools: [payments.refund]
model:
  - tool_calls: [{{name: payments.refund, arguments: {{order_id: {order}, amount: 25.0}}}}]
  - final: Refunded.
    claims: [{{text: refunded, evidence: [refund_confirmed]}}]
"""


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}, **(env or {})}
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=120, env=env)


def run_state(home: Path, run_id: str) -> tuple[str, str]:
    conn = sqlite3.connect(home / "journal.sqlite")
    return conn.execute("SELECT state, reason FROM runs WHERE run_id = ?", (run_id,)).fetchone()


def events(home: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(home / "journal.sqlite")
    rows = conn.execute("SELECT payload_json FROM events WHERE run_id = ? AND kind = ? ORDER BY seq", (run_id, kind))
    return [json.loads(p) for (p,) in rows]


def waiting_for_export(tmp_path: Path, home: Path, delay_s: float) -> str:
    """A run left in WAITING_TOOL, as ``loopledger resume`` leaves one whose
    background work is still running."""
    path = tmp_path / "export.yaml"
    path.write_text(export_scenario(delay_s))
    runner = Runner(Home.resolve(home))
    try:
        run_id = runner.create(load_scenario(path), "v1")
        runner.drive_all([run_id], wait_for_tools=False)
        assert runner.store.get_run(run_id).state is State.WAITING_TOOL
    finally:
        runner.close()
    return run_id


def test_cancel_a_run_waiting_for_approval(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY)
    started = cli("run", str(path), "--json", home=home)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    assert run_state(home, run_id) == ("WAITING_USER", "waiting_for_approval")

    proc = cli("cancel", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    assert "CANCELLED" in proc.stdout
    assert run_state(home, run_id) == ("CANCELLED", "cancelled")
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("cancelled", "CANCELLED")
    conn = sqlite3.connect(home / "journal.sqlite")
    assert conn.execute("SELECT outcome, dispatch_count FROM operations WHERE run_id = ?",
                        (run_id,)).fetchall() == [("cancelled", 0)]
    assert conn.execute("SELECT waiting_json FROM runs WHERE run_id = ?", (run_id,)).fetchone() == (None,)
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    assert backend.execute("SELECT COUNT(*) FROM deliveries").fetchone() == (0,)
    assert len(events(home, run_id, "cancel_requested")) == 1
    assert all_violations(home) == []

    # Already terminal: refused, the run unchanged; the request is kept as a late event.
    again = cli("cancel", run_id, home=home)
    assert again.returncode == 1
    assert "already ended" in again.stderr and "CANCELLED" in again.stderr and "Traceback" not in again.stderr
    assert len(events(home, run_id, "cancel_requested")) == 1
    assert [e["kind"] for e in events(home, run_id, "late_event")] == ["cancel_requested"]
    assert run_state(home, run_id) == ("CANCELLED", "cancelled")
    assert all_violations(home) == []


def test_cancel_of_long_background_work_that_cannot_confirm_its_stop_is_cancel_unknown(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_id = waiting_for_export(tmp_path, home, 120)
    proc = cli("cancel", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    assert run_state(home, run_id) == ("CANCEL_UNKNOWN", "cancelled")
    (done,) = events(home, run_id, "work_completed")
    assert (done["state"], done["error_code"]) == ("cancel_unconfirmed", "CANCEL_UNCONFIRMED")
    conn = sqlite3.connect(home / "journal.sqlite")
    # The operation's tool status follows the work; its request's result stays background_accepted.
    assert conn.execute("SELECT status, outcome FROM operations WHERE operation_id = ?",
                        (done["operation_id"],)).fetchone() == ("cancel_unconfirmed", "background_accepted")
    # The model's early answer went through FINALIZING into WAITING_TOOL; the
    # cancel's is the last entry into FINALIZING, naming what nobody could stop.
    (payload,) = conn.execute(
        "SELECT payload_json FROM events WHERE run_id = ? AND kind = 'transition' AND to_state = 'FINALIZING'"
        " ORDER BY seq DESC LIMIT 1", (run_id,)).fetchone()
    assert json.loads(payload)["unconfirmed"] == [done["operation_id"]]
    assert json.loads(payload)["status"] == "CANCEL_UNKNOWN"
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    state, requested = backend.execute("SELECT state, cancel_requested_at FROM work WHERE work_id = ?",
                                       (done["work_id"],)).fetchone()
    assert state == "running" and requested is not None, "the batch cluster only queued the cancel"
    assert all_violations(home) == []


def test_cancel_of_short_background_work_stops_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_id = waiting_for_export(tmp_path, home, 30)
    proc = cli("cancel", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    assert run_state(home, run_id) == ("CANCELLED", "cancelled")
    (done,) = events(home, run_id, "work_completed")
    assert (done["state"], done["error_code"]) == ("cancelled", "CANCELLED")
    assert sqlite3.connect(home / "journal.sqlite").execute(
        "SELECT status, outcome FROM operations WHERE operation_id = ?", (done["operation_id"],)
    ).fetchone() == ("cancelled", "background_accepted")
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    assert backend.execute("SELECT state FROM work WHERE work_id = ?", (done["work_id"],)).fetchone() == ("cancelled",)
    assert all_violations(home) == []


def test_cancel_of_a_finished_run_and_of_an_unknown_run_exit_1(tmp_path: Path) -> None:
    home = tmp_path / "home"
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "happy-read-file.yaml"
    started = cli("run", str(scenario), "--json", home=home)
    assert started.returncode == 0, started.stderr
    line = json.loads(started.stdout)
    assert line["status"] == "SUCCEEDED"
    finished = cli("cancel", line["run_id"], home=home)
    assert finished.returncode == 1 and "already ended" in finished.stderr
    assert run_state(home, line["run_id"]) == ("SUCCEEDED", "completed")
    assert events(home, line["run_id"], "cancel_requested") == []
    # The request that came after the end is kept, as a late event, in the traces too.
    assert [e["kind"] for e in events(home, line["run_id"], "late_event")] == ["cancel_requested"]
    late = pq.read_table(home / "traces" / "events").to_pylist()
    assert [e["kind"] for e in late if e["run_id"] == line["run_id"] and e["kind"] == "late_event"] == ["late_event"]

    unknown = cli("cancel", "no-such-run", home=home)
    assert unknown.returncode == 1
    assert "no-such-run" in unknown.stderr and "Traceback" not in unknown.stderr


def test_cancel_after_the_background_work_ended_records_how_it_ended(tmp_path: Path) -> None:
    """Nothing is left to stop: the work's end (here, success) is recorded
    as a poll would have, and the run still ends CANCELLED, as asked."""
    home = tmp_path / "home"
    run_id = waiting_for_export(tmp_path, home, 0.2)
    time.sleep(0.4)  # the export is done; nobody has polled it
    proc = cli("cancel", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    assert run_state(home, run_id) == ("CANCELLED", "cancelled")
    (done,) = events(home, run_id, "work_completed")
    assert (done["state"], done["error_code"]) == ("succeeded", None)
    assert done["evidence"] and done["evidence"][0]["kind"] == "report_ready"
    assert sqlite3.connect(home / "journal.sqlite").execute(
        "SELECT status FROM operations WHERE operation_id = ?", (done["operation_id"],)).fetchone() == ("succeeded",)
    assert all_violations(home) == []


def race_a_cancel(tmp_path: Path, scenario: str,
                  other_acts: Callable[[Runner, str], Any]) -> tuple[Path, str, Any, list[Any], list[str]]:
    """Drive a run of ``scenario`` in this process; while its first send is
    out, another runner on the same home records a cancel and then does
    ``other_acts(other, run_id)``. Returns the home, the run id, the
    driver's last view, what the other's act returned and the tools sent;
    the journal keeps the hard rules and exports."""
    home = tmp_path / "home"
    path = tmp_path / "scenario.yaml"
    path.write_text(scenario)
    driver, other = Runner(Home.resolve(home)), Runner(Home.resolve(home))
    acted: list[Any] = []
    sent: list[str] = []
    try:
        run_id = driver.create(load_scenario(path), "v1")
        execute = driver.backend.execute

        def execute_while_the_other_cancels(req: Any) -> Any:
            sent.append(req.tool)
            if len(sent) == 1:
                assert other.controller.request_cancel(run_id)
                acted.append(other_acts(other, run_id))
            return execute(req)

        driver.backend.execute = execute_while_the_other_cancels  # type: ignore[method-assign]
        view = driver.controller.drive(run_id)
    finally:
        driver.close()
        other.close()
    assert cli("export", home=home).returncode == 0
    assert all_violations(home) == []
    return home, run_id, view, acted, sent


def test_a_cancel_while_another_process_drives_the_run_is_carried_out_by_that_process(tmp_path: Path) -> None:
    """While this process's tool call is out, another records a cancel: it
    cannot drive the run meanwhile (one driver at a time), and this process
    meets the request at its next commit and cancels the run itself."""
    _, _, view, seen_by_other, _ = race_a_cancel(
        tmp_path, READ_NOTES, lambda other, run_id: other.controller.drive(run_id).state)  # left to the driver
    assert seen_by_other == [State.TOOL_RUNNING]
    assert view.state in (State.CANCELLED, State.CANCEL_UNKNOWN)


def test_a_run_another_process_ended_meanwhile_is_left_as_it_ended(tmp_path: Path) -> None:
    """Whatever ends the run while this process's tool call is out (here a
    driver that does not take the claim), this process's next move is kept
    as a late event, and its drive returns the run as it ended instead of
    raising."""
    home, run_id, view, ended_by_other, _ = race_a_cancel(
        tmp_path, READ_NOTES, lambda other, run_id: other.controller._drive(run_id).state)  # without the claim
    assert ended_by_other == [view.state] and view.state in (State.CANCELLED, State.CANCEL_UNKNOWN)
    assert run_state(home, run_id)[0] == view.state.value
    assert events(home, run_id, "late_event")


def test_a_send_the_other_process_cancelled_is_never_made(tmp_path: Path) -> None:
    """While this process reads the order, another cancels the run and ends
    it (here without taking the claim, as a process that could not see it
    would); the refund after the read was recorded cancelled. This process
    must not send it: its own commits now land on an ended run, are kept
    as late events, and stop it (it used to record the read's result and
    the refund's dispatch as late events and then send the refund)."""
    home, _, view, _, sent = race_a_cancel(tmp_path, """\
id: read-then-refund
contract:
  goal: Refund part of ORD-1032
  required_evidence: [refund_confirmed]
  allowed_tools: [orders.get_order, payments.refund]
model:
  - tool_calls:
      - {name: orders.get_order, arguments: {order_id: ORD-1032}}
      - {name: payments.refund, arguments: {order_id: ORD-1032, amount: 10.0}}
  - final: Refunded.
    claims: [{text: refunded, evidence: [refund_confirmed]}]
""", lambda other, run_id: other.controller._drive(run_id))
    # The read was in flight when the other cancelled, without the run's
    # claim: its sender may still be sending, so nobody could confirm it.
    assert view.state is State.CANCEL_UNKNOWN and sent == ["orders.get_order"]
    executions = sqlite3.connect(home / "demo_backend.sqlite").execute(
        "SELECT count(*) FROM executions WHERE tool = 'payments.refund'").fetchone()[0]
    assert executions == 0


@pytest.mark.parametrize(("crash", "ending"), [
    # After the refund's dispatch was recorded, before it was sent: the
    # backend has no record of the key and its sender is gone, so it never
    # took effect (as reconciliation would take it): cancelled.
    ({"LOOPLEDGER_CRASH_AFTER_COMMITS": "3"}, ("CANCELLED", "cancelled")),
    # After the backend executed it: its recorded result is the request's one result.
    ({"LOOPLEDGER_CRASH_AT": "after_dispatch"}, ("CANCELLED", "success")),
])
def test_a_cancel_settles_a_send_whose_answer_was_never_recorded(tmp_path: Path, crash: dict[str, str],
                                                                 ending: tuple[str, str]) -> None:
    """The process died with the refund in flight. A cancel asks the backend
    by key, and no operation is left without its one result (it used to
    stay ``running`` in a CANCEL_UNKNOWN run, for ever)."""
    home = tmp_path / "home"
    path = tmp_path / "refund.yaml"
    path.write_text(refund_scenario("refund-in-flight", "ORD-1033"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    crashed = subprocess.run([*CLI, "run", str(path), "--json", "--home", str(home)], capture_output=True, text=True,
                             timeout=120, env={**env, **crash})
    assert crashed.returncode != 0
    journal = sqlite3.connect(home / "journal.sqlite")
    (run_id,) = [r for (r,) in journal.execute("SELECT run_id FROM runs")]
    assert journal.execute("SELECT status FROM operations").fetchall() == [("running",)]
    assert cli("cancel", run_id, home=home).returncode == 0
    outcome = journal.execute("SELECT outcome FROM operations WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert (run_state(home, run_id)[0], outcome) == ending
    executed = sqlite3.connect(home / "demo_backend.sqlite").execute(
        "SELECT count(*) FROM executions WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert executed == (1 if outcome == "success" else 0)
    assert cli("export", home=home).returncode == 0
    assert all_violations(home) == []


def _drive_forever(home: str, run_id: str, ready: Any) -> None:
    """A child that has taken the run up (holds its claim) and is killed there."""
    from loopledger.engine._home import Home as ChildHome
    from loopledger.engine._runner import Runner as ChildRunner

    runner = ChildRunner(ChildHome.resolve(Path(home)))
    assert runner.store.claim(run_id)
    ready.set()
    time.sleep(600)


def test_resume_leaves_a_run_another_process_drives_and_takes_it_once_that_one_is_gone(tmp_path: Path) -> None:
    """Two drivers of one run could each send its refund (a resume racing a
    reply did): a run another process drives is left to it."""
    import multiprocessing

    home = tmp_path / "home"
    path = tmp_path / "read.yaml"
    path.write_text(READ_NOTES)
    runner = Runner(Home.resolve(home))
    try:
        run_id = runner.create(load_scenario(path), "v1")  # READY, not driven yet
    finally:
        runner.close()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=_drive_forever, args=(str(home), run_id, ready))
    child.start()
    try:
        assert ready.wait(120)
        assert cli("resume", home=home).returncode == 0
        assert run_state(home, run_id)[0] == "READY"  # left to the process that drives it
    finally:
        child.kill()
        child.join()
    assert cli("resume", home=home).returncode == 0
    assert run_state(home, run_id) == ("SUCCEEDED", "completed")
    assert all_violations(home) == []


def test_cancel_of_a_run_past_cancelling_says_how_it_ended(tmp_path: Path) -> None:
    """A run in FINALIZING has its outcome decided and committed: the cancel
    is recorded, the run ends as decided, and the command says so (exit 1,
    as for a run that had already ended), not that it was cancelled."""
    home = tmp_path / "home"
    path = tmp_path / "read.yaml"
    path.write_text(READ_NOTES)
    killed = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_CRASH_AT": "before_terminal"})
    assert killed.returncode == -9
    (run_id,) = [r for (r,) in sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id FROM runs")]
    assert run_state(home, run_id)[0] == "FINALIZING"
    proc = cli("cancel", run_id, home=home)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"run {run_id} ended SUCCEEDED (completed) before the cancellation could take effect" in proc.stderr
    assert "cancelled" not in proc.stdout
    assert run_state(home, run_id) == ("SUCCEEDED", "completed")
    assert all_violations(home) == []


def test_a_cancel_lands_on_a_run_another_process_is_busy_driving(tmp_path: Path) -> None:
    """``run`` drives a long run, committing every few milliseconds; a
    ``cancel`` from another process must not lose every compare-and-set
    race to it (it used to wait for the run to end on its own, then say it
    had already ended): the driver meets the request and cancels the run."""
    calls = "\n".join(f"  - tool_calls: [{{name: workspace.write_file, arguments: {{path: exports/n{i}.txt, "
                      "content: x}}]" for i in range(600))
    path = tmp_path / "long.yaml"
    path.write_text(f"""\
id: many-writes
contract:
  goal: Write the notes
  required_evidence: [file_written]
  allowed_tools: [workspace.write_file]
budgets: {{max_steps: 1000, max_tool_calls: 1000}}
model:
{calls}
  - final: Done.
    claims: [{{text: done, evidence: [file_written]}}]
""")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    driver = subprocess.Popen([*CLI, "run", str(path), "--json", "--home", str(home)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        began = time.monotonic()
        while True:
            assert time.monotonic() - began < 60 and driver.poll() is None, driver.communicate()
            try:
                row = sqlite3.connect(f"file:{home / 'journal.sqlite'}?mode=ro", uri=True).execute(
                    "SELECT run_id, step FROM runs").fetchone()
            except sqlite3.OperationalError:  # not made yet, or not migrated yet
                row = None
            if row and row[1] >= 20:
                break
            time.sleep(0.05)
        run_id = row[0]
        cancelled = cli("cancel", run_id, home=home)
        out, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert cancelled.returncode == 0, (cancelled.stdout, cancelled.stderr)
    assert driver.returncode == 0, err
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["status"] in ("CANCELLED", "CANCEL_UNKNOWN"), line
    assert run_state(home, run_id)[0] == line["status"]
    written = sqlite3.connect(home / "demo_backend.sqlite").execute(
        "SELECT count(*) FROM executions WHERE run_id = ?", (run_id,)).fetchone()[0]
    assert written < 600
    assert [e for e in events(home, run_id, "late_event") if e.get("kind") == "cancel_requested"] == []
    assert all_violations(home) == []


@pytest.mark.parametrize("asked", ["reply", "token"])
def test_a_run_whose_cancel_is_pending_takes_no_reply_and_no_new_token(tmp_path: Path, asked: str) -> None:
    """The cancel is recorded where it cannot be carried out (here: only
    recorded, as from a data directory sharing the journal); a reply or a
    new token then is refused, and the run is cancelled by the process
    that was asked (it used to accept the approval and ignore it)."""
    from loopledger.engine._waits import Reply, ReplyRejected

    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY)
    runner = Runner(Home.resolve(home), auto_reply=False)
    try:
        run_id = runner.create(load_scenario(path), "v1")
        runner.drive_all([run_id])
        token = runner.tokens[run_id]
        assert runner.controller.request_cancel(run_id)
        with pytest.raises(ReplyRejected) as refused:
            if asked == "reply":
                runner.controller.reply(run_id, token, Reply(approve=True))
            else:
                runner.controller.reissue_token(run_id)
        assert refused.value.reason == "cancelled" and "CANCELLED" in refused.value.detail
        assert runner.store.get_run(run_id).state is State.CANCELLED
    finally:
        runner.close()
    assert events(home, run_id, "reply_accepted") == [] and events(home, run_id, "token_reissued") == []
    assert sqlite3.connect(home / "demo_backend.sqlite").execute("SELECT COUNT(*) FROM executions").fetchone() == (0,)
    assert cli("export", home=home).returncode == 0
    assert all_violations(home) == []


def test_background_work_accepted_by_a_send_in_flight_at_the_cancel_is_stopped(tmp_path: Path) -> None:
    """The cancel lands while the export's send is out; the send's answer
    (work accepted) is recorded from the backend, and then that work is
    stopped like any pending work (it used to be left running under a
    CANCELLED run: the in-flight send was settled after the work was)."""
    home, run_id, view, _, sent = race_a_cancel(
        tmp_path, export_scenario(5), lambda other, run_id: other.controller.drive(run_id).state)
    assert sent == ["reports.export"] and view.state is State.CANCELLED
    (completed,) = events(home, run_id, "work_completed")
    assert completed["state"] == "cancelled"
    (result,) = events(home, run_id, "operation_result")
    assert result["outcome"] == "background_accepted"


def test_a_cancel_is_recorded_while_the_tool_backend_is_held_by_a_stalled_send(tmp_path: Path) -> None:
    """The cancel is recorded through the journal before the tool backend
    is opened: a driver stalled inside a send may hold that backend (it
    used to wait for it, then fail with exit 3 having recorded nothing)."""
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY)
    started = cli("run", str(path), "--json", home=home)
    run_id = json.loads(started.stdout)["run_id"]
    backend = sqlite3.connect(home / "demo_backend.sqlite", isolation_level=None)
    backend.execute("BEGIN EXCLUSIVE")  # as a send in progress would hold it
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.Popen([*CLI, "cancel", run_id, "--home", str(home)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        began = time.monotonic()
        while not events(home, run_id, "cancel_requested"):
            assert time.monotonic() - began < 30 and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert proc.poll() is None, "the cancel goes on to carry the request out"
    finally:
        backend.execute("ROLLBACK")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert run_state(home, run_id) == ("CANCELLED", "cancelled")


def test_a_cancel_after_the_wait_ran_out_comes_too_late(tmp_path: Path) -> None:
    """The run's deadline ended the wait before the cancel was asked for:
    the run ends as that says (BUDGET_EXHAUSTED / deadline, not CANCELLED,
    whichever command touches it first), and the cancel exits 1."""
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY.replace("model:", "budgets: {deadline_s: 60}\nmodel:"))
    started = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": "2030-01-01T00:00:00+00:00"})
    run_id = json.loads(started.stdout)["run_id"]
    late = cli("cancel", run_id, home=home, env={"LOOPLEDGER_NOW": "2030-01-01T00:05:00+00:00"})
    assert late.returncode == 1 and "already ended: BUDGET_EXHAUSTED (deadline)" in late.stderr, late.stderr
    assert run_state(home, run_id) == ("BUDGET_EXHAUSTED", "deadline")
    assert events(home, run_id, "cancel_requested") == []
    assert all_violations(home) == []


def test_nothing_is_sent_after_a_cancel_recorded_between_dispatch_and_send(tmp_path: Path) -> None:
    """The refund's dispatch is written, then a cancel comes in before the
    send: the send does not go out (it used to, the driver meeting the
    cancel only at its next commit); the call is settled as never sent."""
    home = tmp_path / "home"
    path = tmp_path / "refund.yaml"
    path.write_text(refund_scenario("refund-then-cancel", "ORD-1034"))
    driver, other = Runner(Home.resolve(home)), Runner(Home.resolve(home))
    sent: list[str] = []
    try:
        run_id = driver.create(load_scenario(path), "v1")
        holds, execute = driver.store.still_holds, driver.backend.execute

        def cancel_before_the_send(run: str) -> bool:
            if not sent and driver.store.operations(run):
                sent.append("checked")
                assert other.controller.request_cancel(run)
            return holds(run)

        def execute_spy(req: Any) -> Any:
            sent.append(req.tool)
            return execute(req)

        driver.store.still_holds = cancel_before_the_send  # type: ignore[method-assign]
        driver.backend.execute = execute_spy  # type: ignore[method-assign]
        view = driver.controller.drive(run_id)
    finally:
        driver.close()
        other.close()
    assert sent == ["checked"] and view.state is State.CANCELLED
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("cancelled", "CANCELLED")
    assert sqlite3.connect(home / "demo_backend.sqlite").execute("SELECT count(*) FROM executions").fetchone() == (0,)
    assert cli("export", home=home).returncode == 0
    assert all_violations(home) == []


def test_the_calls_a_cancel_never_sent_are_settled_in_one_commit(tmp_path: Path) -> None:
    """A step of many calls waits for the first one's approval; the cancel
    records every call's one result with the move to FINALIZING, in one
    commit (it used to make a commit, an fsync, per call)."""
    writes = "\n".join(f"      - {{name: workspace.write_file, arguments: {{path: exports/n{i}.txt, content: x}}}}"
                       for i in range(40))
    path = tmp_path / "many.yaml"
    path.write_text(f"""\
id: deploy-then-writes
contract:
  goal: Deploy, then write the notes
  allowed_tools: [deploy.service, workspace.write_file]
budgets: {{max_tool_calls: 100}}
model:
  - tool_calls:
      - {{name: deploy.service, arguments: {{service: checkout, version: 1.5.0}}}}
{writes}
  - final: Done.
""")
    home = tmp_path / "home"
    runner = Runner(Home.resolve(home), auto_reply=False)
    try:
        run_id = runner.create(load_scenario(path), "v1")
        runner.drive_all([run_id])
        assert runner.store.get_run(run_id).state is State.WAITING_USER
        commits: list[int] = []
        store_commit = runner.store.commit

        def counted(*chain: Any) -> Any:
            commits.append(len(chain))
            return store_commit(*chain)

        runner.store.commit = counted  # type: ignore[method-assign]
        assert runner.controller.request_cancel(run_id)
        assert runner.controller.drive(run_id).state is State.CANCELLED
    finally:
        runner.close()
    assert len(commits) == 2 and commits[0] == 42, commits  # 41 results + FINALIZING, then the terminal state
    assert len(events(home, run_id, "operation_result")) == 41
    assert cli("export", home=home).returncode == 0
    assert all_violations(home) == []


def test_reply_token_and_cancel_take_a_unique_start_of_a_run_id(tmp_path: Path) -> None:
    """As ``show`` does (and git with a commit): a start of one run's id is
    that run; a start of several is refused, naming them, and changes
    nothing."""
    home = tmp_path / "home"
    for name in ("deploy-one", "deploy-two"):
        (tmp_path / f"{name}.yaml").write_text(DEPLOY.replace("id: cancel-deploy", f"id: {name}"))
    started = cli("run", str(tmp_path / "deploy-one.yaml"), str(tmp_path / "deploy-two.yaml"), "--json", home=home)
    lines = {json.loads(x)["task_id"]: json.loads(x) for x in started.stdout.splitlines()}
    one, two = lines["deploy-one"]["run_id"], lines["deploy-two"]["run_id"]

    ambiguous = cli("cancel", "deploy-", home=home)
    assert ambiguous.returncode == 1
    assert f"'deploy-' is ambiguous: 2 runs start with it: {one}, {two}" in ambiguous.stderr
    assert run_state(home, one)[0] == run_state(home, two)[0] == "WAITING_USER"
    assert events(home, one, "cancel_requested") == events(home, two, "cancel_requested") == []

    fresh = cli("token", "deploy-one", "--json", home=home)
    assert fresh.returncode == 0, fresh.stderr
    token = json.loads(fresh.stdout)["waiting"]["resume_token"]
    approved = cli("reply", "deploy-o", "--token", token, "--approve", "--json", home=home)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["run_id"] == one and run_state(home, one)[0] == "SUCCEEDED"

    cancelled = cli("cancel", "deploy-t", home=home)
    assert cancelled.returncode == 0, cancelled.stderr
    assert run_state(home, two) == ("CANCELLED", "cancelled")
    rejected = cli("reply", "deploy-", "--token", token, "--approve", "--json", home=home)
    assert rejected.returncode == 1 and "is ambiguous" in json.loads(rejected.stdout)["rejected"]
