"""A data directory recorded once per session: the bundled scenarios under
v1 and v2, a real replay with the strict suite, and a replay written by hand."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ui_kit import cli, record, write_synthetic_replay


@pytest.fixture(scope="session")
def recorded_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("ui") / "home"
    record(home)
    done = cli("replay", "--suite", "strict", "--home", str(home), "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    write_synthetic_replay(home)
    return home


@pytest.fixture
def writable_home(recorded_home: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy for tests that write labels, so the shared one stays as recorded."""
    copy = tmp_path / "home"
    shutil.copytree(recorded_home, copy)
    yield copy


@pytest.fixture
def ui_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The app reads its data directory from LOOPLEDGER_HOME; clear Streamlit's cache between tests."""
    import streamlit as st

    st.cache_data.clear()
    return monkeypatch
