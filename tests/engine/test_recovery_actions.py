"""Every recovery action and fault kind, end to end through ``loopledger run``
on small scenario files, checked in the journal and the demo backends'
``deliveries`` (sends that reached a side-effecting tool) and ``executions``
(real side effects); then bad scenario files, refused before anything is
recorded.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crash_kit import no_sleep, resume_everything, run_child
from invariants import all_violations
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenario

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    merged.update(env or {})
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          env=merged)


class Recorded:
    """One scenario run through ``loopledger run --json``, and what it left."""

    def __init__(self, tmp_path: Path, text: str, env: dict[str, str] | None = None) -> None:
        self.home = tmp_path / "home"
        path = tmp_path / "scenario.yaml"
        path.write_text(text)
        proc = cli("run", str(path), "--json", home=self.home, env=env)
        assert proc.returncode == 0, proc.stderr
        (self.line,) = [json.loads(x) for x in proc.stdout.splitlines()]
        self.run_id = self.line["run_id"]
        self.journal = sqlite3.connect(self.home / "journal.sqlite")
        self.backend = sqlite3.connect(self.home / "demo_backend.sqlite")

    @property
    def outcome(self) -> tuple[str, str]:
        return self.line["status"], self.line["reason"]

    def events(self, kind: str) -> list[dict[str, Any]]:
        rows = self.journal.execute("SELECT payload_json FROM events WHERE run_id = ? AND kind = ? ORDER BY seq",
                                    (self.run_id, kind))
        return [json.loads(p) for (p,) in rows]

    def operations(self) -> list[dict[str, Any]]:
        cursor = self.journal.execute(
            "SELECT operation_id, tool, idempotency_key, outcome, dispatch_count FROM operations"
            " WHERE run_id = ? ORDER BY operation_id", (self.run_id,))
        return [dict(zip(("operation_id", "tool", "key", "outcome", "dispatches"), row)) for row in cursor]

    def deliveries(self, key: str) -> int:
        return self.backend.execute("SELECT COUNT(*) FROM deliveries WHERE idempotency_key = ?", (key,)).fetchone()[0]

    def executions(self, key: str) -> int:
        return self.backend.execute("SELECT COUNT(*) FROM executions WHERE idempotency_key = ?", (key,)).fetchone()[0]

    def artifact(self, artifact_id: str) -> Any:
        (body,) = self.journal.execute("SELECT body FROM artifacts WHERE artifact_id = ?", (artifact_id,)).fetchone()
        return json.loads(body)

    def context(self, step: int) -> dict[str, Any]:
        (context_id,) = self.journal.execute(
            "SELECT DISTINCT context_artifact_id FROM candidates WHERE run_id = ? AND step = ?",
            (self.run_id, step)).fetchone()
        return self.artifact(context_id)

    def transitions(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self.journal.execute(
            "SELECT from_state, to_state, payload_json FROM events WHERE run_id = ? AND kind = 'transition'"
            " ORDER BY seq", (self.run_id,))
        return [(f, t, json.loads(p)) for f, t, p in rows]

    def model_steps(self) -> int:
        return self.journal.execute("SELECT COUNT(DISTINCT step) FROM candidates WHERE run_id = ?",
                                    (self.run_id,)).fetchone()[0]


def refund_with(fault: str, then: str = "", budgets: str = "") -> str:
    return f"""\
id: recovery-{fault.replace('_', '-')}
contract:
  goal: Refund order ORD-1044 in full
  allowed_tools: [payments.refund]
{budgets}faults:
  - {{tool: payments.refund, call: 1, kind: {fault}}}
model:
  - tool_calls: [{{name: payments.refund, arguments: {{order_id: ORD-1044, amount: 25.0}}}}]
{then or '''  - final: Refund of 25.00 issued for ORD-1044.
    claims: [{text: refunded, evidence: ["refund_confirmed:ORD-1044"]}]
'''}"""


GAVE_UP = """\
  - final: The refund of ORD-1044 could not be made.
"""


# -- recovery actions by error code ------------------------------------------------------


def test_a_person_who_confirms_an_unknown_outcome_gives_the_evidence(tmp_path: Path) -> None:
    """Their word is the evidence, marked as theirs: the final answer built
    on it passes the gate, and the effect is not made a second time."""
    rec = Recorded(tmp_path, """\
id: confirmed-deploy
contract: {goal: deploy, required_evidence: [deployed], allowed_tools: [deploy.service]}
faults: [{tool: deploy.service, call: 1, kind: timeout_after_commit}]
model:
  - tool_calls: [{name: deploy.service, arguments: {service: api, version: "9"}}]
  - final: deployed
    claims: [{text: deployed, evidence: ["deployed:api"]}]
user: [{approve: true}, {answer: {executed: true}}]
""")
    assert rec.outcome == ("SUCCEEDED", "completed")
    (result,) = rec.events("operation_result")[-1:]
    assert result["outcome"] == "success"
    assert result["evidence"] == [{"kind": "deployed", "subject": "api", "confirmed_by": "person"}]
    (op,) = rec.operations()
    assert rec.executions(op["key"]) == 1
    assert all_violations(rec.home) == []


def test_permission_denied_is_not_retried(tmp_path: Path) -> None:
    r = Recorded(tmp_path, refund_with("permission_denied", then=GAVE_UP))
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert (op["outcome"], op["dispatches"]) == ("permission_denied", 1)
    assert r.deliveries(op["key"]) == 1 and r.executions(op["key"]) == 0
    assert [s for _, s, _ in r.transitions()].count("RECONCILING") == 0
    (result,) = r.events("operation_result")
    assert result["error_code"] == "PERMISSION_DENIED"
    # The denial reaches the model, which answers without trying again.
    tool_messages = [m for m in r.context(2)["messages"] if m.get("role") == "tool"]
    assert [m["outcome"] for m in tool_messages] == ["permission_denied"]
    assert all_violations(r.home) == []


def test_rate_limit_is_backed_off_by_the_runtime_and_the_model_sees_nothing(tmp_path: Path) -> None:
    r = Recorded(tmp_path, refund_with("rate_limit", budgets="budgets: {deadline_s: 60}\n"))
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert (op["outcome"], op["dispatches"]) == ("success", 2)
    assert r.deliveries(op["key"]) == 2, "the refused send and the one after the back-off"
    assert r.executions(op["key"]) == 1
    (refused,) = r.events("dispatch_refused")
    assert refused["error_code"] == "RATE_LIMIT" and refused["retry_after_s"] > 0
    (result,) = r.events("operation_result")
    assert result["outcome"] == "success"
    # One model call per step, and the next step's context holds only the success.
    assert r.model_steps() == 2
    messages = r.context(2)["messages"]
    assert "RATE_LIMIT" not in json.dumps(messages)
    assert [m["outcome"] for m in messages if m.get("role") == "tool"] == ["success"]
    assert all_violations(r.home) == []


@pytest.mark.parametrize("fault", ["rate_limit", "timeout_before_commit"])
def test_sends_the_runtime_retried_are_not_errors_of_the_step(tmp_path: Path, fault: str) -> None:
    """Three rate-limited (or timed-out and reconciled) sends of one call
    that then succeeds: the agent repeated nothing, so the step records no
    error and loop.repeated_error (threshold 3) does not stop the run."""
    calls = 3 if fault == "rate_limit" else 1
    faults = "".join(f"  - {{tool: workspace.list, call: {i}, kind: {fault}}}\n" for i in range(1, calls + 1))
    r = Recorded(tmp_path, f"""\
id: retried-{fault.replace('_', '-')}
contract: {{goal: List src, required_evidence: [listing], allowed_tools: [workspace.list, workspace.read_file]}}
budgets: {{deadline_s: 60}}
faults:
{faults}model:
  - tool_calls: [{{name: workspace.list, arguments: {{path: src}}}}]
  - final: src listed.
    claims: [{{text: listed, evidence: ["listing:src"]}}]
""")
    assert r.outcome == ("SUCCEEDED", "completed")
    assert len(r.events("dispatch_refused" if fault == "rate_limit" else "dispatch_unknown")) == calls
    assert [e["errors"] for e in r.events("step_closed")] == [[], []]
    assert all_violations(r.home) == []


def test_rate_limit_with_no_time_left_fails_the_operation_instead_of_sleeping(tmp_path: Path) -> None:
    # The engine's clock is pinned: no time passes, and the deadline (10 ms)
    # is shorter than the back-off the provider asks for (50 ms).
    pinned = {"LOOPLEDGER_NOW": "2026-11-29T12:00:00+00:00"}
    r = Recorded(tmp_path, refund_with("rate_limit", then=GAVE_UP, budgets="budgets: {deadline_s: 0.01}\n"),
                 env=pinned)
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert (op["outcome"], op["dispatches"]) == ("cancelled", 1)
    assert r.deliveries(op["key"]) == 1 and r.executions(op["key"]) == 0
    assert r.events("dispatch_refused") == []
    (result,) = r.events("operation_result")
    assert result["error_code"] == "RATE_LIMIT"
    assert [m["outcome"] for m in r.context(2)["messages"] if m.get("role") == "tool"] == ["cancelled"]
    assert all_violations(r.home) == []


STATE_CONFLICT = """\
id: recovery-state-conflict
contract:
  goal: Change the address of ORD-1045 to 9 Elm St
  required_evidence: ["address_updated:ORD-1045"]
  allowed_tools: [orders.get_order, orders.update_address]
faults:
  - {tool: orders.update_address, call: 1, kind: state_conflict}
model:
  - tool_calls: [{name: orders.update_address, arguments: {order_id: ORD-1045, expected_version: 1,
                  address: {street: 9 Elm St, city: Springfield, zip: "12345"}}}]
  - tool_calls: [{name: orders.update_address, arguments: {order_id: ORD-1045, expected_version: 1,
                  address: {street: 9 Elm St, city: Springfield, zip: "12345"}}}]
  - final: ORD-1045 now ships to 9 Elm St.
    claims: [{text: updated, evidence: ["address_updated:ORD-1045"]}]
"""


def test_state_conflict_gives_the_model_the_conflict_and_the_current_version(tmp_path: Path) -> None:
    r = Recorded(tmp_path, STATE_CONFLICT)
    assert r.outcome == ("SUCCEEDED", "completed")
    first, second = r.operations()
    assert (first["outcome"], first["dispatches"]) == ("validation_failed", 1)
    assert r.executions(first["key"]) == 0 and r.executions(second["key"]) == 1
    (conflict,) = [m for m in r.context(2)["messages"] if m.get("role") == "tool"]
    assert conflict["tool"] == "orders.update_address" and conflict["outcome"] == "validation_failed"
    content = conflict["content"]["result"]
    assert content["error"] == "STATE_CONFLICT"
    assert (content["order_id"], content["current_version"]) == ("ORD-1045", 1)
    assert all_violations(r.home) == []


UNKNOWN_CODES = """\
id: recovery-unknown-codes
contract:
  goal: Find the order of customer 77
  required_evidence: [order_found]
  allowed_tools: [orders.get_order]
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9001}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9002}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9003}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9004}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9005}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-9006}}]
"""


def test_other_error_codes_go_to_the_model_a_bounded_number_of_times(tmp_path: Path) -> None:
    r = Recorded(tmp_path, UNKNOWN_CODES)
    assert r.outcome == ("FAILED", "loop_detected")
    ops = r.operations()
    # Every call sent failed; the last one, whose candidate the loop detector stopped, was not sent.
    assert {op["outcome"] for op in ops if op["dispatches"]} == {"validation_failed"}
    assert [(op["operation_id"].split(".")[-3], op["outcome"]) for op in ops if not op["dispatches"]] == [
        (f"s{r.model_steps()}", "cancelled")]
    # Each error went back to the model in the next step's context ...
    for step in range(2, r.model_steps() + 1):
        tool_messages = [m for m in r.context(step)["messages"] if m.get("role") == "tool"]
        assert [m["content"]["result"]["error"] for m in tool_messages] == ["NOT_FOUND"]
    # ... until the repeated-error detector stopped the run, before the script ran out.
    assert len(ops) < 6
    (diagnosis,) = r.journal.execute("SELECT detector FROM loop_diagnoses WHERE run_id = ?", (r.run_id,)).fetchall()
    assert diagnosis == ("loop.repeated_error",)
    assert all_violations(r.home) == []


# -- fault kinds -------------------------------------------------------------------------


def test_timeout_before_commit_is_reconciled_and_resent_exactly_once(tmp_path: Path) -> None:
    r = Recorded(tmp_path, refund_with("timeout_before_commit"))
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert (op["outcome"], op["dispatches"]) == ("success", 2)
    assert r.deliveries(op["key"]) == 2 and r.executions(op["key"]) == 1
    moves = r.transitions()
    reconciled = [p for _, t, p in moves if t == "TOOL_RUNNING" and "resend" in p]
    assert reconciled == [{"resend": op["operation_id"], "executed": False}]
    assert [t for _, t, _ in moves].count("RECONCILING") == 1
    assert all_violations(r.home) == []


def test_timeout_after_commit_is_reconciled_without_a_resend(tmp_path: Path) -> None:
    r = Recorded(tmp_path, refund_with("timeout_after_commit"))
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert (op["outcome"], op["dispatches"]) == ("success", 1)
    assert r.deliveries(op["key"]) == 1 and r.executions(op["key"]) == 1
    moves = r.transitions()
    assert [t for _, t, _ in moves].count("RECONCILING") == 1
    assert not any("resend" in p for _, _, p in moves)
    assert any(p.get("reconciled") == op["operation_id"] and p.get("executed") for _, _, p in moves)
    (result,) = r.events("operation_result")
    assert result["evidence"] == [{"kind": "refund_confirmed", "subject": "ORD-1044"}]
    assert all_violations(r.home) == []


TESTS_FAIL = """\
id: recovery-tests-fail
contract:
  goal: Run the unit tests
  allowed_tools: [tests.run]
faults:
  - {tool: tests.run, call: 1, kind: fails}
model:
  - tool_calls: [{name: tests.run, arguments: {suite: unit}}]
  - final: Three unit tests fail.
"""


def test_fails_is_a_validation_failed_outcome_with_a_reduced_log_and_the_full_log_kept(tmp_path: Path) -> None:
    r = Recorded(tmp_path, TESTS_FAIL)
    assert r.outcome == ("SUCCEEDED", "completed")
    (op,) = r.operations()
    assert op["outcome"] == "validation_failed"
    (result,) = r.events("operation_result")
    assert (result["outcome"], result["error_code"], result["evidence"]) == ("validation_failed", "TESTS_FAILED", [])
    summary = result["summary"]
    assert summary["full_artifact"] == result["result_artifact_id"]
    assert summary["summary"]["failed"] == 3 and len(summary["failures"]) == 3
    full = r.artifact(result["result_artifact_id"])
    assert full["operation_id"] == op["operation_id"]
    log = full["result"]["log"]
    assert summary["log_lines"] == len(log.splitlines()) > 1000
    assert len(json.dumps(summary)) < 4096 < len(log)
    # The model is given the summary, not the log.
    (message,) = [m for m in r.context(2)["messages"] if m.get("role") == "tool"]
    assert message["content"] == summary
    assert all_violations(r.home) == []


def test_crash_after_dispatch_kills_the_process_and_resume_reconciles_one_execution(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = tmp_path / "crash.yaml"
    path.write_text(refund_with("crash_after_dispatch"))
    died = cli("run", str(path), "--json", home=home)
    assert died.returncode == -signal.SIGKILL, died.stderr
    resumed = cli("resume", "--json", home=home)
    assert resumed.returncode == 0, resumed.stderr
    (line,) = [json.loads(x) for x in resumed.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
    journal = sqlite3.connect(home / "journal.sqlite")
    ((key, outcome, dispatches),) = journal.execute(
        "SELECT idempotency_key, outcome, dispatch_count FROM operations").fetchall()
    assert (outcome, dispatches) == ("success", 1)
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    assert backend.execute("SELECT COUNT(*) FROM executions WHERE idempotency_key = ?", (key,)).fetchone() == (1,)
    assert backend.execute("SELECT COUNT(*) FROM deliveries WHERE idempotency_key = ?", (key,)).fetchone() == (1,)
    whys = [json.loads(p).get("why") for (p,) in journal.execute(
        "SELECT payload_json FROM events WHERE kind = 'transition' AND to_state = 'RECONCILING'")]
    assert whys == ["in_flight_at_restart"]
    assert all_violations(home) == []


def only_operation(journal: sqlite3.Connection) -> tuple[str, str | None, int]:
    """The journal's one operation: its outcome, its result's error code
    (None on success) and how many times it was sent."""
    ((outcome, body, dispatches),) = journal.execute(
        "SELECT o.outcome, a.body, o.dispatch_count FROM operations o "
        "JOIN artifacts a ON a.artifact_id = o.result_artifact_id").fetchall()
    return outcome, json.loads(body)["result"].get("error"), dispatches


READ_THEN_ANSWER = """\
id: recovery-read-unanswered
contract:
  goal: Look ORD-1044 up
  allowed_tools: [orders.get_order]
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1044}}]
  - final: The lookup timed out; I could not check ORD-1044.
"""


def test_a_read_is_sent_again_after_each_restart_and_given_up_only_when_every_send_dies(tmp_path: Path) -> None:
    """A read changes nothing: after a restart it is sent again, whatever
    happened to the sends before, so two crashes around it do not make it
    fail (it was recorded as a timeout nobody saw). A read that every
    process running it dies on is given up after RESTART_SENDS sends
    (``cancelled``, PROCESS_ENDED) and the model goes on; nobody is asked
    whether a read took effect."""
    from loopledger.engine._controller import RESTART_SENDS

    path = tmp_path / "read.yaml"
    path.write_text(READ_THEN_ANSWER)
    crash = {"LOOPLEDGER_CRASH_AT": "after_dispatch"}
    for crashes, expected in ((RESTART_SENDS - 1, ("success", None, RESTART_SENDS)),
                              (RESTART_SENDS, ("cancelled", "PROCESS_ENDED", RESTART_SENDS))):
        home = tmp_path / f"home-{crashes}"
        assert cli("run", str(path), "--json", home=home, env=crash).returncode == -signal.SIGKILL
        for _ in range(crashes - 1):
            assert cli("resume", "--json", home=home, env=crash).returncode == -signal.SIGKILL  # the re-send dies too
        resumed = cli("resume", "--json", home=home)
        assert resumed.returncode == 0, resumed.stderr
        (line,) = [json.loads(x) for x in resumed.stdout.splitlines()]
        assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
        journal = sqlite3.connect(home / "journal.sqlite")
        assert only_operation(journal) == expected, crashes
        assert journal.execute("SELECT COUNT(*) FROM events WHERE to_state = 'WAITING_USER'").fetchone() == (0,)
        assert all_violations(home) == []


def test_a_read_unanswered_in_a_live_process_is_a_timeout_after_one_re_send(tmp_path: Path) -> None:
    """No process ended: its backend gave no answer in time, twice. That is
    a ``timeout`` (the read is re-sent once), not a read given up on
    restarts."""
    from loopledger.engine._backends import DemoBackend, failure

    class NoAnswer(DemoBackend):
        def execute(self, req: Any) -> Any:
            if req.tool == "orders.get_order":
                return failure("unknown_outcome", "TIMEOUT", "orders.get_order: no answer in time")
            return super().execute(req)

    path = tmp_path / "read.yaml"
    path.write_text(READ_THEN_ANSWER)
    home = Home(tmp_path / "home")
    runner = Runner(home, backend=NoAnswer, export=False)
    try:
        (run_id,) = runner.create_all([(load_scenario(path), "v1")])
        runner.drive_all([run_id])
    finally:
        runner.close()
    assert only_operation(sqlite3.connect(home.journal_file)) == ("timeout", "TIMEOUT", 2)


# -- several tool calls in one candidate ---------------------------------------------------

SEQUENTIAL = """\
id: recovery-sequential
contract:
  goal: Write two notes and look an order up
  allowed_tools: [workspace.write_file, orders.get_order]
model:
  - tool_calls:
      - {name: workspace.write_file, arguments: {path: notes/a.txt, content: first}}
      - {name: workspace.write_file, arguments: {path: notes/b.txt, content: second}}
      - {name: orders.get_order, arguments: {order_id: ORD-1046}}
  - final: Both notes are written.
"""

FIRST_FAILS = """\
id: recovery-first-fails
contract:
  goal: Refund ORD-1047 and note it
  allowed_tools: [orders.get_order, payments.refund, workspace.write_file]
model:
  - tool_calls:
      - {name: orders.get_order, arguments: {order_id: ORD-2001}}
      - {name: payments.refund, arguments: {order_id: ORD-1047, amount: 25.0}}
      - {name: workspace.write_file, arguments: {path: notes/refund.txt, content: refunded}}
  - final: Nothing was refunded; the lookup was denied.
"""


def test_calls_of_one_candidate_run_in_order(tmp_path: Path) -> None:
    r = Recorded(tmp_path, SEQUENTIAL)
    assert r.outcome == ("SUCCEEDED", "completed")
    ops = r.operations()
    assert [op["outcome"] for op in ops] == ["success"] * 3
    dispatched = [e["operation_id"] for e in r.events("operation_dispatched")]
    results = [e["operation_id"] for e in r.events("operation_result")]
    assert dispatched == results == [op["operation_id"] for op in ops]
    written = r.backend.execute("SELECT idempotency_key FROM executions WHERE run_id = ? ORDER BY rowid",
                                (r.run_id,)).fetchall()
    assert [k for (k,) in written] == [ops[0]["key"], ops[1]["key"]]


def test_after_a_failed_call_the_later_calls_are_cancelled_never_sent(tmp_path: Path) -> None:
    r = Recorded(tmp_path, FIRST_FAILS)
    assert r.outcome == ("SUCCEEDED", "completed")
    lookup, refund, note = r.operations()
    assert (lookup["outcome"], lookup["dispatches"]) == ("permission_denied", 1)
    for op in (refund, note):
        assert (op["outcome"], op["dispatches"]) == ("cancelled", 0)
        assert r.deliveries(op["key"]) == 0 and r.executions(op["key"]) == 0
    codes = {e["operation_id"]: e["error_code"] for e in r.events("operation_result")}
    assert codes[refund["operation_id"]] == codes[note["operation_id"]] == "PRECEDING_CALL_FAILED"
    assert [e["operation_id"] for e in r.events("operation_dispatched")] == [lookup["operation_id"]]
    assert all_violations(r.home) == []


def test_after_a_failed_call_a_crash_at_any_commit_never_sends_the_later_calls(tmp_path: Path) -> None:
    path = tmp_path / "first-fails.yaml"
    path.write_text(FIRST_FAILS)
    scenario = load_scenario(path)
    home = tmp_path / "home"
    killed, commits = run_child(home, scenario, 10**9)
    assert not killed and commits.isdigit(), commits
    for n in range(1, int(commits) + 1):
        killed, report = run_child(home, scenario, n)
        assert killed, f"commit {n}: {report}"
        runner = Runner(Home.resolve(home), auto_reply=False, sleep=no_sleep)
        try:
            resume_everything(runner)
        finally:
            runner.close()
        assert all_violations(home) == [], f"commit {n}"
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    sent = backend.execute("SELECT DISTINCT tool FROM deliveries").fetchall()
    assert sent == [], "neither the refund nor the note ever reached a backend"
    journal = sqlite3.connect(home / "journal.sqlite")
    states = journal.execute("SELECT state, COUNT(*) FROM runs GROUP BY state").fetchall()
    assert states == [("SUCCEEDED", int(commits) + 1)]
    outcomes = journal.execute("SELECT tool, outcome, COUNT(*) FROM operations GROUP BY tool, outcome").fetchall()
    assert sorted(outcomes) == [("orders.get_order", "permission_denied", int(commits) + 1),
                                ("payments.refund", "cancelled", int(commits) + 1),
                                ("workspace.write_file", "cancelled", int(commits) + 1)]


# -- bad scenario files --------------------------------------------------------------------

GOOD = """\
id: good
contract: {goal: Look ORD-1001 up, allowed_tools: [orders.get_order]}
model:
  - final: done
"""


@pytest.mark.parametrize(("text", "field"), [
    ("id: bad\nmodel: [{final: done}]\n", "contract"),
    ("id: bad\ncontract: {allowed_tools: [orders.get_order]}\n", "contract.goal"),
    ("id: bad\ncontract: {goal: g}\nbudgets: {max_steps: ten}\n", "budgets.max_steps"),
    ("id: bad\ncontract: {goal: g, allowed_tools: [orders.get_order, orders.delete_all]}\n",
     "contract.allowed_tools[1]"),
    ("id: bad\ncontract: {goal: g}\nfaults: [{tool: payments.refnud, call: 1, kind: rate_limit}]\n",
     "faults[0].tool"),
    ("id: bad\ncontract: {goal: g}\nfaults: [{tool: payments.refund, kind: meteor_strike}]\n", "faults[0].kind"),
    # ask_user is answered by the engine, never sent: a fault on it could never happen.
    ("id: bad\ncontract: {goal: g}\nfaults: [{tool: ask_user, kind: timeout_before_commit}]\n", "faults[0].tool"),
    ("id: bad\ncontract: {goal: g\nmodel: [\n", "line"),
    ("- just\n- a list\n", "mapping"),
    # An id names run ids and workspace folders: no path in it.
    ("id: ../../../escaped\ncontract: {goal: g}\n", "id"),
    ("id: /tmp/absolute\ncontract: {goal: g}\n", "id"),
    # Numbers no date, journal or JSON reader can hold, refused before anything runs.
    ("id: bad\ncontract: {goal: g, wait_ttl_s: 1.0e12}\n", "contract.wait_ttl_s"),
    ("id: bad\ncontract: {goal: g}\nmodel: [{final: done, usage: {tokens_in: 123456789012345678901234567890}}]\n",
     "model[0].usage.tokens_in"),
    ("id: bad\ncontract: {goal: g}\nmodel: [{final: done, usage: {tokens_in: -5}}]\n", "model[0].usage.tokens_in"),
    ("id: bad\ncontract: {goal: g}\nmodel: [{final: done, usage: {cost_usd: .inf}}]\n", "model[0].usage.cost_usd"),
    ("id: bad\ncontract: {goal: g}\nbudgets: {max_cost: .inf}\n", "budgets.max_cost"),
    ("id: bad\ncontract: {goal: g}\nbudgets: {deadline_s: .inf}\n", "budgets.deadline_s"),
    ("id: bad\ncontract: {goal: g}\nbudgets: {max_steps: true}\n", "budgets.max_steps"),
    ("id: bad\ncontract: {goal: g}\nexpect: {reason: finished}\n", "expect.reason"),
    ("id: bad\ncontract: {goal: g}\nexpect: {side_effects: {payments.refund: -1}}\n",
     "expect.side_effects.payments.refund"),
    ("id: bad\nid: worse\ncontract: {goal: g}\n", "line 2"),
    ("id: bad\ncontract: {goal: g, required_evidence: [refund_done]}\n", "contract.required_evidence"),
    ("id: bad\ncontract: {goal: g}\nmodel: []\n", "model"),
    ("id: bad\ncontract: {goal: g}\n", "model"),
    ("id: bad\ncontract: {goal: g, required_evidence: [\"order_found:\"]}\n", "contract.required_evidence"),
])
def test_a_bad_scenario_file_exits_2_with_one_line_and_records_nothing(tmp_path: Path, text: str,
                                                                      field: str) -> None:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "a-good.yaml").write_text(GOOD)
    bad = folder / "b-bad.yaml"
    bad.write_text(text)
    home = tmp_path / "home"
    for target in (bad, folder):  # alone, and next to a good file that must not run either
        proc = cli("run", str(target), home=home)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert str(bad) in lines[0] and field in lines[0], lines[0]
        assert "Traceback" not in proc.stderr
        journal = home / "journal.sqlite"
        if journal.exists():
            assert sqlite3.connect(journal).execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


def test_two_resumes_at_once_each_print_only_what_they_drove_to_an_end(tmp_path: Path) -> None:
    """The resume that finds the run driven by the other leaves it to that
    one: it printed the running state it saw (MODEL_RUNNING, no reason) as
    the run's result. Every line printed is the run's end."""
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "happy-refund.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    for attempt in range(6):
        home = tmp_path / f"home-{attempt}"
        died = cli("run", str(scenario), "--json", home=home, env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "2"})
        assert died.returncode == -signal.SIGKILL, died.stderr
        pair = [subprocess.Popen([*CLI, "resume", "--json", "--home", str(home)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        lines = []
        for proc in pair:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            lines += [json.loads(x) for x in out.splitlines()]
        # Once by the one that drove it; twice when the other came to it after it ended.
        assert 1 <= len(lines) <= 2 and {(line["status"], line["reason"]) for line in lines} == {
            ("SUCCEEDED", "completed")}, lines
        assert all_violations(home) == []


def test_a_run_another_process_only_looked_over_is_driven_by_the_resume(tmp_path: Path) -> None:
    """Held a moment by another that lets go without driving it (a resume
    that cannot drive it there, one looking it over): the resume tries again
    and drives it, instead of leaving it to nobody."""
    import threading

    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "happy-refund.yaml"
    home = tmp_path / "home"
    died = cli("run", str(scenario), "--json", home=home, env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "2"})
    assert died.returncode == -signal.SIGKILL, died.stderr
    (run_id,) = [r for (r,) in sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id FROM runs")]
    other = Home(home).open_store()  # its own claims, as another process's
    assert other.claim(run_id, 0)
    letting_go = threading.Timer(0.3, other.release, (run_id,))
    runner = Runner(Home(home), export=False)
    try:
        letting_go.start()
        runner.drive_all([run_id])
        assert runner.held_elsewhere == set()
        assert runner.store.get_run(run_id).state.value == "SUCCEEDED"
    finally:
        letting_go.join()
        runner.close()
        other.close()


def test_a_waiting_run_another_process_holds_is_left_to_it_not_reported_as_waiting(tmp_path: Path) -> None:
    """Read while another holds it, a waiting run may be one the other is
    taking out of its wait (an expired one it ends): the state read is not
    the run's result. Two resumes at once printed such runs as still
    waiting, although the other ended them."""
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "approval-waits-for-person.yaml"
    home = tmp_path / "home"
    waiting = cli("run", str(scenario), "--json", home=home)
    assert waiting.returncode == 0, waiting.stderr
    (line,) = [json.loads(x) for x in waiting.stdout.splitlines()]
    assert line["status"] == "WAITING_USER"
    other = Home(home).open_store()  # another process's claim, held throughout
    assert other.claim(line["run_id"], 0)
    runner = Runner(Home(home), export=False)
    settled: list[str] = []
    try:
        runner.drive_all([line["run_id"]], on_settled=settled.append)
        assert settled == [] and runner.held_elsewhere == {line["run_id"]}
    finally:
        runner.close()
        other.release(line["run_id"])
        other.close()


def test_a_run_another_process_polls_is_left_to_it_not_reported_as_waiting(tmp_path: Path) -> None:
    """Two resumes at once: the first drives a run into its background wait
    and polls it, letting go of it between polls; the second, finding it
    waiting as when it started, printed that wait while the first went on to
    finish it. A run the other polls is now left to the other."""
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "background-export.yaml"
    home = tmp_path / "home"
    env = {"LOOPLEDGER_NOW": "2030-01-01T00:00:00Z"}  # pinned: the work never falls due, the run waits
    waiting = cli("run", str(scenario), "--json", home=home, env=env)
    assert waiting.returncode == 0, waiting.stderr
    (line,) = [json.loads(x) for x in waiting.stdout.splitlines()]
    assert line["status"] == "WAITING_TOOL", line
    run_id = line["run_id"]
    other = Home(home).open_store()  # the first resume: it polls the run, holding no claim between polls
    runner = Runner(Home(home), export=False)
    version = runner.store.get_run(run_id).state_version
    try:
        settled: list[str] = []
        other.watch(run_id)
        runner.drive_all([run_id], on_settled=settled.append, leave_waiting={run_id: version})
        assert settled == [] and runner.held_elsewhere == {run_id}
        # Nobody polls it: the wait is this process's to report, as before.
        other.unwatch(run_id)
        runner.drive_all([run_id], on_settled=settled.append, leave_waiting={run_id: version})
        assert settled == [run_id] and runner.held_elsewhere == set()
    finally:
        runner.close()
        other.close()


def test_the_process_that_polls_a_run_watches_it_until_it_ends(tmp_path: Path) -> None:
    """``run`` polls a run's background work (0.5 s): meanwhile another
    store sees its watch; once the run has ended, no longer."""
    import time

    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "background-export.yaml"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.Popen([*CLI, "run", str(scenario), "--json", "--home", str(home)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    seen: set[bool] = set()
    other = None
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if other is None and (home / "journal.sqlite").exists():
                other = Home(home).open_store()
            if other is not None:
                runs = other.list_runs()
                if runs:
                    seen.add(other.watched_elsewhere(runs[0].run_id))
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["status"] == "SUCCEEDED"
        assert other is not None and True in seen
        assert not other.watched_elsewhere(other.list_runs()[0].run_id)
    finally:
        if proc.poll() is None:
            proc.kill()
        if other is not None:
            other.close()


DEPLOY_UNCONFIRMED = """\
id: recovery-deploy-unconfirmed
contract:
  goal: Deploy checkout
  required_evidence: ["deployed:checkout"]
  allowed_tools: [deploy.service]
  wait_ttl_s: 3600
{budgets}faults:
  - {{tool: deploy.service, call: 1, kind: timeout_after_commit}}
model:
  - tool_calls: [{{name: deploy.service, arguments: {{service: checkout, version: 1.5.0}}}}]
  - final: Deployed.
    claims: [{{text: deployed, evidence: ["deployed:checkout"]}}]
"""


@pytest.mark.parametrize(("budgets", "ending", "code"), [
    ("", ("EXPIRED", "expired"), "WAIT_EXPIRED"),
    ("budgets: {deadline_s: 120}\n", ("BUDGET_EXHAUSTED", "deadline"), "DEADLINE"),
])
def test_a_send_nobody_confirmed_before_the_wait_ran_out_stays_unknown(tmp_path: Path, budgets: str,
                                                                        ending: tuple[str, str], code: str) -> None:
    """The deploy ran (its answer was lost) and its backend cannot say so;
    the person asked never answers. Its one result is unknown_outcome, not
    a ``cancelled`` that the backend's own record contradicts."""
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY_UNCONFIRMED.format(budgets=budgets))
    waiting = json.loads(cli("run", str(path), "--json", home=home).stdout)
    approved = cli("reply", waiting["run_id"], "--token", waiting["waiting"]["resume_token"], "--approve", "--json",
                   home=home)
    assert json.loads(approved.stdout)["reason"] == "waiting_for_user", approved.stdout  # did it take effect?
    later = cli("resume", "--json", home=home, env={"LOOPLEDGER_NOW": "2030-01-01T00:00:00Z"})
    (line,) = [json.loads(x) for x in later.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ending
    assert only_operation(sqlite3.connect(home / "journal.sqlite"))[:2] == ("unknown_outcome", code)
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    assert backend.execute("SELECT COUNT(*) FROM executions WHERE tool = 'deploy.service'").fetchone() == (1,)
    assert all_violations(home) == []


def test_space_around_a_token_is_not_part_of_it(tmp_path: Path) -> None:
    """Pasted with a space, or read with `$(cat file)` and its newline: the
    signature checked out, but the token's hash did not, and a genuine token
    was refused as "not the token issued"."""
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY_UNCONFIRMED.format(budgets="").replace(
        "faults:\n  - {tool: deploy.service, call: 1, kind: timeout_after_commit}\n", ""))
    waiting = json.loads(cli("run", str(path), "--json", home=home).stdout)
    token = waiting["waiting"]["resume_token"]
    approved = cli("reply", waiting["run_id"], "--token", f" {token}\n", "--approve", "--json", home=home)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert (json.loads(approved.stdout)["status"]) == "SUCCEEDED"
    again = cli("reply", waiting["run_id"], "--token", f"{token} ", "--approve", "--json", home=home)
    assert again.returncode == 1 and json.loads(again.stdout)["rejected"].startswith("already used"), again.stdout


def test_a_cancel_signs_nothing_so_a_secret_file_others_may_read_does_not_stop_it(tmp_path: Path) -> None:
    """The secret's check guards signed tokens (reply, token, run): a cancel,
    recorded through the journal alone, is not refused over it."""
    home = tmp_path / "home"
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY_UNCONFIRMED.format(budgets=""))
    waiting = json.loads(cli("run", str(path), "--json", home=home).stdout)
    (home / "secret.key").chmod(0o644)
    refused = cli("reply", waiting["run_id"], "--token", waiting["waiting"]["resume_token"], "--approve", home=home)
    assert refused.returncode == 2 and "secret.key" in refused.stderr, refused.stderr
    cancelled = cli("cancel", waiting["run_id"], home=home)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    assert all_violations(home) == []
