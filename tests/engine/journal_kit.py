"""Helpers shared by the engine tests (importable from test modules and
from child processes, unlike conftest)."""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Mapping
from itertools import count
from pathlib import Path
from typing import Any

from loopledger.engine import (
    ALLOWED,
    INITIAL,
    Commit,
    NewRun,
    PostgresRunStore,
    RunRecord,
    SQLiteRunStore,
    State,
)

#: Journal backends the conformance suite runs against.
STORE_KINDS = ["sqlite", "postgresql"]


def open_store(kind: str, where: str | Path) -> Any:
    """The store at ``where``: a SQLite file's path, or a PostgreSQL URL."""
    if kind == "sqlite":
        return SQLiteRunStore(where)
    if kind == "postgresql":
        return PostgresRunStore(str(where))
    raise ValueError(f"unknown store kind {kind!r}")


def open_any(where: str) -> Any:
    """The store at ``where``, by its form (child processes get a string)."""
    return open_store("postgresql" if where.startswith("postgresql://") else "sqlite", where)


class _PostgresRaw:
    """A psycopg connection that takes the tests' ``?`` placeholders."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self._conn.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self._conn.close()


def raw_connection(kind: str, where: str | Path) -> Any:
    """A connection that bypasses the store, to look at or tamper with rows."""
    if kind == "sqlite":
        return sqlite3.connect(where, isolation_level=None)
    if kind == "postgresql":
        return _PostgresRaw(str(where))
    raise ValueError(f"unknown store kind {kind!r}")


def shortest_path(
    target: State, table: Mapping[State, frozenset[State]], start: State = INITIAL
) -> list[State]:
    """States visited after ``start`` on a shortest legal path to ``target``
    (empty when ``target`` is ``start``)."""
    previous: dict[State, State | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state == target:
            break
        for following in sorted(table[state], key=lambda s: s.value):
            if following not in previous:
                previous[following] = state
                queue.append(following)
    if target not in previous:
        raise AssertionError(f"{target} is unreachable from {start}")
    path: list[State] = []
    node: State | None = target
    while node is not None and node != start:
        path.append(node)
        node = previous[node]
    return path[::-1]


class Runs:
    """Creates runs and moves them through legal paths."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._ids = count(1)

    def new(self, run_id: str | None = None, **fields: Any) -> RunRecord:
        run_id = run_id or f"run-{next(self._ids):04d}"
        fields.setdefault("task_id", f"task-{run_id}")
        fields.setdefault("tenant", "acme")
        return self.store.create_run(NewRun(run_id=run_id, **fields))

    def move(self, run_id: str, to_state: State, **commit_fields: Any) -> Any:
        """Read the run, then commit one transition with its current version."""
        version = self.store.get_run(run_id).state_version
        return self.store.commit(
            Commit(run_id=run_id, expected_version=version, to_state=to_state, **commit_fields)
        )

    def drive_to(
        self, run_id: str, target: State, table: Mapping[State, frozenset[State]] = ALLOWED
    ) -> RunRecord:
        current = self.store.get_run(run_id).state
        for state in shortest_path(target, table, start=current):
            self.move(run_id, state)
        run = self.store.get_run(run_id)
        assert run.state == target
        return run


# -- child processes ------------------------------------------------------------
# Entry points for multiprocessing (spawn): they live here, in a plain module,
# so a child can import them by name.


def race_worker(
    path: str, run_id: str, worker: int, lockstep_rounds: int, free_attempts: int, barrier: Any, out: str
) -> None:
    """Commit MODEL_RUNNING -> MODEL_RUNNING to one run, read-then-commit with
    the version read, and write every outcome to ``out`` (JSON).

    Lock-step rounds: every worker reads, waits for the others, then commits,
    so exactly one commit per round can win. Then a free-running phase."""
    import json

    from loopledger.engine import NewEvent, StaleStateVersion

    store = open_any(path)
    outcomes: list[dict[str, Any]] = []

    def attempt(phase: str, index: int, version: int) -> None:
        commit = Commit(
            run_id=run_id,
            expected_version=version,
            to_state=State.MODEL_RUNNING,
            payload={"worker": worker, "phase": phase, "i": index},
            events=(NewEvent("tick", {"worker": worker, "i": index}),),
        )
        try:
            result = store.commit(commit)
        except StaleStateVersion as exc:
            outcomes.append({"phase": phase, "i": index, "won": False, "expected": exc.expected, "actual": exc.actual})
        else:
            outcomes.append({
                "phase": phase, "i": index, "won": True, "state_version": result.state_version,
                "first_seq": result.first_seq, "last_seq": result.last_seq,
            })

    try:
        for index in range(lockstep_rounds):
            barrier.wait()
            version = store.get_run(run_id).state_version
            barrier.wait()
            attempt("lockstep", index, version)
        barrier.wait()
        for index in range(free_attempts):
            attempt("free", index, store.get_run(run_id).state_version)
    finally:
        store.close()
    with open(out, "w") as handle:
        json.dump(outcomes, handle)


def migrate_worker(path: str, barrier: Any) -> None:
    """Open (and so migrate) a journal once every worker is ready."""
    barrier.wait()
    store = open_any(path)
    store.close()


#: Events each commit of ``crash_loop`` writes: its transition and two ticks.
CRASH_EVENTS_PER_COMMIT = 3


def crash_commit(run_id: str, version: int) -> Commit:
    """The commit ``crash_loop`` makes on a run at ``version``: it produces
    version ``number = version + 1`` and writes three events, a ~1 KB
    artifact and one row in each of two fact tables, all naming ``number``."""
    from loopledger.engine import Artifact, NewEvent

    number = version + 1
    return Commit(
        run_id=run_id,
        expected_version=version,
        to_state=State.MODEL_RUNNING,
        step=number,
        attempt=1,
        payload={"commit": number},
        events=(NewEvent("tick", {"commit": number, "n": 1}), NewEvent("tick", {"commit": number, "n": 2})),
        artifacts=(Artifact("tool_result", {"commit": number, "pad": "x" * 1000}),),
        facts={
            "loop_diagnoses": (
                {"step": number, "detector": "crash", "detector_version": "1", "pattern": "tick",
                 "evidence_json": {"commit": number}},
            ),
            "candidates": (
                {"step": number, "attempt": 1, "candidate_id": f"c{number}", "context_artifact_id": "ctx",
                 "finish_reason": "stop", "items_json": [], "prompt_version": "v1", "model_route": "scripted"},
            ),
        },
    )


def crash_loop(path: str, run_id: str, limit: int = 5000) -> None:
    """Commit ``crash_commit`` in a loop until killed (or ``limit`` commits)."""
    import sys

    store = open_any(path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for _ in range(limit):
        store.commit(crash_commit(run_id, store.get_run(run_id).state_version))
    store.close()
