"""A replay reads one consistent set of trace files while exports go on:
it holds the traces folder's export lock shared while it lists and
partitions them, so an export (which holds it exclusively while it
publishes its segments one table at a time) is never seen half-way."""

from __future__ import annotations

import fcntl
import os
import re
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
    assert re.search(r"│ runs +│ +2 │", out), out
    (replay_dir,) = [p for p in (home / "replays").iterdir() if not p.name.startswith(".")]
    summary = pq.read_table(replay_dir / "summary").to_pylist()[0]
    assert (summary["runs"], summary["flips"], summary["run_errors"]) == (2, 0, 0)


def test_the_read_lock_is_shared_and_keeps_exports_out(tmp_path: Path) -> None:
    from loopledger.engine._recorder import ReadLock

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


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_workers_of_a_killed_replay_end_with_it(recorded_home: Path, tmp_path: Path) -> None:
    """Killed outright, a replay cannot shut its pool down: each worker
    watches its parent and ends when it is gone, instead of waiting on the
    pool's queue for ever."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    replay = subprocess.Popen([LOOPLEDGER, "replay", "--suite", "default", "--traces", str(recorded_home / "traces"),
                               "--home", str(tmp_path / "out"), "--workers", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while not workers and time.monotonic() < deadline and replay.poll() is None:
        workers = {pid for pid in _children(replay.pid)
                   if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()}
        time.sleep(0.05)
    assert workers, "the replay started no worker process"
    replay.send_signal(signal.SIGKILL)
    replay.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if _alive(pid)]


def test_folders_left_by_killed_replays_are_swept(recorded_home: Path, tmp_path: Path) -> None:
    """An interrupted replay's ``<id>.partial`` and work folder: removed by
    the next replay once nobody holds their lock (its id is free again);
    those of a replay under way (locked) and brand-new ones stay."""
    from loopledger.replay import replay

    replays = tmp_path / "replays"
    killed, work, busy, young = (replays / "killed.partial", replays / ".replay-work-dead",
                                 replays / "busy.partial", replays / "young.partial")
    for folder in (killed, work, busy, young):
        folder.mkdir(parents=True)
        (folder / "part-00000.parquet").write_bytes(b"half written")
    old = time.time() - 3600
    for folder in (killed, work, busy):
        os.utime(folder, (old, old))
    fd = os.open(busy, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the replay writing it holds it
        result = replay(recorded_home / "traces", "default", write_to=replays, replay_id="killed")
    finally:
        os.close(fd)
    assert result.path == replays / "killed" and result.summary.flips == 0
    assert not killed.exists() and not work.exists()
    assert busy.is_dir() and young.is_dir()
    assert sorted(p.name for p in replays.iterdir()) == ["busy.partial", "killed", "young.partial"]


def test_a_sweeper_never_removes_a_folder_made_anew_where_it_looked(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweepers open the same abandoned folder; the first removes it and
    its owner makes a new one at that path. The second's lock on the old
    (removed) folder must not let it remove the new one."""
    from loopledger._procs import remove_if_abandoned

    folder = tmp_path / "r1.partial"
    folder.mkdir()
    stale = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # the second sweeper's view of the old folder
    try:
        assert remove_if_abandoned(folder, folder)
        folder.mkdir()  # a new replay with that id, before it locks it
        original_open = os.open

        def old_inode(path, flags, *args):  # the second sweeper opened before the removal
            return os.dup(stale) if Path(path) == folder else original_open(path, flags, *args)

        monkeypatch.setattr(os, "open", old_inode)
        assert not remove_if_abandoned(folder, folder)
        monkeypatch.undo()
        assert folder.is_dir()
    finally:
        os.close(stale)
