"""Helpers of the importer tests: where the external traces are, reading
raw files and trace tables, running the command line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LOOPLEDGER = str(Path(sys.executable).with_name("loopledger"))


def find_external() -> Path | None:
    named = os.environ.get("LOOPLEDGER_EXTERNAL_DATA")
    if named:
        return Path(named)
    for folder in (REPO, *REPO.parents):
        candidate = folder / "shared" / "datasets" / "external"
        if candidate.is_dir():
            return candidate
    return None


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPLEDGER_HOME"}
    return subprocess.run([LOOPLEDGER, *args], capture_output=True, text=True, env=env, timeout=300)


def load(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def table(home: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    files = sorted((home / "traces" / name).glob("*.parquet"))
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows
