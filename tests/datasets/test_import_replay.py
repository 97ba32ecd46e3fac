"""Imported runs replay like recorded ones."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from import_kit import cli, table


def _telecom(tau2_files: list[Path]) -> Path:
    return next(p for p in tau2_files if "_telecom_" in p.name)


def test_replay_over_imported_traces(external: Path, tau2_files: list[Path], tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert cli("import", "tau2", str(_telecom(tau2_files)), "--home", str(home)).returncode == 0
    assert cli("import", "toolbench", str(external / "toolbench-examples" / "answer"), "--home", str(home)).returncode == 0
    result = cli("replay", "--suite", "default", "--home", str(home))
    assert result.returncode in (0, 1), result.stderr[-2000:]
    replays = [p for p in (home / "replays").iterdir() if (p / "summary").is_dir()]
    assert len(replays) == 1
    row = pq.read_table(replays[0] / "summary").to_pylist()[0]
    assert row["runs"] == len(table(home, "runs")) and row["run_errors"] == 0
    assert row["candidates"] == len(table(home, "candidates"))


def test_decisions_recorded_at_import_are_what_the_replay_computes(tau2_files: list[Path], tmp_path: Path) -> None:
    """--decide records the suite's decisions at import on the same decision
    input a replay rebuilds: replaying that suite changes none of them."""
    home = tmp_path / "home"
    assert cli("import", "tau2", str(_telecom(tau2_files)), "--home", str(home), "--decide", "default").returncode == 0
    validations = table(home, "validations")
    assert len({v["candidate_id"] for v in validations}) == len({c["candidate_id"] for c in table(home, "candidates")})
    result = cli("replay", "--suite", "default", "--home", str(home), "--fail-on", "flips")
    assert result.returncode == 0, result.stdout[-3000:]
