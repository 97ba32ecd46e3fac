"""Runs driven in several worker processes (``--workers``, engine/_workers.py).

Every bundled scenario ends as it expects when two processes drive them,
and the CONTRACT's hard rules hold on the journal they shared; a wait begun
in a worker shows its resume token to the caller, and that token is
accepted; a worker killed half-way is an infrastructure failure (exit 3)
whose runs ``resume`` finishes without a side effect done twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from invariants import all_violations

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "datasets" / "scenarios"
CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]


def cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    merged.update(env or {})
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=300,
                          env=merged)


def test_bundled_scenarios_on_two_workers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = cli("run", str(SCENARIOS), "--workers", "2", "--concurrency", "8", "--check", "--json", home=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(lines) == len(list(SCENARIOS.glob("*.yaml")))
    assert [line for line in lines if line["check"] != "ok"] == []
    assert all_violations(home) == []


def test_a_token_shown_by_a_worker_is_accepted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    waits = [SCENARIOS / "approval-waits-for-person.yaml", SCENARIOS / "happy-refund.yaml"]
    proc = cli("run", *map(str, waits), "--workers", "2", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    lines = {line["task_id"]: line for line in map(json.loads, proc.stdout.splitlines())}
    waiting = lines["approval-waits-for-person"]
    assert waiting["status"] == "WAITING_USER"
    assert waiting["waiting"]["resume_token"]
    assert lines["happy-refund"]["status"] == "SUCCEEDED"
    replied = cli("reply", waiting["run_id"], "--token", waiting["waiting"]["resume_token"], "--approve", "--json",
                  home=home)
    assert replied.returncode == 0, replied.stderr
    assert json.loads(replied.stdout)["status"] == "SUCCEEDED"
    assert all_violations(home) == []


def test_a_worker_killed_half_way_leaves_resumable_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    side_effects = [SCENARIOS / name for name in ("happy-refund.yaml", "fault-timeout-after-commit.yaml",
                                                  "happy-write-file.yaml", "happy-update-address.yaml")]
    # Each worker dies right after its 6th journal commit: runs are created
    # by the caller, so every worker is killed in the middle of its share.
    proc = cli("run", *map(str, side_effects), "--workers", "2", "--json", home=home,
               env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "6"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "died (exit code -9)" in proc.stderr
    assert "Traceback" not in proc.stderr
    resumed = cli("resume", "--workers", "2", "--json", home=home)
    assert resumed.returncode == 0, resumed.stderr
    statuses = {json.loads(line)["status"] for line in resumed.stdout.splitlines()}
    # A crash on a send whose outcome the backend cannot tell may leave a
    # run asking a person (test_crash_sweep.py); nothing else is in flight.
    assert statuses and statuses <= {"SUCCEEDED", "WAITING_USER"}, resumed.stdout
    assert all_violations(home) == []
