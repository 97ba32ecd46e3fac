"""The runtime enforces the contract's scope whatever the suite judges: a
suite without ``permission`` does not open the contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
from invariants import all_violations

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

def run_checked(scenario: Path, home: Path) -> dict[str, Any]:
    """``loopledger run SCENARIO --check --json`` on ``home``, which must end
    as the scenario expects (exit 0); its one JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.run([*CLI, "run", str(scenario), "--check", "--json", "--home", str(home)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


NO_PERMISSION_SUITE = """\
name: no-permission
validators: [structure, tool_exists, completion_gate]
"""

OUT_OF_SCOPE = """\
id: out-of-scope
suite: suite.yaml
contract:
  goal: Look up ORD-1003
  allowed_tools: [orders.get_order, workspace.read_file]
  forbidden_paths: ["payments/**"]
model:
  - tool_calls:
      - {name: payments.refund, arguments: {order_id: ORD-1003, amount: 25.0}}
      - {name: orders.get_order, arguments: {order_id: ORD-1003}}
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/../payments/config.json}}]
  - final: Nothing was refunded.
expect: {status: SUCCEEDED, reason: completed, side_effects: {payments.refund: 0}}
"""


def test_a_tool_outside_the_contract_is_never_sent_whatever_the_suite(tmp_path: Path) -> None:
    (tmp_path / "suite.yaml").write_text(NO_PERMISSION_SUITE)
    (tmp_path / "s.yaml").write_text(OUT_OF_SCOPE)
    home = tmp_path / "home"
    assert run_checked(tmp_path / "s.yaml", home)["check"] == "ok"  # --check: no refund executed
    ops = duckdb.sql(
        f"SELECT tool, policy_decision, outcome, dispatch_count FROM read_parquet('{home}/traces/operations/*.parquet') "
        "ORDER BY operation_id").fetchall()
    assert ops == [
        ("payments.refund", "deny", "permission_denied", 0),  # the runtime's refusal, never sent
        ("orders.get_order", "allow", "cancelled", 0),  # after a failed call, the rest is not sent
        ("workspace.read_file", "allow", "permission_denied", 1),  # the backend refuses the forbidden path
    ]
    assert all_violations(home) == []


LAX_SUITE = """\
name: lax
validators: [tool_exists, completion_gate]
"""

UNPARSED = """\
id: lax-{name}
suite: suite.yaml
contract:
  goal: Look up ORD-1003
  allowed_tools: [orders.get_order]
model:
  - {finish}tool_calls: {calls}
  - final: ORD-1003 is paid.
expect: {expect}
"""


def _run(tmp_path: Path, name: str, calls: str, suite: str, *, expect: str = "{status: SUCCEEDED}",
         finish: str | None = None) -> tuple[Path, list[tuple]]:
    """Run one scenario whose first response holds ``calls`` (with its
    ``finish`` reason, if given) under ``suite``, checked against ``expect``;
    its home and (step, call_id, outcome, dispatch_count) of its operations."""
    (tmp_path / "suite.yaml").write_text(suite)
    first = f"finish_reason: {finish}\n    " if finish else ""
    (tmp_path / f"{name}.yaml").write_text(UNPARSED.format(name=name, calls=calls, expect=expect, finish=first))
    home = tmp_path / name
    run_checked(tmp_path / f"{name}.yaml", home)
    ops = duckdb.sql(
        f"SELECT step, call_id, outcome, dispatch_count FROM read_parquet('{home}/traces/operations/*.parquet') "
        "ORDER BY step, call_id").fetchall()
    return home, ops


def test_calls_whose_arguments_did_not_parse_are_never_sent_whatever_the_suite(tmp_path: Path) -> None:
    """A suite without `structure` accepts them: they had no operation, and a
    candidate of such calls alone ended the run as a final answer."""
    good = "{name: orders.get_order, arguments: {order_id: ORD-1003}}"
    bad = "{name: orders.get_order, raw_arguments: '{\"order_id\": \"ORD-'}"
    home, ops = _run(tmp_path, "mixed", f"[{good}, {bad}]", LAX_SUITE)
    assert ops == [(1, "call_1_1_1", "success", 1), (1, "call_1_1_2", "validation_failed", 0)]
    assert all_violations(home) == []
    home, ops = _run(tmp_path, "only", f"[{bad}]", LAX_SUITE)
    # Nothing to send: the model is told (a repair) and answers at step 2.
    assert ops == [(1, "call_1_1_1", "validation_failed", 0)]
    steps = duckdb.sql(f"SELECT max(steps) FROM read_parquet('{home}/traces/runs/*.parquet')").fetchone()[0]
    assert steps == 2 and all_violations(home) == []


def test_each_call_a_validator_names_gets_its_own_refusal(tmp_path: Path) -> None:
    """A validator's decision names its worst issue's call; the other calls
    it found wrong are in its other issues, and were recorded as cancelled
    ("nothing wrong with the call itself"). A question (approval) is no
    refusal of the call it names."""
    suite = "name: checks\nvalidators: [structure, tool_exists, tool_args_schema, permission, completion_gate]\n"
    two_bad = ("[{name: orders.get_order, arguments: {order_id: 1}}, "
               "{name: orders.get_order, arguments: {order_id: 2}}]")
    home, ops = _run(tmp_path, "twobad", two_bad, suite)
    assert [(o[2], o[3]) for o in ops if o[0] == 1] == [("validation_failed", 0), ("validation_failed", 0)]
    assert all_violations(home) == []


PROTOCOL_ERROR = "{status: FAILED, reason: protocol_error}"


def test_calls_that_share_an_id_are_a_protocol_error_whatever_the_suite(tmp_path: Path) -> None:
    """Two identical calls under one id, accepted by a suite without
    `structure`: their operations shared an idempotency key, the commit was
    refused (OperationConflict) and the run stayed stuck, exit 3 at every
    resume."""
    dup = ("[{id: c1, name: orders.get_order, arguments: {order_id: ORD-1003}}, "
           "{id: c1, name: orders.get_order, arguments: {order_id: ORD-1003}}]")
    home, ops = _run(tmp_path, "dup", dup, LAX_SUITE, expect=PROTOCOL_ERROR)
    assert ops == [(1, "c1", "cancelled", 0), (1, "c1", "cancelled", 0)]
    assert all_violations(home) == []


def test_a_final_stop_signal_with_tool_calls_is_a_protocol_error_whatever_the_suite(tmp_path: Path) -> None:
    """Under a suite without `structure`, a response that said `stop` and
    held a refund had the refund executed."""
    calls = "[{name: orders.get_order, arguments: {order_id: ORD-1003}}]"
    home, ops = _run(tmp_path, "stop", calls, LAX_SUITE, expect=PROTOCOL_ERROR, finish="stop")
    assert ops == [(1, "call_1_1_1", "cancelled", 0)]
    assert all_violations(home) == []


SLIPS_FIXED = """\
id: slips-fixed
description: three slips and a final answer given too early, never more than two in a row; the work gets done
contract:
  goal: Read the three source files, then say so
  required_evidence: ["file_read:src/__init__.py"]
  allowed_tools: [workspace.read_file]
model:
  - tool_calls: [{name: workspace.read_file, arguments: {file: src/orders.py}}]
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/orders.py}}]
  - tool_calls: [{name: workspace.read_fil, arguments: {path: src/refunds.py}}]
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/refunds.py}}]
  - final: All read.
  - tool_calls: [{name: workspace.read_file, arguments: {file: src/__init__.py}}]
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/__init__.py}}]
  - final: All three files were read.
    claims: [{text: read, evidence: ["file_read:src/__init__.py"]}]
expect: {status: SUCCEEDED, reason: completed}
"""

SLIPS_IN_A_ROW = SLIPS_FIXED.replace("id: slips-fixed", "id: slips-in-a-row").replace(
    "  - tool_calls: [{name: workspace.read_file, arguments: {path: src/orders.py}}]\n",
    "  - tool_calls: [{name: workspace.read_file, arguments: {file: src/orders.py}}]\n    repeat: 3\n").replace(
    "expect: {status: SUCCEEDED, reason: completed}", "expect: {status: FAILED, reason: validation_failed}")


def test_repairs_are_bounded_in_a_row_not_over_the_whole_run(tmp_path: Path) -> None:
    """Four repairs in a run, at most two in a row: the run goes on;
    four candidates in a row sent back end it FAILED / validation_failed."""
    for name, text in (("fixed", SLIPS_FIXED), ("row", SLIPS_IN_A_ROW)):
        (tmp_path / f"{name}.yaml").write_text(text)
        line = run_checked(tmp_path / f"{name}.yaml", tmp_path / name)
        assert line["check"] == "ok", line
        assert all_violations(tmp_path / name) == []


def test_a_success_with_work_still_running_ends_tool_failed_whatever_the_suite(tmp_path: Path) -> None:
    """FINALIZING's completion invariant holds without the completion gate:
    a final answer while the export still runs is no success."""
    (tmp_path / "suite.yaml").write_text(NO_GATE_SUITE)
    (tmp_path / "early.yaml").write_text(EARLY_ANSWER)
    home = tmp_path / "home"
    line = run_checked(tmp_path / "early.yaml", home)
    assert (line["status"], line["reason"]) == ("FAILED", "tool_failed")
    assert all_violations(home) == []


NO_GATE_SUITE = """\
name: no-gate
validators: [structure, tool_exists, tool_args_schema, permission]
"""

EARLY_ANSWER = """\
id: early-answer
suite: suite.yaml
contract:
  goal: Export the weekly report
  required_evidence: [report_ready]
  allowed_tools: [reports.export]
model:
  - tool_calls: [{name: reports.export, arguments: {query: weekly, delay_s: 2}}]
  - final: The weekly report is ready.
expect: {status: FAILED, reason: tool_failed}
"""
