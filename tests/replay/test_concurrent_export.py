"""A replay reads one consistent set of trace files while exports go on:
it holds the traces folder's export lock shared while it lists and
partitions them, so an export (which holds it exclusively while it
publishes its segments one table at a time) is never seen half-way."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replay_kit import LOOPLEDGER, REPO, cli

SCENARIOS = REPO / "datasets" / "scenarios"


def test_a_replay_waits_for_an_export_that_is_publishing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for name in ("happy-refund.yaml", "loop-repeated-call.yaml"):
        assert cli("run", str(SCENARIOS / name), "--home", str(home)).returncode == 0
    traces = home / "traces"
    # The second export's events segment, not yet in place: what a replay
    # would see while that export publishes (its validations are there, the
    # events that bring those candidates to VALIDATING are not).
    last = sorted((traces / "events").glob("seg-*.parquet"))[-1]
    assert (traces / "validations" / last.name).exists()
    hidden = last.with_name(".publishing")
    with open(traces / ".export.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # as Recorder.export holds it
        os.rename(last, hidden)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
        replay = subprocess.Popen([LOOPLEDGER, "replay", "--suite", "default", "--home", str(home)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            time.sleep(3)
            assert replay.poll() is None, replay.communicate()  # waiting for the export
            os.rename(hidden, last)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        out, err = replay.communicate(timeout=120)
    assert replay.returncode == 0, err
    assert "│ runs                                              │                            2 │" in out, out
    (replay_dir,) = [p for p in (home / "replays").iterdir() if not p.name.startswith(".")]
    summary = pq.read_table(replay_dir / "summary").to_pylist()[0]
    assert (summary["runs"], summary["flips"], summary["run_errors"]) == (2, 0, 0)


def test_the_read_lock_is_shared_and_keeps_exports_out(tmp_path: Path) -> None:
    from loopledger.replay._traces import ReadLock

    first, second = ReadLock(tmp_path), ReadLock(tmp_path)  # replays read side by side
    with open(tmp_path / ".export.lock", "a+b") as exporter:
        with pytest.raises(BlockingIOError):  # an export waits while replays read
            fcntl.flock(exporter.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.release()
        second.release()
        second.release()  # idempotent
        fcntl.flock(exporter.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once they are done
    # A folder where no lock file can be made (missing, or a read-only copy) is read without one.
    ReadLock(tmp_path / "missing").release()
    assert not (tmp_path / "missing").exists()
