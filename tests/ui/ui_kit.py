"""Helpers of the UI tests: recording the bundled scenarios, writing a
replay's tables by hand, and independent answers computed with DuckDB over
the raw files (never through loopledger.ui)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

LOOPLEDGER = str(Path(sys.executable).with_name("loopledger"))
REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "datasets" / "scenarios"
SYNTHETIC_REPLAY = "synthetic-flip"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    return subprocess.run([LOOPLEDGER, *args], capture_output=True, text=True, env=env, timeout=timeout)


def record(home: Path) -> None:
    """The bundled scenarios under prompt versions v1 and v2."""
    for version in ("v1", "v2"):
        done = cli("run", str(SCENARIOS), "--home", str(home), "--prompt-version", version, "--json")
        assert done.returncode in (0, 1), done.stderr


def table(home: Path, name: str) -> str:
    """A DuckDB source for one recorded trace table."""
    return f"read_parquet('{home}/traces/{name}/**/*.parquet', union_by_name = true)"


def scalar(sql: str) -> Any:
    return duckdb.sql(sql).fetchone()[0]


def write_synthetic_replay(home: Path, replay_id: str = SYNTHETIC_REPLAY) -> dict[str, Any]:
    """A replay written by hand with the CONTRACT columns: the recorded
    decisions, with every ``completion_gate`` accept of a ``v2`` run turned
    into a reject (code ``synthetic``). Returns what it changed."""
    decisions = duckdb.sql(
        f"""SELECT run_id, step, attempt, candidate_id, validator, validator_version, suite_version,
                   CASE WHEN validator = 'completion_gate' AND verdict = 'accept' AND run_id LIKE '%.v2.%'
                        THEN 'reject' ELSE verdict END AS verdict,
                   CASE WHEN validator = 'completion_gate' AND verdict = 'accept' AND run_id LIKE '%.v2.%'
                        THEN 'synthetic' ELSE code END AS code,
                   message, evidence_json
            FROM {table(home, 'validations')}"""
    ).arrow()
    if hasattr(decisions, "read_all"):
        decisions = decisions.read_all()
    diffs = duckdb.sql(
        f"""SELECT run_id, step, attempt, candidate_id, validator, verdict AS baseline_verdict,
                   'reject' AS replay_verdict, code AS baseline_code, 'synthetic' AS replay_code, 'change' AS kind,
                   validator_version AS baseline_validator_version, validator_version AS replay_validator_version,
                   false AS across_versions
            FROM {table(home, 'validations')}
            WHERE validator = 'completion_gate' AND verdict = 'accept' AND run_id LIKE '%.v2.%'"""
    ).arrow()
    if hasattr(diffs, "read_all"):
        diffs = diffs.read_all()
    flips = diffs.num_rows
    runs = len(set(diffs.column("run_id").to_pylist()))
    summary = pa.table({
        "replay_id": [replay_id], "suite_name": ["synthetic"], "suite_version": ["s-synthetic"], "baseline": ["recorded"],
        "candidates": [len(set(decisions.column("candidate_id").to_pylist()))],
        "decisions": [decisions.num_rows], "flips": [flips], "regressions": [0], "runs_diverged": [runs],
        "seconds": [0.01],
    })
    root = home / "replays" / replay_id
    for name, data in (("decisions", decisions), ("diffs", diffs), ("summary", summary)):
        (root / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(data, root / name / "part-0.parquet")
    return {"flips": flips, "runs": runs, "decisions": decisions.num_rows}
