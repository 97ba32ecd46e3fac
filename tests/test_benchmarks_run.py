"""Every benchmark runs (``--quick``) and prints its result line in the
CONTRACT's format. Not a timed test: the figures are not judged here, only
that each benchmark still works against the current code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"name", "value", "unit", "baseline", "ratio", "goal", "n"}


def _external_data() -> bool:
    """import_real reads the public traces kept beside the repository."""
    if os.environ.get("LOOPLEDGER_EXTERNAL_DATA"):
        return True
    return any((folder / "shared" / "datasets" / "external").is_dir() for folder in (ROOT, *ROOT.parents))


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} in a result line is not JSON")


def test_every_benchmark_runs_and_reports() -> None:
    names = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", *names],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Strict JSON: Python's json reads NaN and Infinity, which are not JSON.
    lines = [json.loads(line, parse_constant=_not_json) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["name"] for line in lines) == names
    for line in lines:
        assert KEYS <= line.keys(), line
        if line["name"] == "import_real" and not _external_data():
            # Nothing to measure without the public traces: said, not failed.
            assert line["value"] is None and "LOOPLEDGER_EXTERNAL_DATA" in line["missing"], line
            assert line["met"] is False
            continue
        assert line["value"] > 0, line
        # peer_cycle's baseline is the best peer; without the `bench` extra
        # installed there is none, and the line says which are missing.
        assert (line["baseline"] or 0) > 0 or line.get("missing"), line
        if line["baseline"] is None:
            assert line["ratio"] is None and line["met"] is False, line
