"""Helpers the replay tests share (a module of its own: test modules import
it by a name no other test folder uses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOOPLEDGER = str(Path(sys.executable).with_name("loopledger"))


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``loopledger ARGS`` with none of the caller's LOOPLEDGER_ settings; ``env``: more settings;
    ``cwd``: the working folder."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}, **(env or {})}
    return subprocess.run([LOOPLEDGER, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)
