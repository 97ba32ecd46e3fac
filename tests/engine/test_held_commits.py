"""Held commits: a move into a pure state (VALIDATING; READY after a step's
tools; READY after a repair) is written with the next commit, in one
transaction. What must still hold: nothing is called, sent or delivered
before everything it depends on is durable, as another connection to the
journal sees it at that very moment."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from invariants import all_violations
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenario
from loopledger.engine._states import State

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "datasets" / "scenarios"


class Journal:
    """A second connection: what is durable, seen from outside the engine."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False)

    def state(self, run_id: str) -> str:
        return self.conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]

    def count(self, sql: str, *params: Any) -> int:
        return int(self.conn.execute(sql, params).fetchone()[0])


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        yield runner
    finally:
        runner.close()


def count_commits(runner: Runner) -> list[tuple[str, ...]]:
    """The target states of every store commit from now on, a tuple per
    commit (several for a chain; "-" for a commit of events only)."""
    chains: list[tuple[str, ...]] = []
    store_commit = runner.store.commit

    def commit(*commits: Any) -> Any:
        chains.append(tuple(c.to_state.value if c.to_state else "-" for c in commits))
        return store_commit(*commits)

    runner.store.commit = commit  # type: ignore[method-assign]
    return chains


def spy(runner: Runner, journal: Journal, seen: list[tuple[str, Any]]) -> list[tuple[str, ...]]:
    """Record, at every model call and every tool execution, what the journal
    already holds; and the target states of every store commit."""
    chains = count_commits(runner)
    backend_execute = runner.backend.execute

    def execute(request: Any) -> Any:
        seen.append(("tool", {
            "state": journal.state(request.run_id),
            "dispatched": journal.count(
                "SELECT dispatch_count FROM operations WHERE operation_id = ?", request.operation_id),
            "validations": journal.count(
                "SELECT COUNT(*) FROM validations v JOIN operations o ON o.run_id = v.run_id AND o.step = v.step"
                " WHERE o.operation_id = ?", request.operation_id),
        }))
        return backend_execute(request)

    runner.backend.execute = execute  # type: ignore[method-assign]
    runner.controller.backend = runner.backend

    config_for = runner.controller.config_for

    def configured(record: Any) -> Any:
        config = config_for(record)
        model = config.model

        class Watched:
            def stream(self, request: Any) -> Any:
                seen.append(("model", {
                    "state": journal.state(request.run_id),
                    "step": request.step,
                    "context_stored": journal.count(
                        "SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = 'transition'"
                        " AND to_state = 'MODEL_RUNNING' AND step = ?", request.run_id, request.step),
                    "results": journal.count(
                        "SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = 'operation_result'", request.run_id),
                    "steps_closed": journal.count(
                        "SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = 'step_closed'", request.run_id),
                }))
                return model.stream(request)

        return dataclasses.replace(config, model=Watched())

    runner.controller.config_for = configured  # type: ignore[method-assign]
    return chains


def spied_run(runner: Runner, tmp_path: Path, name: str) -> tuple[list[tuple[str, ...]], list[tuple[str, Any]]]:
    """Drive one run of the bundled scenario ``name`` under :func:`spy`;
    its commits' target states, and what the journal held at each call."""
    seen: list[tuple[str, Any]] = []
    chains = spy(runner, Journal(tmp_path / "home" / "journal.sqlite"), seen)
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    run_id = runner.create(scenario, "v1")
    runner.drive_all([run_id])
    assert runner.outcome(run_id, scenario).ok
    return chains, seen


def test_a_refund_run_writes_each_pure_move_with_the_next_commit(runner: Runner, tmp_path: Path) -> None:
    chains, seen = spied_run(runner, tmp_path, "happy-refund")

    # Twelve transitions in seven commits: the model's candidate with its
    # validation and operations, a step's last result with the next context.
    assert chains == [
        ("MODEL_RUNNING",),
        ("VALIDATING", "TOOL_RUNNING"),
        ("READY", "MODEL_RUNNING"),
        ("VALIDATING", "TOOL_RUNNING"),
        ("READY", "MODEL_RUNNING"),
        ("VALIDATING", "FINALIZING"),
        ("SUCCEEDED",),
    ]
    # Each tool ran after its operation, marked as sent, and the validation
    # that allowed it were durable.
    tools = [s for kind, s in seen if kind == "tool"]
    assert [(t["state"], t["dispatched"]) for t in tools] == [("TOOL_RUNNING", 1)] * 2
    assert all(t["validations"] > 0 for t in tools)
    # Each model call came after its context and every earlier result and
    # step were durable.
    models = [s for kind, s in seen if kind == "model"]
    assert [(m["state"], m["step"], m["context_stored"], m["results"], m["steps_closed"]) for m in models] == [
        ("MODEL_RUNNING", 1, 1, 0, 0),
        ("MODEL_RUNNING", 2, 1, 1, 1),
        ("MODEL_RUNNING", 3, 1, 2, 2),
    ]
    assert all_violations(tmp_path / "home") == []


def test_a_repair_is_held_until_the_next_context(runner: Runner, tmp_path: Path) -> None:
    chains, _ = spied_run(runner, tmp_path, "final-premature")
    # The rejected final goes back to the model in the commit that freezes
    # the next context: VALIDATING -> READY -> MODEL_RUNNING in one.
    assert ("VALIDATING", "READY", "MODEL_RUNNING") in chains
    assert all(len(chain) <= 3 for chain in chains)
    assert all_violations(tmp_path / "home") == []


def test_an_error_with_held_commits_writes_none_of_them(runner: Runner, tmp_path: Path) -> None:
    """A failure between a held move and its commit is a crash before the
    held move: the journal keeps the last written state, and a later drive
    of the run (as a restart would) finishes it normally."""
    scenario = load_scenario(SCENARIOS / "happy-refund.yaml")
    run_id = runner.create(scenario, "v1")
    handlers = runner.controller._handlers
    evaluate = handlers[State.VALIDATING]
    calls = {"n": 0}

    def broken(view: Any, config: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("validation blew up")
        evaluate(view, config)

    handlers[State.VALIDATING] = broken
    with pytest.raises(RuntimeError, match="blew up"):
        runner.controller.drive(run_id)
    record = runner.store.get_run(run_id)
    # Step 2's candidate (held with VALIDATING) was never written; step 1's
    # result went in with step 2's context.
    assert record.state.value == "MODEL_RUNNING" and record.step == 2
    assert [row["step"] for row in runner.store.facts("candidates", run_id)] == [1]

    handlers[State.VALIDATING] = evaluate
    runner.drive_all([run_id])
    assert runner.outcome(run_id, scenario).ok
    assert [row["step"] for row in runner.store.facts("candidates", run_id)] == [1, 2, 3]
    assert all_violations(tmp_path / "home") == []


def test_a_cancel_from_another_caller_keeps_the_drivers_held_moves_but_not_its_next_one(runner: Runner,
                                                                                        tmp_path: Path) -> None:
    """Held moves belong to the view of the caller that holds them: a cancel
    requested meanwhile is appended at the run's head, and the driver's next
    commit loses its compare-and-set. The held moves record what already
    happened (the model call's candidate, its usage), so they are written
    after the cancel; the commit that met it (the dispatch of the refund)
    is not, and the driver starts again from the journal and cancels."""
    scenario = load_scenario(SCENARIOS / "happy-refund.yaml")
    run_id = runner.create(scenario, "v1")
    handlers = runner.controller._handlers
    evaluate = handlers[State.VALIDATING]
    chains = count_commits(runner)
    requested: list[bool] = []

    def cancel_first(view: Any, config: Any) -> None:
        if not requested:
            assert view.unwritten, "the move to VALIDATING is held"
            requested.append(runner.controller.request_cancel(run_id))  # appended at the head, not a commit()
        evaluate(view, config)

    handlers[State.VALIDATING] = cancel_first
    runner.drive_all([run_id])
    assert requested == [True]
    run = runner.store.get_run(run_id)
    assert run.state is State.CANCELLED
    # The first try refused, then the held move alone.
    assert chains[:3] == [("MODEL_RUNNING",), ("VALIDATING", "TOOL_RUNNING"), ("VALIDATING",)]
    assert len(runner.store.facts("candidates", run_id)) == 1 and run.model_attempts == 1 and run.tokens_out
    # The candidate nobody judged: its call is never sent, and has its one result.
    assert [(op["call_id"], op["outcome"], op["dispatch_count"]) for op in runner.store.operations(run_id)] == [
        ("call_1_1_1", "cancelled", 0)]
    kinds = [e.kind for e in runner.store.events(run_id)]
    assert kinds.index("cancel_requested") < kinds.index("candidate_recorded")
    assert all_violations(tmp_path / "home") == []
