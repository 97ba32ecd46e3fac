"""Durable waits for a person, through the command line: ``run --json``
shows the resume token once, ``reply`` delivers a decision or an answer,
``resume`` leaves waits alone until they expire.

Every reply is checked for the run, the wait and state version, the token's
signature, expiry and the answer's schema; a token is consumed once, even
by two processes replying at the same moment.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from invariants import all_violations
from loopledger.canonical import content_id
from loopledger.engine._waits import TokenClaims, issue_token

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

DEPLOY = """\
id: wait-deploy
description: a deploy needs a person's approval
contract:
  goal: Deploy checkout 1.5.0
  required_evidence: ["deployed:checkout"]
  allowed_tools: [deploy.service]
  wait_ttl_s: 3600
model:
  - tool_calls: [{name: deploy.service, arguments: {service: checkout, version: 1.5.0}}]
  - final: checkout 1.5.0 is deployed.
    claims: [{text: deployed, evidence: ["deployed:checkout"]}]
"""

DEPLOY_DENIED = """\
id: wait-deploy-denied
description: the deploy is denied; the model replans and reports that nothing changed
contract:
  goal: Deploy checkout 1.5.0 if a person approves it
  allowed_tools: [deploy.service]
model:
  - tool_calls: [{name: deploy.service, arguments: {service: checkout, version: 1.5.0}}]
  - final: The deploy of checkout 1.5.0 was not approved; nothing changed.
"""

DEPLOY_TWICE = """\
id: wait-deploy-twice
description: two deploys, each waiting for its own approval
contract:
  goal: Deploy checkout 1.4.2, then 1.4.3
  required_evidence: ["deployed:checkout"]
  allowed_tools: [deploy.service]
model:
  - tool_calls: [{name: deploy.service, arguments: {service: checkout, version: 1.4.2}}]
  - tool_calls: [{name: deploy.service, arguments: {service: checkout, version: 1.4.3}}]
  - final: checkout 1.4.3 is deployed.
    claims: [{text: deployed, evidence: ["deployed:checkout"]}]
"""

QUESTION = """\
id: wait-question
description: the agent asks which order; the answer must fit the schema
contract:
  goal: Refund the order the customer names
  required_evidence: [user_answer]
  allowed_tools: [ask_user]
model:
  - tool_calls:
      - name: ask_user
        arguments:
          question: Which order should be refunded?
          schema: {type: object, properties: {order_id: {type: string, pattern: "^ORD-[0-9]{4}$"}},
                   required: [order_id], additionalProperties: false}
  - final: The customer named the order.
    claims: [{text: answered, evidence: [user_answer]}]
"""


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    merged.update(env or {})
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          env=merged)


def start(tmp_path: Path, home: Path, text: str, name: str = "s") -> dict[str, Any]:
    """``loopledger run FILE --json``: the run's one line."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    proc = cli("run", str(path), "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    return line


def reply(home: Path, run_id: str, token: str, *flags: str, env: dict[str, str] | None = None):
    return cli("reply", run_id, "--token", token, *flags, "--json", home=home, env=env)


def journal(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "journal.sqlite")


def state(home: Path, run_id: str) -> tuple[str, str]:
    return journal(home).execute("SELECT state, reason FROM runs WHERE run_id = ?", (run_id,)).fetchone()


def events(home: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    rows = journal(home).execute(
        "SELECT payload_json FROM events WHERE run_id = ? AND kind = ? ORDER BY seq", (run_id, kind))
    return [json.loads(p) for (p,) in rows]


def executions(home: Path, run_id: str, tool: str) -> int:
    conn = sqlite3.connect(home / "demo_backend.sqlite")
    return conn.execute("SELECT COUNT(*) FROM executions WHERE run_id = ? AND tool = ?", (run_id, tool)).fetchone()[0]


def claims_of(token: str) -> TokenClaims:
    body = token.split(".", 1)[0]
    raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return TokenClaims(raw["r"], raw["w"], raw["v"], raw["e"])


def rejected(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert f"rejected: {reason}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_a_valid_approval_is_accepted_once_and_the_run_finishes(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    w = line["waiting"]
    assert (line["status"], line["reason"], w["kind"]) == ("WAITING_USER", "waiting_for_approval", "approval")
    assert w["approval_id"] and w["expires_at"] and w["resume_token"]
    assert executions(home, line["run_id"], "deploy.service") == 0, "nothing runs before the approval"

    ok = reply(home, line["run_id"], w["resume_token"], "--approve")
    assert ok.returncode == 0, ok.stderr
    (done,) = [json.loads(x) for x in ok.stdout.splitlines()]
    assert (done["status"], done["reason"]) == ("SUCCEEDED", "completed")
    assert executions(home, line["run_id"], "deploy.service") == 1

    rejected(reply(home, line["run_id"], w["resume_token"], "--approve"), "already used")
    assert len(events(home, line["run_id"], "reply_accepted")) == 1
    assert executions(home, line["run_id"], "deploy.service") == 1
    assert all_violations(home) == []


def test_a_run_that_stops_waiting_loses_the_waits_reason(tmp_path: Path, home: Path) -> None:
    """Stopped right after the approval's commit: the run is TOOL_RUNNING,
    no longer waiting, and a second reply's line says so."""
    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    killed = reply(home, run_id, token, "--approve", env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "1"})
    assert killed.returncode == -9
    assert state(home, run_id) == ("TOOL_RUNNING", None)
    again = reply(home, run_id, token, "--approve")
    rejected(again, "already used")
    assert json.loads(again.stdout)["reason"] is None


def test_forged_tokens_are_rejected_and_the_run_still_waits(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    body, mac = token.split(".")
    flipped = f"{body}.{mac[:-1]}{'0' if mac[-1] != '0' else '1'}"
    rejected(reply(home, run_id, flipped, "--approve"), "bad token")
    other_secret = issue_token(b"not this home's secret" * 2, claims_of(token))
    assert other_secret != token
    rejected(reply(home, run_id, other_secret, "--approve"), "bad token")
    garbage = reply(home, run_id, "garbage", "--approve")
    rejected(garbage, "bad token")
    # With --json, the rejection is a line too: the run as it stands, and why.
    (line_out,) = [json.loads(x) for x in garbage.stdout.splitlines()]
    assert (line_out["run_id"], line_out["status"]) == (run_id, "WAITING_USER")
    assert line_out["rejected"].startswith("bad token")
    # Claims changed (a later expiry) without the secret: the signature no longer matches.
    longer = claims_of(token)
    raw = {"r": longer.run_id, "w": longer.wait_id, "v": longer.state_version, "e": longer.expires_at_us + 10**12}
    tampered = base64.urlsafe_b64encode(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode())
    rejected(reply(home, run_id, f"{tampered.decode().rstrip('=')}.{mac}", "--approve"), "bad token")

    assert state(home, run_id) == ("WAITING_USER", "waiting_for_approval")
    assert events(home, run_id, "reply_accepted") == []
    # The genuine token still works.
    assert reply(home, run_id, token, "--approve").returncode == 0
    assert state(home, run_id) == ("SUCCEEDED", "completed")


def test_reply_and_cancel_on_a_home_without_a_journal_create_nothing(tmp_path: Path) -> None:
    home = tmp_path / "nowhere"
    rejected(cli("reply", "r1", "--token", "t", "--approve", home=home), "wrong run")
    assert cli("cancel", "r1", home=home).returncode == 1
    assert cli("show", "r1", home=home).returncode == 1
    assert not home.exists()


def test_a_token_of_another_run_is_rejected(tmp_path: Path, home: Path) -> None:
    first = start(tmp_path, home, DEPLOY, "a")
    second = start(tmp_path, home, DEPLOY, "b")
    assert first["run_id"] != second["run_id"]
    rejected(reply(home, second["run_id"], first["waiting"]["resume_token"], "--approve"), "wrong run")
    assert state(home, second["run_id"])[0] == "WAITING_USER"
    assert state(home, first["run_id"])[0] == "WAITING_USER"
    assert executions(home, first["run_id"], "deploy.service") == 0
    assert reply(home, "no-such-run", first["waiting"]["resume_token"], "--approve").returncode == 1


def test_an_expired_wait_rejects_the_reply_and_the_run_ends_expired(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, w = line["run_id"], line["waiting"]
    later = (datetime.fromisoformat(w["expires_at"]) + timedelta(seconds=1)).isoformat()
    rejected(reply(home, run_id, w["resume_token"], "--approve", env={"LOOPLEDGER_NOW": later}), "expired")
    assert state(home, run_id) == ("EXPIRED", "expired")
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("permission_denied", "WAIT_EXPIRED")
    assert executions(home, run_id, "deploy.service") == 0
    # Again, once the run has ended EXPIRED (or a resume ended it): still
    # "expired", and the reply is kept as a late event (the end stands).
    assert events(home, run_id, "late_event") == []
    rejected(reply(home, run_id, w["resume_token"], "--approve", "--by", "ops", env={"LOOPLEDGER_NOW": later}),
             "expired")
    (late,) = events(home, run_id, "late_event")
    assert late["kind"] == "reply_after_end" and late["payload"]["refused"] == "expired"
    assert (late["payload"]["decision"], late["payload"]["by"]) == ("approve", "ops")
    assert w["resume_token"] not in json.dumps(late)
    # An answer is kept by its hash: the run can do nothing with it.
    rejected(reply(home, run_id, w["resume_token"], "--answer", '{"big": "x"}', env={"LOOPLEDGER_NOW": later}),
             "expired")
    answered = events(home, run_id, "late_event")[1]["payload"]
    assert "answer" not in answered and answered["answer_sha256"] == content_id({"big": "x"})
    assert state(home, run_id) == ("EXPIRED", "expired")
    # In the traces too (all_violations compares them with the journal, row by row).
    kinds = __import__("duckdb").sql(f"SELECT kind FROM read_parquet('{home}/traces/events/*.parquet') "
                                     f"WHERE run_id = '{run_id}' AND kind = 'late_event'").fetchall()
    assert len(kinds) == 2
    assert all_violations(home) == []


def test_a_wait_ends_at_the_runs_deadline_when_that_comes_first(tmp_path: Path, home: Path) -> None:
    """Past the deadline no reply could do anything: ``expires_at`` is the
    deadline, ``resume`` then ends the run BUDGET_EXHAUSTED / deadline (the
    held deploy cancelled, never sent), and the reply is refused."""
    text = DEPLOY.replace("  wait_ttl_s: 3600\n", "  wait_ttl_s: 3600\nbudgets: {deadline_s: 30}\n")
    start_at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    path = tmp_path / "dl.yaml"
    path.write_text(text)
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": start_at.isoformat()})
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    run_id, w = line["run_id"], line["waiting"]
    assert datetime.fromisoformat(w["expires_at"]) == start_at + timedelta(seconds=30)
    before = (start_at + timedelta(seconds=29)).isoformat()
    assert json.loads(cli("resume", "--json", home=home, env={"LOOPLEDGER_NOW": before}).stdout)["status"] == \
        "WAITING_USER"
    after = (start_at + timedelta(seconds=31)).isoformat()
    resumed = cli("resume", "--json", home=home, env={"LOOPLEDGER_NOW": after})
    assert [(x["status"], x["reason"]) for x in map(json.loads, resumed.stdout.splitlines())] == \
        [("BUDGET_EXHAUSTED", "deadline")]
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("cancelled", "DEADLINE")
    assert executions(home, run_id, "deploy.service") == 0
    refused = reply(home, run_id, w["resume_token"], "--approve", env={"LOOPLEDGER_NOW": after})
    rejected(refused, "expired")
    assert "BUDGET_EXHAUSTED (deadline)" in refused.stderr
    # A wait whose own expiry comes first keeps it.
    short = DEPLOY.replace("  wait_ttl_s: 3600\n", "  wait_ttl_s: 10\nbudgets: {deadline_s: 30}\n")
    path.write_text(short.replace("id: wait-deploy", "id: wait-deploy-short"))
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": start_at.isoformat()})
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert datetime.fromisoformat(line["waiting"]["expires_at"]) == start_at + timedelta(seconds=10)
    assert all_violations(home) == []


def test_replies_to_a_run_that_waited_twice(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY_TWICE)
    run_id, first = line["run_id"], line["waiting"]
    approved = reply(home, run_id, first["resume_token"], "--approve")
    assert approved.returncode == 0, approved.stderr
    (again,) = [json.loads(x) for x in approved.stdout.splitlines()]
    second = again["waiting"]
    assert again["status"] == "WAITING_USER" and second["kind"] == "approval"
    # A new plan never reuses an approval: the second deploy has its own.
    assert second["approval_id"] != first["approval_id"] and second["resume_token"] != first["resume_token"]
    assert claims_of(second["resume_token"]).state_version > claims_of(first["resume_token"]).state_version

    # The first token after the second wait began: it was consumed, and the
    # run has moved past its state version; the reply is refused either way.
    rejected(reply(home, run_id, first["resume_token"], "--approve"), "already used")
    assert state(home, run_id) == ("WAITING_USER", "waiting_for_approval")
    assert executions(home, run_id, "deploy.service") == 1
    assert reply(home, run_id, second["resume_token"], "--approve").returncode == 0
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    assert executions(home, run_id, "deploy.service") == 2


def test_a_token_whose_wait_the_run_has_left_is_refused(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY_TWICE)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    assert reply(home, run_id, token, "--approve").returncode == 0  # the run moves on to its second wait
    rejected(reply(home, run_id, token, "--approve"), "already used")
    cancelled = start(tmp_path, home, DEPLOY, name="c")
    assert cli("cancel", cancelled["run_id"], home=home).returncode == 0
    # A run that left its wait because it was cancelled says so.
    rejected(reply(home, cancelled["run_id"], cancelled["waiting"]["resume_token"], "--approve"), "cancelled")
    assert state(home, cancelled["run_id"]) == ("CANCELLED", "cancelled")
    assert executions(home, cancelled["run_id"], "deploy.service") == 0


REFUND_UNANSWERED = """\
id: refund-unanswered-twice
contract:
  goal: Refund order ORD-1033
  allowed_tools: [payments.refund]
faults:
  - {tool: payments.refund, call: 1, kind: timeout_before_commit}
  - {tool: payments.refund, call: 2, kind: timeout_before_commit}
model:
  - tool_calls: [{name: payments.refund, arguments: {order_id: ORD-1033, amount: 25.0}}]
  - final: The refund of ORD-1033 did not go through.
"""


def test_a_persons_yes_that_the_backend_has_no_record_of_is_refused(tmp_path: Path, home: Path) -> None:
    """The refund timed out twice before it committed and a person is asked
    whether it took effect. The payments backend looks refunds up by key and
    has none: a "yes" would end the run claiming a refund never made."""
    line = start(tmp_path, home, REFUND_UNANSWERED)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    assert line["waiting"]["kind"] == "user"
    refused = reply(home, run_id, token, "--answer", '{"executed": true}')
    rejected(refused, "contradicted by the backend")
    assert "did not take effect" in refused.stderr
    assert state(home, run_id) == ("WAITING_USER", "waiting_for_user")
    assert events(home, run_id, "reply_accepted") == []
    ok = reply(home, run_id, token, "--answer", '{"executed": false}')
    assert ok.returncode == 0, ok.stderr
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("cancelled", "NOT_EXECUTED")
    assert executions(home, run_id, "payments.refund") == 0
    assert all_violations(home) == []


def test_a_scripted_reply_that_is_refused_is_said_on_the_runs_line(tmp_path: Path, home: Path) -> None:
    """The run waits on, with its token valid, and its line says why the
    scenario's reply did not count (the check says so too)."""
    bundled = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "ask-user-bad-answer.yaml"
    line = start(tmp_path, home, bundled.read_text().replace("status: WAITING_USER", "status: SUCCEEDED"))
    assert line["status"] == "WAITING_USER"
    assert line["reply_refused"].startswith("answer not matching the expected schema")
    checked = cli("run", str(tmp_path / "s.yaml"), "--json", "--check", home=tmp_path / "other")
    assert checked.returncode == 1
    (line,) = [json.loads(x) for x in checked.stdout.splitlines()]
    assert any("scripted reply was refused (answer not matching" in m for m in line["check"])


def test_an_answer_must_fit_the_question_schema(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, QUESTION)
    run_id, w = line["run_id"], line["waiting"]
    assert (w["kind"], w["approval_id"]) == ("user", None)
    token = w["resume_token"]
    for bad in ('{"order": "the last one"}', '{"order_id": "1032"}', '"ORD-1032"',
                '{"order_id": "ORD-1032", "extra": 1}'):
        rejected(reply(home, run_id, token, "--answer", bad), "answer not matching the expected schema")
    rejected(reply(home, run_id, token, "--approve"), "answer not matching the expected schema")
    assert state(home, run_id) == ("WAITING_USER", "waiting_for_user")
    assert events(home, run_id, "reply_accepted") == []

    ok = reply(home, run_id, token, "--answer", '{"order_id": "ORD-1032"}')
    assert ok.returncode == 0, ok.stderr
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    (accepted,) = events(home, run_id, "reply_accepted")
    assert accepted["answer"] == {"order_id": "ORD-1032"}
    (result,) = events(home, run_id, "operation_result")
    assert result["outcome"] == "success" and result["evidence"][0]["kind"] == "user_answer"


BAD_REPLY_FLAGS = [
    ("--approve", "--answer", '{"a": 1}'),
    ("--approve", "--deny"),
    (),
    ("--answer", "{not json"),
    # Not JSON numbers: no journal keeps them.
    ("--answer", "NaN"),
    ("--answer", '{"order_id": Infinity}'),
    ("--answer", "1e999"),
    # Text no journal can keep: an unpaired surrogate.
    ("--answer", '{"order_id": "ORD \\ud800"}'),
    # A key given twice: which value was meant?
    ("--answer", '{"order_id": "ORD-1002", "order_id": "ORD-1001"}'),
    # Nested deeper than any reader walks: the parser's own recursion limit, and the journal's.
    ("--answer", "[" * 5000 + "]" * 5000),
    ("--answer", "[" * 900 + "]" * 900),
]


def test_bad_reply_flags_exit_2_and_change_nothing(tmp_path: Path, home: Path) -> None:
    """Each bad reply to one waiting run: exit 2, one line, the run still
    waiting; none of them spent the token."""
    line = start(tmp_path, home, QUESTION)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    for flags in BAD_REPLY_FLAGS:
        proc = reply(home, run_id, token, *flags)
        assert proc.returncode == 2, (flags[:2], proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (flags[:2], proc.stderr)
        assert state(home, run_id) == ("WAITING_USER", "waiting_for_user"), flags[:2]
    assert events(home, run_id, "reply_accepted") == []
    assert reply(home, run_id, token, "--answer", '{"order_id": "ORD-1001"}').returncode == 0


def test_a_question_whose_schema_is_not_json_schema_is_rejected_not_a_crash() -> None:
    """Validation refuses such a question now (tool_args_schema checks the
    schema against the metaschema); a run recorded before may wait on one."""
    from loopledger.engine._waits import Reply, ReplyRejected, check_answer

    waiting = {"kind": "user", "schema": {"type": "bogus", "minimum": "x"}}
    with pytest.raises(ReplyRejected) as caught:
        check_answer("r1", waiting, Reply(answer=5))
    assert caught.value.reason == "answer not matching the expected schema"
    assert "not a valid JSON Schema" in caught.value.detail


def test_resume_leaves_waits_alone_until_they_expire(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, w = line["run_id"], line["waiting"]
    before = journal(home).execute("SELECT state_version FROM runs WHERE run_id = ?", (run_id,)).fetchone()

    proc = cli("resume", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    (still,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (still["status"], still["reason"]) == ("WAITING_USER", "waiting_for_approval")
    assert still["waiting"]["resume_token"] is None, "the token is shown once, when the wait begins"
    assert still["waiting"]["approval_id"] == w["approval_id"]
    after = journal(home).execute("SELECT state_version FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    assert after == before, "resume committed nothing for a wait that has not expired"

    later = (datetime.fromisoformat(w["expires_at"]) + timedelta(minutes=1)).isoformat()
    proc = cli("resume", "--json", home=home, env={"LOOPLEDGER_NOW": later})
    assert proc.returncode == 0, proc.stderr
    (expired,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (expired["status"], expired["reason"]) == ("EXPIRED", "expired")
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("permission_denied", "WAIT_EXPIRED")
    assert journal(home).execute("SELECT outcome FROM operations WHERE run_id = ?",
                                 (run_id,)).fetchall() == [("permission_denied",)]  # approval_required replaced
    rejected(reply(home, run_id, w["resume_token"], "--approve"), "stale state version")
    assert executions(home, run_id, "deploy.service") == 0
    assert all_violations(home) == []


def test_the_approval_binds_the_operation_and_its_canonical_arguments(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, w = line["run_id"], line["waiting"]
    conn = journal(home)
    (waiting_json,) = conn.execute("SELECT waiting_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    waiting = json.loads(waiting_json)
    assert waiting["approval_id"] == w["approval_id"] == waiting["wait_id"]
    assert waiting["expires_at"] == w["expires_at"]
    ((op_id, tool, version, args_json, policy, outcome),) = conn.execute(
        "SELECT operation_id, tool, tool_version, canonical_args_json, policy_decision, outcome FROM operations"
        " WHERE run_id = ?", (run_id,)).fetchall()
    assert waiting["operation_id"] == op_id and policy == "approval_required"
    assert outcome == "approval_required"  # the request's result while a person decides
    (body,) = conn.execute("SELECT body FROM artifacts WHERE artifact_id = ? AND kind = 'question'",
                           (waiting["question_id"],)).fetchone()
    question = json.loads(body)
    assert question["kind"] == "approval"
    assert question["operation_id"] == op_id
    assert (question["tool"], question["tool_version"]) == (tool, version) == ("deploy.service", "v2")
    assert question["canonical_arguments"] == json.loads(args_json) == {"service": "checkout", "version": "1.5.0"}
    assert question["actor"] == "acme" and question["scope"]["tenant"] == "acme"
    assert question["goal"] == "Deploy checkout 1.5.0" and "policy_version" in question
    assert question["reason"] == "permission: call 'call_1_1_1': deploy.service needs a person's approval"
    # Asked in the words a person reads: the arguments as JSON, not a Python dict.
    assert question["question"] == 'Approve deploy.service with {"service":"checkout","version":"1.5.0"}?'
    # The token is bound to this wait and the state version the run waits at.
    claims = claims_of(w["resume_token"])
    assert (claims.run_id, claims.wait_id, claims.state_version) == (run_id, waiting["wait_id"],
                                                                     waiting["state_version"])
    # The journal keeps only the token's hash.
    assert w["resume_token"].encode() not in (home / "journal.sqlite").read_bytes()

    assert reply(home, run_id, w["resume_token"], "--approve").returncode == 0
    # A connection of its own: reading the journal file's bytes above let go of
    # the POSIX locks this process's connection held on it (closing any
    # descriptor of a file does), so another process's close could remove the
    # WAL this connection still maps, and it would read a stale journal.
    conn = journal(home)
    # The decision replaced the waiting result with the send's own.
    assert conn.execute("SELECT outcome, dispatch_count FROM operations WHERE operation_id = ?",
                        (op_id,)).fetchone() == ("success", 1)
    (accepted,) = events(home, run_id, "reply_accepted")
    assert (accepted["operation_id"], accepted["decision"], accepted["wait_id"]) == (op_id, "approve",
                                                                                     waiting["wait_id"])
    assert accepted["state_version"] == waiting["state_version"] and accepted["actor"] == "acme"


def test_an_approved_send_has_no_result_until_it_comes_whatever_crashes(tmp_path: Path, home: Path) -> None:
    """approval_required is the request's result while a person decides;
    once approved, the send is next and the request has none until the
    send's own (a crash right after the send leaves it without one, for the
    resume to reconcile)."""
    from invariants import journal_violations

    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    died = reply(home, run_id, token, "--approve", env={"LOOPLEDGER_CRASH_AT": "after_dispatch"})
    assert died.returncode == -9, died.stderr
    assert journal(home).execute("SELECT outcome, status FROM operations WHERE run_id = ?",
                                 (run_id,)).fetchall() == [(None, "running")]
    assert journal_violations(home) == []
    assert cli("resume", home=home).returncode == 0
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    assert journal(home).execute("SELECT outcome FROM operations WHERE run_id = ?", (run_id,)).fetchall() == [
        ("success",)]
    assert executions(home, run_id, "deploy.service") == 1
    assert all_violations(home) == []


def test_a_denial_is_the_operations_result_and_the_model_replans(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY_DENIED)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    # Who says no, and why, must be text: refused before anything is recorded.
    for flags, said in ((("--by", "  "), "--by: expected text, got nothing"),
                        (("--reason", "x" * 2001), "--reason: expected text of 1 to 2,000 characters")):
        refused = reply(home, run_id, token, "--deny", *flags)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    assert state(home, run_id) == ("WAITING_USER", "waiting_for_approval")
    proc = reply(home, run_id, token, "--deny", "--by", "Ana (ops)", "--reason", "freeze week: no deploys")
    assert proc.returncode == 0, proc.stderr
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    (accepted,) = events(home, run_id, "reply_accepted")
    assert (accepted["decision"], accepted["by"], accepted["note"]) == ("deny", "Ana (ops)", "freeze week: no deploys")
    (result,) = events(home, run_id, "operation_result")
    assert (result["outcome"], result["error_code"]) == ("permission_denied", "APPROVAL_DENIED")
    # The model replans from the result, which says who said no and why.
    assert result["summary"]["result"]["message"] == "the approval was denied by Ana (ops): freeze week: no deploys"
    assert executions(home, run_id, "deploy.service") == 0
    conn = journal(home)
    assert conn.execute("SELECT outcome FROM operations WHERE run_id = ?", (run_id,)).fetchall() == [
        ("permission_denied",)]
    # The model was asked again, in a new step whose context carries the denial.
    steps = [row[0] for row in conn.execute(
        "SELECT step FROM candidates WHERE run_id = ? ORDER BY step", (run_id,))]
    assert steps == [1, 2]
    (context_id,) = conn.execute(
        "SELECT context_artifact_id FROM candidates WHERE run_id = ? AND step = 2", (run_id,)).fetchone()
    (body,) = conn.execute("SELECT body FROM artifacts WHERE artifact_id = ?", (context_id,)).fetchone()
    tool_messages = [m for m in json.loads(body)["messages"] if m.get("role") == "tool"]
    assert [(m["tool"], m["outcome"]) for m in tool_messages] == [("deploy.service", "permission_denied")]
    # show names why the operation failed, in its table and in --json.
    shown = json.loads(cli("show", run_id, "--json", home=home).stdout)["operations"]
    assert [(op["tool"], op["error_code"]) for op in shown] == [("deploy.service", "APPROVAL_DENIED")]
    table = cli("show", run_id, home=home).stdout
    assert "APPROVAL_DENIED" in table.split(" operations ")[-1]
    assert all_violations(home) == []


def test_waiting_time_is_recorded_apart_from_processing_time(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    conn = journal(home)
    (entered_us,) = conn.execute(
        "SELECT ts FROM events WHERE run_id = ? AND kind = 'transition' AND to_state = 'WAITING_USER'",
        (run_id,)).fetchone()
    # The person answers 40 minutes later (the engine's clock is pinned to then).
    answered = datetime.fromtimestamp(entered_us / 1e6).astimezone() + timedelta(minutes=40)
    assert reply(home, run_id, token, "--approve", env={"LOOPLEDGER_NOW": answered.isoformat()}).returncode == 0

    rows = conn.execute("SELECT seq, ts, kind, from_state, to_state FROM events WHERE run_id = ? ORDER BY seq",
                        (run_id,)).fetchall()
    waited = processed = 0
    for (_, ts, _, _, _), (_, next_ts, kind, from_state, _) in zip(rows, rows[1:]):
        if kind == "transition" and from_state == "WAITING_USER":
            waited += next_ts - ts
        else:
            processed += next_ts - ts
    left = [r for r in rows if r[2] == "transition" and r[3] == "WAITING_USER"]
    assert len(left) == 1 and left[0][1] - entered_us == 40 * 60 * 1_000_000
    assert waited == 40 * 60 * 1_000_000, "the time between entering and leaving WAITING_USER is the wait"
    assert processed == (rows[-1][1] - rows[0][1]) - waited
    assert processed < waited
    # show says it too: in --json under "time", and on the table's status lines.
    shown = json.loads(cli("show", run_id, "--json", home=home).stdout)["time"]
    assert shown["waiting_user_s"] == 40 * 60 and shown["waiting_tool_s"] == 0
    assert shown["queued_s"] + shown["processing_s"] == pytest.approx(processed / 1e6)
    assert shown["queued_s"] == round((rows[1][1] - rows[0][1]) / 1e6, 6)
    table = cli("show", run_id, home=home).stdout
    assert "waiting for a person 2400.000 s" in table and "started " in table


def test_two_replies_with_one_token_at_once_exactly_one_is_accepted(tmp_path: Path, home: Path) -> None:
    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    cmd = [*CLI, "reply", run_id, "--token", token, "--approve", "--home", str(home)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in outs)
    assert codes == [0, 1], outs
    (loser,) = [err for code, _, err in outs if code == 1]
    assert "rejected" in loser and "Traceback" not in loser
    assert len(events(home, run_id, "reply_accepted")) == 1
    assert executions(home, run_id, "deploy.service") == 1
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    assert all_violations(home) == []


def test_a_reply_that_loses_the_race_after_its_checks_is_rejected_as_stale(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving the two processes above may or may not hit, made
    certain: reply A passes every check, reply B is accepted, then A's
    commit meets the moved state version and A is refused."""
    from loopledger.engine import _people
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._waits import Reply, ReplyRejected

    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    first, second = (Runner(Home.resolve(home), auto_reply=False) for _ in range(2))
    real_check = _people.check_answer

    def check_then_lose(*args: Any) -> None:
        real_check(*args)
        monkeypatch.setattr(_people, "check_answer", real_check)
        second.controller.reply(run_id, token, Reply(approve=True))  # B wins meanwhile

    monkeypatch.setattr(_people, "check_answer", check_then_lose)
    try:
        with pytest.raises(ReplyRejected) as refused:
            first.controller.reply(run_id, token, Reply(approve=True))
        assert refused.value.reason == "stale state version"
        assert second.store.get_run(run_id).state.value == "SUCCEEDED"
    finally:
        first.close()
        second.close()
    assert len(events(home, run_id, "reply_accepted")) == 1
    assert executions(home, run_id, "deploy.service") == 1


EXPORT = """\
id: wait-export-pinned
contract:
  goal: Export the monthly report
  required_evidence: [report_ready]
  allowed_tools: [reports.export]
model:
  - tool_calls: [{name: reports.export, arguments: {query: monthly, delay_s: 5}}]
  - final: Exported.
    claims: [{text: exported, evidence: [report_ready]}]
  - final: Exported.
    claims: [{text: exported, evidence: [report_ready]}]
"""


def test_under_a_pinned_clock_run_leaves_background_work_waiting(tmp_path: Path, home: Path) -> None:
    """No time passes under LOOPLEDGER_NOW, so the export never falls due:
    run returns the run waiting for it, and a resume at a later time ends it."""
    path = tmp_path / "export.yaml"
    path.write_text(EXPORT)
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": "2026-12-01T00:00:00+00:00"})
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (line["status"], line["reason"], line["waiting"]["kind"]) == ("WAITING_TOOL", "waiting_for_tool", "tool")
    later = cli("resume", "--json", home=home, env={"LOOPLEDGER_NOW": "2026-12-01T00:00:06+00:00"})
    (line,) = [json.loads(x) for x in later.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
    assert all_violations(home) == []


def test_work_that_ended_before_a_late_resume_is_recorded_before_the_deadline_ends_the_run(
        tmp_path: Path, home: Path) -> None:
    """Resumed past the deadline, the run still ends BUDGET_EXHAUSTED, but
    the export that finished meanwhile is polled and recorded first, not
    named as work still running."""
    _, done, finalizing = _export_resumed_past_its_deadline(tmp_path, home, deadline_s=30, resumed_after_s=31)
    assert done["state"] == "succeeded"
    assert finalizing["pending_work"] == []
    assert all_violations(home) == []


def _export_resumed_past_its_deadline(tmp_path: Path, home: Path, *, deadline_s: int,
                                      resumed_after_s: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """EXPORT (5 s of work) run under a pinned clock with a deadline, resumed
    past it: the run ends BUDGET_EXHAUSTED / deadline. Its id, its one
    work_completed event and its FINALIZING move for the deadline."""
    path = tmp_path / "export.yaml"
    path.write_text(EXPORT.replace("model:", f"budgets: {{deadline_s: {deadline_s}}}\nmodel:"))
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": "2026-12-01T00:00:00+00:00"})
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert line["status"] == "WAITING_TOOL"
    later = cli("resume", "--json", home=home,
                env={"LOOPLEDGER_NOW": f"2026-12-01T00:00:{resumed_after_s:02d}+00:00"})
    assert later.returncode == 0, later.stderr
    assert state(home, line["run_id"]) == ("BUDGET_EXHAUSTED", "deadline")
    (done,) = events(home, line["run_id"], "work_completed")
    finalizing = next(p for p in events(home, line["run_id"], "transition") if p.get("reason") == "deadline")
    return line["run_id"], done, finalizing


def test_work_still_running_when_the_deadline_ends_its_run_is_stopped_and_recorded(
        tmp_path: Path, home: Path) -> None:
    """Resumed past the deadline before its export fell due, the run ends
    BUDGET_EXHAUSTED; the export is stopped, not left to run on with no
    one to record what it did."""
    run_id, done, finalizing = _export_resumed_past_its_deadline(tmp_path, home, deadline_s=3, resumed_after_s=4)
    assert (done["state"], done["error_code"]) == ("cancelled", "CANCELLED")
    assert finalizing["pending_work"] == [done["work_id"]]
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    assert backend.execute("SELECT state FROM work WHERE work_id = ?", (done["work_id"],)).fetchone() == ("cancelled",)
    # A final answer that waits for work names no outcome on its way through FINALIZING.
    (waits,) = [p for p in events(home, run_id, "transition") if p.get("await_work")]
    assert "status" not in waits and waits["pending_work"] == [done["work_id"]]
    assert all_violations(home) == []


def test_resume_drives_a_run_on_through_background_work_it_starts(tmp_path: Path, home: Path) -> None:
    """A run killed before its export was sent: the resume sends it, and,
    as ``run`` would, drives the run on until the work is done, instead of
    leaving it waiting for a second resume."""
    path = tmp_path / "export.yaml"
    path.write_text(EXPORT.replace("delay_s: 5", "delay_s: 0.3"))
    crashed = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "2"})
    assert crashed.returncode == -9, (crashed.returncode, crashed.stderr)
    proc = cli("resume", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
    assert executions(home, line["run_id"], "reports.export") == 1
    assert all_violations(home) == []


def test_resume_polls_a_run_already_waiting_for_background_work_once(tmp_path: Path, home: Path) -> None:
    """A run that waited for background work before the resume began is
    polled, not waited for: its export, sent at a pinned time a day ahead,
    is not due, and the resume returns with the run waiting as it was."""
    path = tmp_path / "export.yaml"
    path.write_text(EXPORT)
    ahead = (datetime.now().astimezone() + timedelta(days=1)).isoformat()
    (line,) = [json.loads(x) for x in cli("run", str(path), "--json", home=home,
                                           env={"LOOPLEDGER_NOW": ahead}).stdout.splitlines()]
    assert line["status"] == "WAITING_TOOL"
    version = journal(home).execute("SELECT state_version FROM runs WHERE run_id = ?", (line["run_id"],)).fetchone()
    proc = cli("resume", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    (still,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (still["status"], still["reason"]) == ("WAITING_TOOL", "waiting_for_tool")
    assert journal(home).execute("SELECT state_version FROM runs WHERE run_id = ?",
                                 (line["run_id"],)).fetchone() == version
    assert all_violations(home) == []


def test_the_table_output_shows_the_token_whole(tmp_path: Path, home: Path) -> None:
    """Without --json the token is still shown once, uncut, and it works."""
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY)
    proc = cli("run", str(path), home=home, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Resume tokens"))
    run_id = lines[at + 1].split()[0]
    token = lines[at + 2].strip()
    done = reply(home, run_id, token, "--approve")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "SUCCEEDED"


def test_a_new_token_replaces_a_lost_one(tmp_path: Path, home: Path) -> None:
    """A token lost in a crash is replaced by a new one; the old one stops
    working, the wait (question, expiry) stays the same."""
    line = start(tmp_path, home, DEPLOY)
    run_id, old = line["run_id"], line["waiting"]["resume_token"]
    issued = cli("token", run_id, "--json", home=home)
    assert issued.returncode == 0, issued.stderr
    (renewed,) = [json.loads(x) for x in issued.stdout.splitlines()]
    new = renewed["waiting"]["resume_token"]
    assert new and new != old
    assert renewed["waiting"]["expires_at"] == line["waiting"]["expires_at"]
    assert renewed["waiting"]["approval_id"] == line["waiting"]["approval_id"]
    rejected(reply(home, run_id, old, "--approve"), "stale state version")
    done = reply(home, run_id, new, "--approve")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "SUCCEEDED"
    assert executions(home, run_id, "deploy.service") == 1
    # Nothing waits any more: no token to issue.
    again = cli("token", run_id, home=home)
    assert again.returncode == 1 and "not waiting" in again.stderr
    assert all_violations(home) == []


def test_no_token_is_issued_for_a_wait_that_expired(tmp_path: Path, home: Path) -> None:
    """It could only be refused: the run expires instead, as a late reply makes it."""
    line = start(tmp_path, home, DEPLOY)
    run_id, w = line["run_id"], line["waiting"]
    later = (datetime.fromisoformat(w["expires_at"]) + timedelta(seconds=1)).isoformat()
    issued = cli("token", run_id, "--json", home=home, env={"LOOPLEDGER_NOW": later})
    assert issued.returncode == 1 and "expired" in issued.stderr
    assert state(home, run_id) == ("EXPIRED", "expired")
    assert events(home, run_id, "token_reissued") == []
    assert all_violations(home) == []


def test_a_question_with_a_schema_that_is_not_json_schema_is_repaired(tmp_path: Path, home: Path) -> None:
    """Nobody could answer it: the model gets the schema's error back, and
    the run never waits on it."""
    path = tmp_path / "bad-question.yaml"
    path.write_text("""\
id: bad-question
contract: {goal: ask, allowed_tools: [ask_user]}
model:
  - tool_calls: [{name: ask_user, arguments: {question: "How many?", schema: {type: bogus, minimum: "x"}}}]
  - final: I will not ask after all.
expect:
  status: SUCCEEDED
  decisions: [{step: 1, validator: tool_args_schema, verdict: repair}]
""")
    proc = cli("run", str(path), "--check", "--json", home=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["status"] == "SUCCEEDED"


@pytest.mark.parametrize(("content", "mode", "env", "names"), [
    (b"x", 0o600, {}, ["secret.key", "at least 32 bytes, got 1"]),
    (b"k" * 32, 0o644, {}, ["secret.key", "mode 0644", "chmod 600"]),
    (None, None, {"LOOPLEDGER_SECRET": "short"}, ["LOOPLEDGER_SECRET", "at least 32 bytes, got 5"]),
])
def test_a_signing_secret_that_could_be_forged_is_refused(tmp_path: Path, home: Path, content: bytes | None,
                                                         mode: int | None, env: dict[str, str],
                                                         names: list[str]) -> None:
    """Resume tokens are HMACs under the data directory's secret: a short
    one, or one others may read, would let them be forged. The command
    refuses it before it records anything."""
    if content is not None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "secret.key").write_bytes(content)
        (home / "secret.key").chmod(mode)
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOY)
    proc = cli("run", str(path), "--json", home=home, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert proc.stdout == ""
    if (home / "journal.sqlite").exists():
        assert journal(home).execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


def _first_secret(home: str, barrier: Any, out: Any) -> None:
    from loopledger.engine._waits import load_secret

    barrier.wait()
    out.put(load_secret(Path(home)))


def test_processes_making_the_secret_at_once_all_get_the_same_whole_one(tmp_path: Path) -> None:
    """The secret is written whole under a name of its own and then linked
    into place: a process that loses the race reads the winner's secret,
    never an empty or half-written file."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for attempt in range(5):
        home = tmp_path / f"h{attempt}"
        barrier, out = context.Barrier(6), context.Queue()
        procs = [context.Process(target=_first_secret, args=(str(home), barrier, out)) for _ in range(6)]
        for p in procs:
            p.start()
        secrets_seen = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert len(set(secrets_seen)) == 1 and len(secrets_seen[0]) == 32
        assert (home / "secret.key").read_bytes() == secrets_seen[0]
        assert sorted(p.name for p in home.iterdir()) == ["secret.key"]
        assert (home / "secret.key").stat().st_mode & 0o777 == 0o600


def test_an_approval_that_comes_after_the_deadline_sends_nothing(tmp_path: Path, home: Path) -> None:
    """The wait counts against the deadline: the wait ends with it, so an
    approval past it is refused as expired, the deploy is not sent, its
    result says why and the run ends BUDGET_EXHAUSTED."""
    text = DEPLOY.replace("model:", "budgets: {deadline_s: 60}\nmodel:")
    start_at = "2026-01-01T00:00:00+00:00"
    path = tmp_path / "late.yaml"
    path.write_text(text)
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": start_at})
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert line["status"] == "WAITING_USER"
    late = reply(home, line["run_id"], line["waiting"]["resume_token"], "--approve",
                 env={"LOOPLEDGER_NOW": "2026-01-01T00:02:00+00:00"})
    rejected(late, "expired")
    assert state(home, line["run_id"]) == ("BUDGET_EXHAUSTED", "deadline")
    assert executions(home, line["run_id"], "deploy.service") == 0
    (result,) = events(home, line["run_id"], "operation_result")
    assert (result["outcome"], result["error_code"]) == ("cancelled", "DEADLINE")
    assert events(home, line["run_id"], "operation_dispatched") == []
    assert all_violations(home) == []


def test_past_the_deadline_nobody_is_asked_to_approve_a_call(tmp_path: Path, home: Path) -> None:
    """An answer that came after the deadline is refused (the wait ended
    with the deadline), and the deploy proposed with the question is not
    put to a person for approval: it is cancelled."""
    text = """\
id: answer-late
contract:
  goal: Deploy the version the person names
  required_evidence: ["deployed:checkout"]
  allowed_tools: [ask_user, deploy.service]
  wait_ttl_s: 3600
budgets: {deadline_s: 60}
model:
  - tool_calls:
      - {name: ask_user, arguments: {question: "Which version?", schema: {type: string}}}
      - {name: deploy.service, arguments: {service: checkout, version: 1.5.0}}
  - final: deployed
    claims: [{text: deployed, evidence: ["deployed:checkout"]}]
"""
    path = tmp_path / "late.yaml"
    path.write_text(text)
    proc = cli("run", str(path), "--json", home=home, env={"LOOPLEDGER_NOW": "2026-01-01T00:00:00+00:00"})
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert line["waiting"]["kind"] == "user"
    late = reply(home, line["run_id"], line["waiting"]["resume_token"], "--answer", '"1.5.0"',
                 env={"LOOPLEDGER_NOW": "2026-01-01T00:02:00+00:00"})
    rejected(late, "expired")
    (after,) = [json.loads(x) for x in late.stdout.splitlines()]
    assert (after["status"], after["reason"]) == ("BUDGET_EXHAUSTED", "deadline"), after
    assert state(home, line["run_id"]) == ("BUDGET_EXHAUSTED", "deadline")
    results = {e["error_code"] for e in events(home, line["run_id"], "operation_result") if e.get("error_code")}
    assert results == {"DEADLINE"}
    assert executions(home, line["run_id"], "deploy.service") == 0
    assert all_violations(home) == []


@pytest.mark.parametrize("command", ["reply", "token"])
def test_every_rejection_is_one_json_line_under_json(tmp_path: Path, home: Path, command: str) -> None:
    """A script reading ``--json`` gets one object per refusal: for a run the
    journal does not know (under a bad token or a good one), a home without
    a journal, and a run that is not waiting; the reason under ``rejected``."""
    line = start(tmp_path, home, DEPLOY)
    run_id, token = line["run_id"], line["waiting"]["resume_token"]

    def refused(proc: subprocess.CompletedProcess[str], run: str, status: str | None, reason: str) -> None:
        assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        (out,) = [json.loads(x) for x in proc.stdout.splitlines()]
        assert (out["run_id"], out["status"]) == (run, status), out
        assert out["rejected"].startswith(reason), out

    def ask(run: str, where: Path, token: str = "garbage") -> subprocess.CompletedProcess[str]:
        if command == "reply":
            return cli("reply", run, "--token", token, "--approve", "--json", home=where)
        return cli("token", run, "--json", home=where)

    unknown = "wrong run" if command == "reply" else "no run"  # named before any token is read
    refused(ask("nosuchrun", home), "nosuchrun", None, unknown)
    refused(ask("nosuchrun", tmp_path / "nowhere"), "nosuchrun", None, "wrong run" if command == "reply" else "no run")
    assert not (tmp_path / "nowhere").exists()
    if command == "reply":
        # A genuine token, sent with another run's id.
        refused(ask("nosuchrun", home, token), "nosuchrun", None, "wrong run")
    done = reply(home, run_id, token, "--approve")
    assert done.returncode == 0, done.stderr
    refused(ask(run_id, home, token), run_id, "SUCCEEDED", "already used" if command == "reply" else "not waiting")
    assert state(home, run_id) == ("SUCCEEDED", "completed")


def test_an_answer_a_pattern_would_never_finish_matching_is_refused_in_time(tmp_path: Path, home: Path) -> None:
    """The question's schema comes from the model: a pattern that backtracks
    without end on the answer must not hang the reply (nor a run's scripted
    one). The match is cut off, and the answer refused, saying why."""
    import time

    line = start(tmp_path, home, """\
id: redos
contract: {goal: ask, allowed_tools: [ask_user]}
model:
  - tool_calls: [{name: ask_user, arguments: {question: q, schema: {type: string, pattern: "(a|a)*$"}}}]
  - final: done
""")
    run_id, token = line["run_id"], line["waiting"]["resume_token"]
    began = time.monotonic()
    refused = reply(home, run_id, token, "--answer", json.dumps("a" * 40 + "!"))
    assert time.monotonic() - began < 30
    rejected(refused, "answer not matching the expected schema")
    assert "could not be matched against '(a|a)*$' within" in refused.stderr
    assert state(home, run_id) == ("WAITING_USER", "waiting_for_user")
    assert reply(home, run_id, token, "--answer", json.dumps("aaaa")).returncode == 0  # one that fits


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "string", "pattern": "["}, "'[' is not a 'regex'"),
    ({"type": "object", "patternProperties": {"^x(": {}}}, "'^x(' is not a 'regex'"),
    ({"$ref": "#/definitions/nope"}, "$ref '#/definitions/nope' resolves to nothing here"),
    ({"$ref": "http://example.com/answer.json"}, "$ref 'http://example.com/answer.json' resolves to nothing here"),
    ({"not": {}}, "it accepts no value at all"),
])
def test_a_question_no_answer_could_fit_is_never_asked(tmp_path: Path, home: Path, schema: dict, why: str) -> None:
    """Valid as JSON Schema's metaschema sees it, yet nothing could be
    checked against it: the call fails (validation_failed) with the reason,
    the model goes on, and the run never waits on it (nothing is fetched)."""
    path = tmp_path / "unanswerable.yaml"
    path.write_text(json.dumps({
        "id": "unanswerable", "contract": {"goal": "ask", "allowed_tools": ["ask_user"]},
        "model": [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "q", "schema": schema}}]},
                  {"final": "I will not ask after all."}]}))
    proc = cli("run", str(path), "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
    (result,) = events(home, line["run_id"], "operation_result")
    assert (result["outcome"], result["error_code"]) == ("validation_failed", "UNANSWERABLE_SCHEMA")
    assert why in json.dumps(result)
    assert events(home, line["run_id"], "reply_accepted") == []
    assert all_violations(home) == []


@pytest.mark.parametrize("name", ["approval-deploy-approved.yaml", "ask-user-answered.yaml"])
def test_resume_goes_on_with_the_scenarios_scripted_replies_after_a_crash(tmp_path: Path, name: str) -> None:
    """A `run` killed after any of its commits, then `loopledger resume`: the
    scenario's `user:` replies the dead process did not deliver are
    delivered by the resume (through a person's checks, with the wait's
    token signed again by the data directory's secret), so the run ends as
    its scenario expects, each side effect once."""
    from loopledger.engine._scenario import load_scenario

    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / name
    expect = load_scenario(scenario).expect
    # Every other crash point (the crash sweep takes every one, in-process):
    # this is the command's own path, two process starts a point.
    for n in [1, 2, *range(3, 60, 2)]:
        home = tmp_path / f"crash-{n}"
        killed = cli("run", str(scenario), "--json", home=home, env={"LOOPLEDGER_CRASH_AFTER_COMMITS": str(n)})
        if killed.returncode == 0:
            break  # the whole run took fewer commits than that: every crash point was tried
        assert killed.returncode == -9, killed.stderr
        if not journal(home).execute("SELECT COUNT(*) FROM runs").fetchone()[0]:
            continue  # killed before the run was made: nothing to resume
        resumed = cli("resume", "--json", home=home)
        assert resumed.returncode == 0, (n, resumed.stderr)
        # (Killed after its terminal commit, the run is not resumed: it is done.)
        ((run_id,),) = journal(home).execute("SELECT run_id FROM runs").fetchall()
        assert state(home, run_id) == (expect.status, expect.reason), (n, resumed.stdout)
        for tool, count in (expect.side_effects or {}).items():
            assert executions(home, run_id, tool) == count, (n, tool)
        assert all_violations(home) == []
    else:
        raise AssertionError("the run never finished uninterrupted")
    assert n > 5  # crash points before, at and after the wait were all tried


def test_work_that_ends_between_steps_counts_for_the_next_one(tmp_path: Path, home: Path) -> None:
    """A quick export ends while the agent looks an order up: the step that
    follows sees its result (its context, the gate) and counts its evidence
    and its completed operation as its own progress (the loop detectors'
    input), not the step already closed."""
    path = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "background-done-before-the-answer.yaml"
    proc = cli("run", str(path), "--json", "--check", home=home)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    (done,) = events(home, line["run_id"], "work_completed")
    assert done["state"] == "succeeded"
    closed = {c["step"]: c for c in events(home, line["run_id"], "step_closed")}
    assert (closed[1]["new_evidence"], closed[1]["completed_operations"]) == (0, 0)  # the export only accepted
    assert (closed[2]["new_evidence"], closed[2]["completed_operations"]) == (2, 2)  # the order and the report
    assert all_violations(home) == []


def test_a_crash_while_a_run_ends_never_forgets_the_work_it_cut_short(tmp_path: Path, home: Path) -> None:
    """A suite without the completion gate lets a final answer through while
    an export runs: the run ends FAILED / tool_failed, the export stopped.
    Killed after each of its commits and resumed, it ends the same way (the
    stop was a commit of its own: after it nothing was pending, and the
    resume saw a success)."""
    (tmp_path / "bare.yaml").write_text("name: bare\nvalidators: [structure]\n")
    scenario = tmp_path / "cut.yaml"
    scenario.write_text(EXPORT.replace("delay_s: 5", "delay_s: 30").replace("model:", "suite: bare.yaml\nmodel:"))
    straight = cli("run", str(scenario), "--json", home=tmp_path / "straight")
    (line,) = [json.loads(x) for x in straight.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("FAILED", "tool_failed")
    for n in range(1, 30):
        where = tmp_path / f"crash{n}"
        crashed = cli("run", str(scenario), "--json", home=where, env={"LOOPLEDGER_CRASH_AFTER_COMMITS": str(n)})
        if crashed.returncode == 0:
            break  # the run made fewer commits: every crash point was swept
        assert crashed.returncode == -9, (n, crashed.returncode, crashed.stderr)
        resumed = cli("resume", "--json", home=where)
        assert resumed.returncode == 0, (n, resumed.stderr)
        (run_id,) = [r for (r,) in journal(where).execute("SELECT run_id FROM runs")]
        assert state(where, run_id) == ("FAILED", "tool_failed"), n
        (done,) = events(where, run_id, "work_completed")
        assert done["state"] == "cancelled", n
        assert all_violations(where) == []
    assert n > 3, "the sweep went past every commit of the run"


LIMIT_CHECKS = '''
from loopledger.validators import Issue, Verdict, validator


@validator(name="acme.refund_limit", version="1")
def refund_limit(*, max_amount: float = 100.0):
    def check(inp):
        return [Issue(Verdict.ASK, "refund_over_limit", f"refunds over {max_amount} need a person", {"call_id": c.call_id})
                for c in inp.proposed_calls if c.tool == "payments.refund" and c.arguments.get("amount", 0) > max_amount]
    return check


@validator(name="acme.ask_about_all", version="1")
def ask_about_all():
    def check(inp):
        return [Issue(Verdict.ASK, "approval_required", "reads need a person today")] if inp.proposed_calls else []
    return check
'''

LIMIT_SUITE = """\
name: acme
imports: [acme_limit_checks]
validators: [structure, tool_exists, tool_args_schema, permission, completion_gate, {members}]
"""

OVER_LIMIT = """\
id: refund-over-limit
description: the suite asks a person about a refund over its limit; the read before it needs nobody
suite: acme.yaml
contract:
  goal: Refund ORD-1042 in full
  required_evidence: [refund_confirmed]
  allowed_tools: [orders.get_order, payments.refund]
model:
  - tool_calls:
      - {name: orders.get_order, arguments: {order_id: ORD-1042}}
      - {name: payments.refund, arguments: {order_id: ORD-1042, amount: 25.0}}
  - final: Refunded ORD-1042.
    claims: [{text: refunded, evidence: [refund_confirmed]}]
"""


def _acme(tmp_path: Path, members: str) -> None:
    (tmp_path / "acme_limit_checks.py").write_text(LIMIT_CHECKS)
    (tmp_path / "acme.yaml").write_text(LIMIT_SUITE.format(members=members))


@pytest.mark.parametrize("answer", ["--approve", "--deny"])
def test_a_call_a_validator_asks_about_waits_for_an_approval_of_that_call(tmp_path: Path, home: Path,
                                                                         answer: str) -> None:
    """`ask` on a proposed call means a person approves that call (docs/validators.md):
    whatever the code, it is an approval wait bound to the operation, the other
    calls run, and nothing the person was asked about runs before the answer."""
    _acme(tmp_path, "acme.refund_limit: {max_amount: 10.0}")
    line = start(tmp_path, home, OVER_LIMIT)
    run_id, w = line["run_id"], line["waiting"]
    assert (line["status"], line["reason"], w["kind"]) == ("WAITING_USER", "waiting_for_approval", "approval")
    assert executions(home, run_id, "payments.refund") == 0, "nothing the person is asked about runs first"
    (question,) = [e["waiting"] for e in events(home, run_id, "transition") if e.get("waiting")]
    ops = dict(journal(home).execute("SELECT tool, policy_decision FROM operations WHERE run_id = ?", (run_id,)))
    assert ops == {"orders.get_order": "allow", "payments.refund": "approval_required"}
    assert question["operation_id"].endswith(".op2")
    body = json.loads(journal(home).execute("SELECT body FROM artifacts WHERE artifact_id = ?",
                                            (question["question_id"],)).fetchone()[0])
    assert body["reason"] == "acme.refund_limit: refunds over 10.0 need a person", body
    done = reply(home, run_id, w["resume_token"], answer)
    assert done.returncode == 0, done.stderr
    (after,) = [json.loads(x) for x in done.stdout.splitlines()]
    if answer == "--approve":
        assert (after["status"], after["reason"]) == ("SUCCEEDED", "completed")
        assert executions(home, run_id, "payments.refund") == 1
    else:
        assert executions(home, run_id, "payments.refund") == 0
        outcome = journal(home).execute("SELECT outcome FROM operations WHERE run_id = ? AND tool = ?",
                                        (run_id, "payments.refund")).fetchone()[0]
        assert outcome == "permission_denied"
    assert all_violations(home) == []


def test_an_ask_that_names_no_call_holds_every_call_of_the_candidate(tmp_path: Path, home: Path) -> None:
    """A tool the runtime lets run alone needs a person when the suite says so."""
    _acme(tmp_path, "acme.ask_about_all")
    line = start(tmp_path, home, OVER_LIMIT)
    assert (line["status"], line["waiting"]["kind"]) == ("WAITING_USER", "approval")
    policy = dict(journal(home).execute("SELECT tool, policy_decision FROM operations WHERE run_id = ?",
                                        (line["run_id"],)))
    assert policy == {"orders.get_order": "approval_required", "payments.refund": "approval_required"}
    assert executions(home, line["run_id"], "payments.refund") == 0


def test_an_operations_error_in_show_is_what_its_last_result_said() -> None:
    """A result that followed a failed attempt (a timeout reconciled as
    done) clears its error; background work's completion gives its
    operation's."""
    from types import SimpleNamespace

    from loopledger.engine._show import operation_errors

    def event(kind: str, **payload: Any) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, payload_json=json.dumps(payload))

    ops = [{"operation_id": "a", "work_id": None}, {"operation_id": "b", "work_id": "w1"},
           {"operation_id": "c", "work_id": None}]
    events = [event("operation_result", operation_id="a", error_code="TIMEOUT"),
              event("operation_result", operation_id="a", error_code=None),
              event("operation_result", operation_id="b", error_code=None),
              event("work_completed", work_id="w1", error_code="EXPORT_FAILED"),
              event("transition", operation_id="c", error_code="NOT_A_RESULT"),
              event("operation_result", operation_id="c", error_code="WAIT_EXPIRED")]
    assert operation_errors(events, ops) == {"b": "EXPORT_FAILED", "c": "WAIT_EXPIRED"}


AMBIGUOUS = """\
id: wait-ambiguous
description: the order reference matches two orders
contract:
  goal: Look up the customer's order ORD-1044
  required_evidence: ["order_found:ORD-1045"]
  allowed_tools: [orders.get_order]
faults:
  - {tool: orders.get_order, call: 1, kind: object_ambiguous, candidates: [ORD-1044, ORD-1045]}
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1044}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1045}}]
  - final: ORD-1045 is paid.
    claims: [{text: found, evidence: ["order_found:ORD-1045"]}]
expect: {status: SUCCEEDED, reason: completed}
"""


def test_an_ambiguous_object_is_a_question_for_a_person_whose_answer_goes_to_the_model(
        tmp_path: Path, home: Path) -> None:
    """OBJECT_AMBIGUOUS is not the model's to guess: the runtime asks which
    object was meant, an answer must be one of the candidates, and the
    model plans its next step with the answer."""
    line = start(tmp_path, home, AMBIGUOUS)
    run_id, w = line["run_id"], line["waiting"]
    assert (line["status"], w["kind"], w["approval_id"]) == ("WAITING_USER", "user", None)
    (waiting,) = [json.loads(x) for x in cli("runs", "--json", home=home).stdout.splitlines()]
    assert waiting["waiting"]["reason"] == "OBJECT_AMBIGUOUS"
    assert "'ORD-1044' matches more than one object (ORD-1044, ORD-1045)" in waiting["waiting"]["question"]
    (failed,) = events(home, run_id, "operation_result")
    assert (failed["outcome"], failed["error_code"]) == ("validation_failed", "OBJECT_AMBIGUOUS")
    assert [c["step"] for c in events(home, run_id, "step_closed")] == [1], "the step ended with the question"

    rejected(reply(home, run_id, w["resume_token"], "--answer", '"ORD-1099"'),
             "answer not matching the expected schema")
    ok = reply(home, run_id, w["resume_token"], "--answer", '"ORD-1045"')
    assert ok.returncode == 0, ok.stderr
    assert state(home, run_id) == ("SUCCEEDED", "completed")
    (accepted,) = events(home, run_id, "reply_accepted")
    assert accepted["answer"] == "ORD-1045" and accepted["operation_id"] is None
    # The model's next context holds the failed call's candidates and the answer.
    (context_id,) = [json.loads(p)["context_id"] for (p,) in journal(home).execute(
        "SELECT payload_json FROM events WHERE run_id = ? AND kind = 'transition' AND to_state = 'MODEL_RUNNING'"
        " AND step = 2", (run_id,))]
    (body,) = journal(home).execute("SELECT body FROM artifacts WHERE artifact_id = ?", (context_id,)).fetchone()
    assert "ORD-1045" in body and "OBJECT_AMBIGUOUS" in body and "The user answered: 'ORD-1045'" in body
    assert all_violations(home) == []


@pytest.mark.parametrize(("fault", "expected"), [
    ("{tool: orders.get_order, call: 1, kind: object_ambiguous}", "two or more different non-empty texts"),
    ("{tool: orders.get_order, call: 1, kind: object_ambiguous, candidates: [ORD-1, ORD-1]}",
     "two or more different non-empty texts"),
    ("{tool: orders.get_order, call: 1, kind: rate_limit, candidates: [ORD-1, ORD-2]}",
     "only an object_ambiguous fault has candidates"),
])
def test_an_ambiguity_fault_names_its_candidates(tmp_path: Path, home: Path, fault: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(AMBIGUOUS.replace(
        "  - {tool: orders.get_order, call: 1, kind: object_ambiguous, candidates: [ORD-1044, ORD-1045]}",
        f"  - {fault}"))
    proc = cli("run", str(path), home=home)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert str(path) in line and "faults[0].candidates" in line and expected in line, line
    assert not (home / "journal.sqlite").exists() or journal(home).execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
