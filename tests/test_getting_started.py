"""docs/getting-started.md, done as a reader does it: its files written,
its commands run in order in an empty folder, each ending as the page says
(``# exit N`` after a command; 0 otherwise)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "getting-started.md"


def _files(text: str) -> dict[str, str]:
    """The page's files: a block right after a line naming it (`path`:)."""
    return dict(re.findall(r"^`([^`\s]+)`:\n\n```\w+\n(.*?)```", text, flags=re.M | re.S))


def _commands(text: str) -> list[tuple[str, int]]:
    """Each line of the page's ``sh`` blocks, with the exit code it should end with."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)```", text, flags=re.M | re.S):
        for line in block.splitlines():
            said = re.search(r"\s+# exit (\d+)$", line)
            commands.append((line[: said.start()] if said else line, int(said.group(1)) if said else 0))
    return commands


def test_the_getting_started_page_works_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    files, commands = _files(text), _commands(text)
    assert set(files) == {"scenarios/first-refund.yaml", "scenarios/premature-answer.yaml",
                          "ci/acme_checks.py", "ci/acme.yaml"}
    assert len(commands) >= 8
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_") and k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for command, expected in commands:
        out = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == expected, (command, out.stdout[-3000:], out.stderr[-3000:])
        assert "Traceback" not in out.stderr, command
    # What the page says the steps show: the recording suite flips nothing,
    # the acme suite flips the two refunds of 25.00.
    import pyarrow.parquet as pq

    summaries = [pq.read_table(p / "summary").to_pylist()[0] for p in (tmp_path / "loopledger-data" / "replays").iterdir()]
    assert sorted((s["suite_name"], s["flips"]) for s in summaries) == [("acme", 0), ("acme", 2), ("acme", 2),
                                                                        ("default", 0)]
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Regressions (1)" in report and "acme.refund_limit" in report
    suite = ET.parse(tmp_path / "report.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) == 2
