"""A replay never calls a model nor opens a connection."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loopledger.replay import replay


def test_a_replay_runs_with_sockets_blocked(recorded_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    result = replay(recorded_home / "traces", "strict", write_to=tmp_path / "replays", workers=1)
    assert result.summary.candidates > 0 and result.path is not None


def test_the_replay_package_never_imports_a_model_adapter(recorded_home: Path) -> None:
    code = (
        "import json, sys\n"
        "from loopledger.replay import replay\n"
        f"replay({str(recorded_home / 'traces')!r}, 'default', workers=1)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in ('loopledger.engine._model',"
        " 'loopledger.engine._controller', 'openai', 'anthropic', 'httpx', 'requests'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
