"""The Python API example of docs/replay.md runs as a user would paste it:
a script of its own, in a folder holding ``loopledger-data``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from replay_kit import REPO


def test_the_documented_api_example_runs_as_written(home_copy: Path, tmp_path: Path) -> None:
    text = (REPO / "docs" / "replay.md").read_text(encoding="utf-8")
    api = text[text.index("## Python API"):]
    (example,) = re.findall(r"```python\n(.*?)```", api, flags=re.S)[:1]
    assert "replay_many" in example and "__main__" in example
    folder = tmp_path / "work"
    folder.mkdir()
    home_copy.rename(folder / "loopledger-data")
    # Printed, so the run shows it reached the end with results in hand.
    script = example + "    print(result.summary.flips, sorted(both), run.run_id == run_id)\n"
    (folder / "example.py").write_text(script, encoding="utf-8")
    out = subprocess.run([sys.executable, "example.py"], cwd=folder, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    flips, suites = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert suites == "['default', 'strict'] True", out.stdout
    assert int(flips) > 0  # the strict suite objects where the recording one did not
    assert len([p for p in (folder / "loopledger-data" / "replays").iterdir()]) == 1  # written where it says
