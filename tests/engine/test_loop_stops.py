"""Loop stops in the live engine: each detector's finding is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
from invariants import all_violations

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

# NOT_FOUND and PERMISSION_DENIED (another tenant's order) alternate: the
# same error twice in a row never happens, but every third is the same,
# and no step makes progress.
TWO_DETECTORS_AT_ONE_STEP = """\
id: two-detectors-one-step
contract:
  goal: Update the address of ORD-1001
  required_evidence: [address_updated]
  allowed_tools: [orders.get_order]
model:
""" + "".join(f"  - tool_calls: [{{name: orders.get_order, arguments: {{order_id: {order}}}}}]\n"
              for order in ("ORD-9101", "ORD-2001", "ORD-9102", "ORD-2002", "ORD-9103", "ORD-2003"))


def test_every_detector_that_fires_at_the_stopping_step_is_a_diagnosis(tmp_path: Path) -> None:
    path, home = tmp_path / "s.yaml", tmp_path / "home"
    path.write_text(TWO_DETECTORS_AT_ONE_STEP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.run([*CLI, "run", str(path), "--json", "--home", str(home)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["status"] == "FAILED" and line["reason"] in ("loop_detected", "no_progress")
    stopping = duckdb.sql(
        f"SELECT DISTINCT validator FROM read_parquet('{home}/traces/validations/*.parquet') "
        "WHERE code IN ('loop_detected', 'no_progress') ORDER BY 1").fetchall()
    diagnosed = duckdb.sql(
        f"SELECT detector FROM read_parquet('{home}/traces/loop_diagnoses/*.parquet') ORDER BY 1").fetchall()
    assert len(stopping) == 2 and diagnosed == stopping
    shown = subprocess.run([*CLI, "show", line["run_id"], "--home", str(home)], capture_output=True, text=True,
                           timeout=60, env=env).stdout
    assert all(name in shown for (name,) in stopping)
    assert all_violations(home) == []
