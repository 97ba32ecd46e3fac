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
    RunRecord,
    SQLiteRunStore,
    State,
)

#: Journal backends the conformance suite runs against. A PostgreSQL store
#: adds its name here and a branch to ``open_store`` / ``raw_connection``.
STORE_KINDS = ["sqlite"]


def open_store(kind: str, where: Path) -> Any:
    if kind == "sqlite":
        return SQLiteRunStore(where / "journal.sqlite")
    raise ValueError(f"unknown store kind {kind!r}")


def raw_connection(kind: str, where: Path) -> Any:
    """A connection that bypasses the store, to look at or tamper with rows."""
    if kind == "sqlite":
        return sqlite3.connect(where / "journal.sqlite", isolation_level=None)
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
