"""The test kit's PostgreSQL servers: one left behind by a killed test run
is stopped and removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import postgres_kit

LEAVE_A_SERVER_BEHIND = """
import os, sys
sys.path.insert(0, sys.argv[1])
import postgres_kit
server = postgres_kit.LocalServer(postgres_kit.find_bin_dir()).start()
print(server.root, flush=True)
os._exit(0)  # as a killed run: no teardown
"""


def _postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().split()[0])


def test_a_server_whose_test_run_is_gone_is_stopped_and_removed() -> None:
    bin_dir = postgres_kit.find_bin_dir()
    if bin_dir is None:
        if os.environ.get("LOOPLEDGER_REQUIRE_POSTGRES"):
            pytest.fail("no PostgreSQL server binaries")
        pytest.skip("no PostgreSQL server binaries")
    done = subprocess.run([sys.executable, "-c", LEAVE_A_SERVER_BEHIND, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip())
    postmaster = _postmaster_pid(root / "data")
    assert postgres_kit._alive(postmaster)  # the orphan is running

    swept = postgres_kit.sweep_orphans(bin_dir)

    assert root in swept
    assert not root.exists()
    assert not postgres_kit._alive(postmaster)
