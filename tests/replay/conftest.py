"""Traces of the bundled scenarios, recorded once per test session.

``recorded_home`` is shared and must not be written to; a test that adds
labels or breaks files works on ``home_copy`` (its own copy of the traces).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from replay_kit import REPO, cli


@pytest.fixture(scope="session")
def recorded_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("recorded")
    result = cli("run", str(REPO / "datasets" / "scenarios"), "--home", str(home), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (home / "traces" / "candidates").is_dir()
    return home


@pytest.fixture
def home_copy(recorded_home: Path, tmp_path: Path) -> Path:
    """A private copy of the recorded home (journal and traces), without earlier replays."""
    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("replays"))
    return home


@pytest.fixture
def suite_file(tmp_path: Path):
    """Write the default suite with some members' params replaced; return its path."""

    def write(**params: dict) -> Path:
        import yaml

        members = yaml.safe_load((REPO / "datasets" / "suites" / "default.yaml").read_text())["validators"]
        out = []
        for m in members:
            name = m if isinstance(m, str) else next(iter(m))  # pinned: name@version
            bare = name.split("@")[0]
            out.append({name: params[bare]} if bare in params else m)
        path = tmp_path / "suite.yaml"
        path.write_text(yaml.safe_dump({"name": "changed", "validators": out}))
        return path

    return write
