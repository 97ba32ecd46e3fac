"""The transition table, checked exhaustively against the spec.

``SPEC`` is copied by hand from ARCHITECTURE.md ("Transitions") and the
state list of CONTRACT.md, so the store is checked against the design and
not against ``ALLOWED`` itself. Every (from, to) pair of states is tried on
the store: a run is driven to ``from`` along a shortest path of the spec,
then one commit to ``to`` is attempted.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from journal_kit import STORE_KINDS, Runs, open_store, shortest_path
from loopledger.engine import (
    ALLOWED,
    INITIAL,
    TERMINAL,
    WAITING,
    Commit,
    NewEvent,
    State,
    TerminalAlreadySet,
    TransitionNotAllowed,
    is_allowed,
)

S = State

CONTRACT_STATES = [
    "READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING", "RECONCILING",
    "WAITING_TOOL", "WAITING_USER", "FINALIZING",
    "SUCCEEDED", "FAILED", "CANCELLED", "CANCEL_UNKNOWN", "BUDGET_EXHAUSTED",
    "POLICY_STOPPED", "EXPIRED",
]
CONTRACT_TERMINAL = {
    "SUCCEEDED", "FAILED", "CANCELLED", "CANCEL_UNKNOWN", "BUDGET_EXHAUSTED",
    "POLICY_STOPPED", "EXPIRED",
}
_TERMINAL_STATES = {S(name) for name in CONTRACT_TERMINAL}

SPEC: dict[State, set[State]] = {
    S.READY: {S.MODEL_RUNNING, S.FINALIZING},
    S.MODEL_RUNNING: {S.MODEL_RUNNING, S.VALIDATING, S.FINALIZING},
    S.VALIDATING: {S.TOOL_RUNNING, S.READY, S.WAITING_USER, S.FINALIZING},
    S.TOOL_RUNNING: {S.READY, S.WAITING_TOOL, S.RECONCILING, S.WAITING_USER, S.FINALIZING},
    S.RECONCILING: {S.READY, S.TOOL_RUNNING, S.WAITING_USER, S.FINALIZING},
    S.WAITING_TOOL: {S.READY, S.RECONCILING, S.FINALIZING},
    S.WAITING_USER: {S.READY, S.TOOL_RUNNING, S.FINALIZING},
    S.FINALIZING: {S.READY, S.WAITING_TOOL} | _TERMINAL_STATES,
    **{terminal: set() for terminal in _TERMINAL_STATES},
}
SPEC_FROZEN = {state: frozenset(targets) for state, targets in SPEC.items()}

PAIRS = list(itertools.product(list(State), repeat=2))


def test_states_are_the_contract_states() -> None:
    assert [s.value for s in State] == CONTRACT_STATES
    assert {s.value for s in TERMINAL} == CONTRACT_TERMINAL
    assert WAITING == {S.WAITING_TOOL, S.WAITING_USER}
    assert INITIAL is S.READY
    for state in State:
        assert str(state) == state.value
        assert state.is_terminal == (state.value in CONTRACT_TERMINAL)


def test_allowed_is_the_spec_table() -> None:
    assert set(ALLOWED) == set(State)
    for state in State:
        assert ALLOWED[state] == SPEC_FROZEN[state], state
    for source, target in PAIRS:
        assert is_allowed(source, target) == (target in SPEC[source])


def test_the_engine_docs_state_table_names_the_allowed_moves() -> None:
    """docs/engine.md's table of states, "next" column: the ALLOWED table,
    so a reader is never told a move is impossible that happens."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "engine.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| ([A-Z_]+) \| .* \| ([^|]+) \|$", text, flags=re.M))
    working = [s for s in State if not s.is_terminal]
    assert set(rows) == {s.value for s in working}
    for state in working:
        named = {w.strip() for w in re.sub(r"\(.*?\)", "", rows[state.value]).split(",")}
        expected = {t.value for t in ALLOWED[state] if not t.is_terminal}
        expected |= {"terminal"} if any(t.is_terminal for t in ALLOWED[state]) else set()
        assert named == expected, state


def test_allowed_is_read_only() -> None:
    with pytest.raises(TypeError):
        ALLOWED[S.READY] = frozenset(State)  # type: ignore[index]


def test_terminal_states_are_entered_only_from_finalizing_and_never_left() -> None:
    for source, target in PAIRS:
        if target in TERMINAL and target in ALLOWED[source]:
            assert source is S.FINALIZING, (source, target)
    for terminal in TERMINAL:
        assert ALLOWED[terminal] == frozenset()
        assert terminal in ALLOWED[S.FINALIZING]


def test_every_state_is_reachable_from_ready() -> None:
    for state in State:
        path = shortest_path(state, SPEC_FROZEN)
        for source, target in zip([INITIAL, *path], path):
            assert target in SPEC[source]


@pytest.fixture(scope="module", params=STORE_KINDS)
def shared_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if request.param == "postgresql":
        where: Any = request.getfixturevalue("postgres_server").new_database()
    else:
        where = tmp_path_factory.mktemp("states") / "journal.sqlite"
    opened = open_store(request.param, where)
    yield opened
    opened.close()


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
def test_store_accepts_a_move_iff_the_spec_allows_it(shared_store: Any, source: State, target: State) -> None:
    runs = Runs(shared_store)
    run_id = f"{source.value}->{target.value}"
    runs.new(run_id)
    before = runs.drive_to(run_id, source, SPEC_FROZEN)
    commit = Commit(
        run_id=run_id,
        expected_version=before.state_version,
        to_state=target,
        payload={"probe": True},
        events=(NewEvent("probe_event", {"n": 1}),),
    )

    if target in SPEC[source]:
        result = shared_store.commit(commit)
        after = shared_store.get_run(run_id)
        assert (result.state, after.state) == (target, target)
        assert after.state_version == before.state_version + 1
        transition = shared_store.events(run_id, after_seq=before.last_seq)[0]
        assert (transition.kind, transition.from_state, transition.to_state) == (
            "transition", source.value, target.value,
        )
        assert (after.ended_at is not None) == (target in TERMINAL)
    elif source in TERMINAL:
        # Nothing leaves a terminal state; the attempt is kept as late events.
        with pytest.raises(TerminalAlreadySet) as caught:
            shared_store.commit(commit)
        assert (caught.value.run_id, caught.value.terminal, caught.value.attempted) == (
            run_id, source.value, target.value,
        )
        after = shared_store.get_run(run_id)
        assert (after.state, after.state_version) == (source, before.state_version)
        assert after.ended_at == before.ended_at
        late = shared_store.events(run_id, after_seq=before.last_seq)
        assert [e.kind for e in late] == ["late_event", "late_event"]
        assert all(e.to_state is None for e in late)
    else:
        with pytest.raises(TransitionNotAllowed) as caught:
            shared_store.commit(commit)
        error = caught.value
        assert (error.run_id, error.source, error.target) == (run_id, source.value, target.value)
        assert run_id in str(error) and source.value in str(error) and target.value in str(error)
        assert shared_store.get_run(run_id) == before
        assert shared_store.events(run_id, after_seq=before.last_seq) == []
