"""Every bundled scenario, run for real through the command line with
``--check``; then the CONTRACT's hard rules on every recorded run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from invariants import all_violations

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "datasets" / "scenarios"


def loopledger(*args: str, home: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from loopledger._cli import main; main()", *args, "--home", str(home)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=check)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    home = tmp_path_factory.mktemp("bundled")
    lines: list[dict] = []
    for version in ("v1", "v2"):
        proc = loopledger("run", str(SCENARIOS), "--check", "--json", "--prompt-version", version,
                          "--concurrency", "8", home=home)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        lines += [json.loads(line) for line in proc.stdout.splitlines()]
    return home, lines


def test_every_bundled_scenario_ends_as_it_expects_under_both_prompt_versions(recorded) -> None:
    home, lines = recorded
    scenario_count = len(list(SCENARIOS.glob("*.yaml")))
    assert len(lines) == 2 * scenario_count
    assert [line for line in lines if line["check"] != "ok"] == []


def test_hard_rules_hold_on_every_recorded_run(recorded) -> None:
    home, _ = recorded
    assert all_violations(home) == []


def test_json_lines_carry_the_contract_fields(recorded) -> None:
    _, lines = recorded
    for line in lines:
        assert {"run_id", "task_id", "status", "reason"} <= line.keys()
    waiting = [line for line in lines if line["status"] == "WAITING_USER"]
    assert waiting, "the bundled scenarios include runs left waiting for a person"
    for line in waiting:
        w = line["waiting"]
        assert w["kind"] in ("user", "approval") and w["expires_at"] and w["resume_token"]
        assert (w["approval_id"] is not None) == (w["kind"] == "approval")


def test_the_journal_keeps_no_resume_token(recorded) -> None:
    home, lines = recorded
    raw = (home / "journal.sqlite").read_bytes()
    for line in lines:
        if line.get("waiting"):
            assert line["waiting"]["resume_token"].encode() not in raw


def test_show_prints_a_timeline_and_unknown_runs_exit_1(recorded) -> None:
    home, lines = recorded
    run_id = next(line["run_id"] for line in lines if line["task_id"] == "fault-timeout-after-commit")
    proc = loopledger("show", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    for expected in ("RECONCILING", "operation_result", "payments.refund", "SUCCEEDED"):
        assert expected in proc.stdout
    # Every decision is there: the accepting validators on one line per candidate.
    assert "13 of 13 validators" in proc.stdout and "tool_args_schema" in proc.stdout
    rejected = next(line["run_id"] for line in lines if line["task_id"] == "final-premature")
    shown = loopledger("show", rejected, home=home).stdout
    assert "12 of 13 validators" in shown and "missing_evidence" in shown
    missing = loopledger("show", "no-such-run", home=home)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "unknown run 'no-such-run': neither in the journal nor in" in missing.stderr


def test_show_takes_a_run_by_a_unique_start_of_its_id(recorded) -> None:
    """As git takes a commit: one run starting with it is shown; several are
    exit 1, named; an empty id is no start of anything."""
    home, lines = recorded
    run_id = next(line["run_id"] for line in lines if line["task_id"] == "fault-timeout-after-commit")
    shown = loopledger("show", "fault-timeout-after-commit.v1", home=home)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith(run_id)
    several = loopledger("show", "happy-", home=home)
    assert several.returncode == 1 and "'happy-' is ambiguous" in several.stderr
    assert "runs start with it: happy-" in several.stderr
    assert len(several.stderr.strip().splitlines()) == 1
    empty = loopledger("show", "", home=home)
    assert empty.returncode == 1 and "start with it" not in empty.stderr


def test_show_prints_the_diagnosis_and_the_wait_whole(recorded) -> None:
    home, lines = recorded
    looped = next(line["run_id"] for line in lines if line["task_id"] == "loop-repeated-call")
    shown = loopledger("show", looped, home=home).stdout
    (diagnosis,) = [x for x in shown.splitlines() if x.startswith("loop diagnosis")]
    evidence = json.loads(diagnosis.split(" repeated_call ", 1)[1])
    assert evidence["count"] == 3 and len(evidence["call"]) > 60
    waiting = next(line for line in lines if line["task_id"] == "ask-user-bad-answer")
    shown = loopledger("show", waiting["run_id"], home=home).stdout
    (wait,) = [x for x in shown.splitlines() if x.startswith("waiting for user")]
    assert waiting["waiting"]["expires_at"] in wait and '"pattern":"^ORD-[0-9]{4}$"' in wait


def test_show_json_is_the_whole_run_as_the_journal_holds_it(recorded) -> None:
    home, lines = recorded
    line = next(line for line in lines if line["task_id"] == "loop-repeated-call")
    proc = loopledger("show", line["run_id"], "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["run_id"], shown["status"], shown["reason"]) == (line["run_id"], line["status"], line["reason"])
    assert [e["seq"] for e in shown["events"]] == list(range(1, len(shown["events"]) + 1))
    assert shown["events"][-1]["to_state"] == line["status"]
    # Decoded, not clipped: the diagnosis's evidence and every decision whole.
    (diagnosis,) = shown["loop_diagnoses"]
    assert diagnosis["pattern"] == "repeated_call" and diagnosis["evidence"]["count"] == 3
    assert {d["candidate_id"] for d in shown["decisions"]} <= {c["candidate_id"] for c in shown["candidates"]}
    assert all(isinstance(c["items"], list) for c in shown["candidates"])
    assert {op["tool"] for op in shown["operations"]} and all("canonical_args" in op for op in shown["operations"])
    missing = loopledger("show", "no-such-run", "--json", home=home)
    assert missing.returncode == 1 and missing.stdout == ""


def test_a_timeout_after_commit_is_reconciled_not_resent(recorded) -> None:
    home, lines = recorded
    import sqlite3

    run_ids = [line["run_id"] for line in lines if line["task_id"] == "fault-timeout-after-commit"]
    journal = sqlite3.connect(home / "journal.sqlite")
    for run_id in run_ids:
        states = [row[0] for row in journal.execute(
            "SELECT to_state FROM events WHERE run_id = ? AND kind = 'transition' ORDER BY seq", (run_id,))]
        assert "RECONCILING" in states
        (dispatches,) = journal.execute(
            "SELECT dispatch_count FROM operations WHERE run_id = ? AND tool = 'payments.refund'", (run_id,)
        ).fetchone()
        assert dispatches == 1


def test_retries_reuse_the_context_and_never_merge_attempts(recorded) -> None:
    home, lines = recorded
    import sqlite3

    journal = sqlite3.connect(home / "journal.sqlite")
    run_id = next(line["run_id"] for line in lines
                  if line["task_id"] == "model-truncated-then-ok" and ".v1." in line["run_id"])
    rows = journal.execute(
        "SELECT step, attempt, finish_reason, context_artifact_id, items_json FROM candidates"
        " WHERE run_id = ? ORDER BY step, attempt", (run_id,)).fetchall()
    first, second = rows[0], rows[1]
    assert (first[0], first[1], first[2]) == (1, 1, "incomplete")
    assert (second[0], second[1], second[2]) == (1, 2, "tool_calls")
    assert first[3] == second[3], "a retry uses the same context artifact"
    assert "raw_arguments" in first[4] and "raw_arguments" not in second[4]
    ops = journal.execute("SELECT call_id, outcome, dispatch_count FROM operations WHERE run_id = ? AND step = 1"
                          " ORDER BY created_seq", (run_id,)).fetchall()
    # The half-received call is never sent: its one result says so.
    assert ops == [("call_1_1_1", "cancelled", 0), ("call_1_2_1", "success", 1)]


def test_every_run_and_candidate_records_its_prompt_version_and_hash(recorded) -> None:
    import hashlib
    import sqlite3

    home, _ = recorded
    journal = sqlite3.connect(home / "journal.sqlite")
    files = {v: hashlib.sha256((ROOT / "engine" / "prompts" / f"{v}.md").read_bytes()).hexdigest()
             for v in ("v1", "v2")}
    runs = journal.execute("SELECT prompt_version, prompt_hash FROM runs").fetchall()
    assert runs and all(h == files[v] for v, h in runs)
    candidates = journal.execute("SELECT prompt_version, prompt_hash FROM candidates").fetchall()
    assert candidates and all(h == files[v] for v, h in candidates)


def test_expected_decisions_are_exported_as_scenario_labels(recorded) -> None:
    """Every bundled expect.decisions entry becomes one ``scenario`` label row
    per run, on the candidate the run validated at that step and attempt."""
    import pyarrow.parquet as pq

    from loopledger.engine._scenario import load_scenarios

    home, lines = recorded
    expected = {s.id: s.expect.decisions for s in load_scenarios([SCENARIOS])}
    candidates = {(c["run_id"], c["step"], c["attempt"]): c["candidate_id"]
                  for c in pq.read_table(home / "traces" / "candidates").to_pylist()}
    labels = pq.read_table(home / "traces" / "labels").to_pylist()
    want = sorted((line["run_id"], d.step, d.attempt, d.validator, d.verdict)
                  for line in lines for d in expected[line["task_id"]])
    got = sorted((lb["run_id"], lb["step"], lb["attempt"], lb["validator"], lb["expected_verdict"]) for lb in labels)
    assert want and got == want
    assert {lb["source"] for lb in labels} == {"scenario"}
    assert all(lb["candidate_id"] == candidates[(lb["run_id"], lb["step"], lb["attempt"])] for lb in labels)


def test_background_operations_end_with_their_work(recorded) -> None:
    """The request's one result stays background_accepted; the operation's
    own status follows the work to its end."""
    import sqlite3

    home, _ = recorded
    rows = sqlite3.connect(home / "journal.sqlite").execute(
        "SELECT o.outcome, o.status FROM operations o JOIN runs r ON r.run_id = o.run_id "
        "WHERE o.tool = 'reports.export' AND r.task_id = 'background-export'").fetchall()
    assert rows and set(rows) == {("background_accepted", "succeeded")}


def test_the_prompt_version_comparison_shows_a_difference_of_one_step() -> None:
    """The demo's table counts exactly: three runs each, one step and a few
    tokens apart, must not print the same figures (a rounded mean did)."""
    from rich.console import Console

    from loopledger.engine._runner import RunOutcome
    from loopledger.engine._show import comparison_table

    def outcome(version: str, steps: int, tokens: int) -> RunOutcome:
        return RunOutcome(run_id=f"r.{version}.{steps}", task_id="t", prompt_version=version, status="SUCCEEDED",
                          reason="completed", steps=steps, tool_calls=1, model_attempts=steps, tokens=tokens,
                          cost_usd=0.001)

    outcomes = [outcome("v1", s, 100) for s in (2, 3, 3)] + [outcome("v2", s, 90) for s in (2, 2, 3)]
    console = Console(width=120, record=True)
    console.print(comparison_table(outcomes))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in console.export_text().splitlines() if line.startswith("│")}
    assert rows["steps"] == ["8", "7"] and rows["model attempts"] == ["8", "7"]
    assert rows["tokens"] == ["300", "270"] and rows["cost (USD)"] == ["0.0030", "0.0030"]
    assert rows["as expected"] == ["3/3", "3/3"]


def test_calls_never_sent_have_their_one_result_saying_why(recorded) -> None:
    """Each call of a candidate the suite did not accept, or of a response
    that was not trusted, is a request with one terminal result, nothing
    sent: the CONTRACT's taxonomy, with the code of what refused it."""
    home, lines = recorded
    import sqlite3

    journal = sqlite3.connect(home / "journal.sqlite")
    refused: dict[str, list[tuple]] = {}
    for line in lines:
        if ".v1." in line["run_id"]:
            refused[line["task_id"]] = journal.execute(
                "SELECT step, tool, outcome, status, dispatch_count, policy_decision, canonical_args_json"
                " FROM operations WHERE run_id = ? AND operation_id LIKE '%.call%' ORDER BY created_seq",
                (line["run_id"],)).fetchall()
    codes = {op_id.split(".")[-1]: json.loads(payload)["error_code"] for op_id, payload in journal.execute(
        "SELECT json_extract(payload_json, '$.operation_id'), payload_json FROM events WHERE kind = 'operation_result'"
        " AND run_id LIKE 'model-unknown-tool.v1.%'")}
    assert refused["model-unknown-tool"] == [
        (1, "orders.cancel_order", "unknown_or_disabled_tool", "failed", 0, "not_evaluated", '{"order_id":"ORD-1006"}')]
    assert codes["call1"] == "UNKNOWN_TOOL"
    assert [r[2] for r in refused["model-schema-violation"]] == ["validation_failed"]
    assert refused["model-unparseable-arguments"][0][2] == "validation_failed"
    # Its arguments as received, as an import keeps them: the text that did not parse.
    assert json.loads(refused["model-unparseable-arguments"][0][6]) == {"raw_arguments": '{"order_id": "ORD-'}
    assert [(r[2], r[5]) for r in refused["permission-forbidden-path"]] == [("permission_denied", "deny")]
    assert [r[2] for r in refused["model-stale-tool-version"]] == ["unknown_or_disabled_tool"]
    assert [r[2] for r in refused["repairs-exhausted"]] == ["validation_failed"] * 4
    assert [r[2] for r in refused["loop-repeated-call"]] == ["cancelled"]
    assert [r[2] for r in refused["model-truncated-exhausted"]] == ["cancelled"] * 3
    assert refused["happy-refund"] == []
    # None was ever sent, and the demo backend executed nothing for them.
    assert {r[4] for rows in refused.values() for r in rows} == {0}
