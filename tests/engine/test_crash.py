"""A child process committing in a loop is killed with SIGKILL, 50 times
(20 against the PostgreSQL store, whose server stays up: the client dies).

The same journal is reused across kills. Half of the kills land at a random
moment (5-60 ms after the child is ready), half right after a random commit
(``LOOPLEDGER_CRASH_AFTER_COMMITS``). After each one the journal must open,
pass ``PRAGMA integrity_check`` (SQLite) and show only whole commits: every commit
writes exactly three events, one artifact and one row in each of two fact
tables, so a partial commit would show up as a count or a row out of place.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from journal_kit import CRASH_EVENTS_PER_COMMIT as K
from journal_kit import open_store, raw_connection
from loopledger.engine import Commit, NewRun, State

KILLS = {"sqlite": 50, "postgresql": 20}
RUN = "crashy"
HERE = Path(__file__).parent
BASE_VERSION = 2  # after run creation and READY -> MODEL_RUNNING
BASE_SEQ = 2


def start_child(path: str | Path, crash_after: int | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("LOOPLEDGER_CRASH_AFTER_COMMITS", None)
    if crash_after is not None:
        env["LOOPLEDGER_CRASH_AFTER_COMMITS"] = str(crash_after)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from journal_kit import crash_loop; crash_loop(sys.argv[2], sys.argv[3])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(HERE), str(path), RUN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def committed(kind: str, path: str | Path) -> int:
    """Check the journal after a crash; return how many loop commits it holds."""
    if kind == "sqlite":
        raw = sqlite3.connect(path)
        try:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        finally:
            raw.close()

    store = open_store(kind, path)
    try:
        run = store.get_run(RUN)
        events = store.events(RUN)
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq has a gap"
        assert run.last_seq == events[-1].seq
        assert (len(events) - BASE_SEQ) % K == 0, f"{len(events)} events: a commit is partly visible"
        commits = (len(events) - BASE_SEQ) // K
        assert run.state_version == BASE_VERSION + commits
        assert run.state is State.MODEL_RUNNING

        numbers = list(range(BASE_VERSION + 1, run.state_version + 1))
        loop_events = events[BASE_SEQ:]
        for index, number in enumerate(numbers):
            group = loop_events[index * K:(index + 1) * K]
            assert [e.kind for e in group] == ["transition", "tick", "tick"]
            assert {e.state_version for e in group} == {number}
            assert [e.payload["commit"] for e in group] == [number] * K
            assert (group[0].step, group[0].attempt) == (number, 1)
        last_seq_of = {number: BASE_SEQ + (index + 1) * K for index, number in enumerate(numbers)}

        for table in ("loop_diagnoses", "candidates"):
            rows = store.facts(table, RUN)
            assert sorted(r["step"] for r in rows) == numbers, f"{table} rows do not match the commits"
            assert all(r["seq"] == last_seq_of[r["step"]] for r in rows)
    finally:
        store.close()

    raw = raw_connection(kind, path)
    try:
        bodies = [json.loads(b) for (b,) in raw.execute("SELECT body FROM artifacts WHERE kind = 'tool_result'")]
    finally:
        raw.close()
    assert sorted(b["commit"] for b in bodies) == numbers, "artifacts do not match the commits"
    return commits


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_only_whole_commits(store_kind: str, journal_at: str | Path) -> None:
    path = journal_at
    setup = open_store(store_kind, path)
    setup.create_run(NewRun(run_id=RUN, task_id="t", tenant="acme"))
    setup.commit(Commit(run_id=RUN, expected_version=1, to_state=State.MODEL_RUNNING))
    setup.close()

    rng = random.Random(20261129)
    before = committed(store_kind, path)
    timed_kills = counted_kills = 0
    kills = KILLS[store_kind]
    for kill in range(kills):
        crash_after = rng.randint(1, 25) if kill % 2 else None
        child = start_child(path, crash_after)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.stderr.read() if child.stderr else ""
        if crash_after is None:
            time.sleep(rng.uniform(0.005, 0.060))
            child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, stderr

        after = committed(store_kind, path)
        if crash_after is None:
            assert after >= before, "a durable commit was lost"
            timed_kills += 1
        else:
            # Killed right after its N-th commit: exactly N commits were made durable.
            assert after == before + crash_after
            counted_kills += 1
        before = after

    assert (timed_kills, counted_kills) == (kills // 2, kills // 2)
