"""The runtime enforces the contract's scope whatever the suite judges: a
suite without ``permission`` does not open the contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
from invariants import all_violations

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.run([*CLI, "run", str(tmp_path / "s.yaml"), "--check", "--json", "--home", str(home)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # --check: no refund executed
    assert json.loads(proc.stdout)["check"] == "ok"
    ops = duckdb.sql(
        f"SELECT tool, policy_decision, outcome, dispatch_count FROM read_parquet('{home}/traces/operations/*.parquet') "
        "ORDER BY operation_id").fetchall()
    assert ops == [
        ("payments.refund", "deny", "permission_denied", 0),  # the runtime's refusal, never sent
        ("orders.get_order", "allow", "cancelled", 0),  # after a failed call, the rest is not sent
        ("workspace.read_file", "allow", "permission_denied", 1),  # the backend refuses the forbidden path
    ]
    assert all_violations(home) == []
