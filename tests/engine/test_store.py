"""Run store conformance suite: every journal backend must pass it.

The ``store`` fixture is parametrised over ``STORE_KINDS``; ``raw`` is a
connection that bypasses the store (to look at rows, or to tamper with them).
"""

from __future__ import annotations

from typing import Any

import pytest

from journal_kit import Runs, open_store
from loopledger.canonical import canonical_json, content_id
from loopledger.engine import (
    SCHEMA_VERSION,
    Artifact,
    Commit,
    CommitRejected,
    CommitResult,
    NewEvent,
    NewRun,
    OperationConflict,
    RunStore,
    SchemaVersionError,
    StaleStateVersion,
    State,
    TerminalAlreadySet,
    TransitionNotAllowed,
    UnknownRun,
)

S = State

JOURNAL_TABLES = (
    "runs", "events", "artifacts", "candidates", "validations", "operations",
    "loop_diagnoses", "labels",
)


def snapshot(raw: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every journal table, for 'nothing was written' checks."""
    return {t: sorted(raw.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in JOURNAL_TABLES}


def candidate(step: int, attempt: int, **extra: Any) -> dict[str, Any]:
    row = {
        "step": step,
        "attempt": attempt,
        "candidate_id": f"cand-{step}-{attempt}",
        "context_artifact_id": "ctx",
        "finish_reason": "stop",
        "items_json": [{"type": "text", "text": "hello"}],
        "prompt_version": "v1",
        "model_route": "scripted",
        "tokens_in": 10,
        "tokens_out": 5,
        "cost_usd": 0.25,
    }
    row.update(extra)
    return row


def validation(step: int, attempt: int, verdict: str = "accept") -> dict[str, Any]:
    return {
        "step": step,
        "attempt": attempt,
        "candidate_id": f"cand-{step}-{attempt}",
        "validator": "structure",
        "validator_version": "1",
        "suite_version": "suite-1",
        "verdict": verdict,
        "code": "ok" if verdict == "accept" else "bad_structure",
        "message": "",
        "evidence_json": {"checked": True},
    }


def diagnosis(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "detector": "loop.repeated_call",
        "detector_version": "1",
        "pattern": "repeated_call",
        "evidence_json": {"calls": [1, 2]},
    }


def operation(key: str = "idem-1", args: Any = None, **extra: Any) -> dict[str, Any]:
    op = {
        "operation_id": f"op-{key}",
        "step": 1,
        "call_id": "call-1",
        "tool": "payments.refund",
        "tool_version": "v1",
        "idempotency_key": key,
        "canonical_args_json": canonical_json(args if args is not None else {"amount": 25.0, "order_id": "ORD-1042"}),
        "policy_decision": "allow",
        "status": "committed",
        "dispatch_count": 0,
    }
    op.update(extra)
    return op


def events_only(run_id: str, version: int, *kinds: str, **fields: Any) -> Commit:
    return Commit(
        run_id=run_id,
        expected_version=version,
        events=tuple(NewEvent(kind, {"i": i}) for i, kind in enumerate(kinds)),
        **fields,
    )


# -- create and read ----------------------------------------------------------


def test_store_satisfies_the_protocol(store: Any) -> None:
    assert isinstance(store, RunStore)


def test_create_run_starts_ready_with_one_event(store: Any) -> None:
    spec = {"contract": {"goal": "Refund ORD-1042"}, "budgets": {"max_steps": 8}}
    run = store.create_run(
        NewRun(run_id="r1", task_id="refund", tenant="acme", prompt_version="v2", model_route="scripted", spec=spec)
    )
    assert (run.run_id, run.thread_id, run.task_id, run.tenant) == ("r1", "r1", "refund", "acme")
    assert (run.prompt_version, run.model_route) == ("v2", "scripted")
    assert (run.state, run.state_version, run.last_seq) == (S.READY, 1, 1)
    assert (run.step, run.attempt, run.reason, run.ended_at, run.reward) == (0, 0, None, None, None)
    assert (run.model_attempts, run.tool_calls, run.tokens_in, run.tokens_out, run.cost_usd) == (0, 0, 0, 0, 0)
    assert run.spec == spec
    assert run.schema_version == SCHEMA_VERSION
    assert not run.is_terminal
    assert store.get_run("r1") == run
    [created] = store.events("r1")
    assert (created.seq, created.kind, created.from_state, created.to_state) == (1, "run_created", None, "READY")
    assert (created.state_version, created.payload) == (1, {})


def test_create_run_in_a_thread_and_with_artifacts(store: Any) -> None:
    context = Artifact("context", {"messages": [{"role": "user", "content": "hi"}]})
    run = store.create_run(NewRun(run_id="r2", task_id="t", tenant="acme", thread_id="th-1", artifacts=(context,)))
    assert run.thread_id == "th-1"
    assert store.get_artifact(context.artifact_id) == context.body


def test_list_runs_filters_by_state(store: Any, runs: Runs) -> None:
    runs.new("a")
    runs.new("b")
    runs.drive_to("b", S.FINALIZING)
    assert {r.run_id for r in store.list_runs()} == {"a", "b"}
    assert [r.run_id for r in store.list_runs([S.READY])] == ["a"]
    assert [r.run_id for r in store.list_runs([S.FINALIZING, S.FAILED])] == ["b"]
    assert store.list_runs([]) == []


def test_unknown_run(store: Any) -> None:
    with pytest.raises(UnknownRun) as caught:
        store.get_run("nope")
    assert caught.value.run_id == "nope"
    with pytest.raises(UnknownRun):
        store.commit(Commit(run_id="nope", expected_version=1, to_state=S.MODEL_RUNNING))
    assert store.events("nope") == []


def test_creating_a_run_twice_is_refused(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("dup")
    before = snapshot(raw)
    with pytest.raises(Exception):
        store.create_run(NewRun(run_id="dup", task_id="other", tenant="globex"))
    assert snapshot(raw) == before


# -- commit -------------------------------------------------------------------


def test_commit_appends_events_with_contiguous_seq_and_bumps_state_version(store: Any, runs: Runs) -> None:
    runs.new("r")
    plan = [
        dict(to_state=S.MODEL_RUNNING, step=1, attempt=1, payload={"why": "start"}),
        dict(events=(NewEvent("model_delta", {"n": 1}), NewEvent("model_delta", {"n": 2}))),
        dict(to_state=S.MODEL_RUNNING, attempt=2, events=(NewEvent("retry", {"reason": "length"}),)),
        dict(to_state=S.VALIDATING, events=(NewEvent("a"), NewEvent("b"), NewEvent("c"))),
        dict(to_state=S.READY),
    ]
    expected_seq = 1
    for number, fields in enumerate(plan, start=2):
        before = store.get_run("r")
        result = store.commit(Commit(run_id="r", expected_version=before.state_version, **fields))
        n_events = (1 if fields.get("to_state") else 0) + len(fields.get("events", ()))
        assert isinstance(result, CommitResult)
        assert result.state_version == before.state_version + 1 == number
        assert (result.first_seq, result.last_seq) == (expected_seq + 1, expected_seq + n_events)
        assert not result.late
        expected_seq += n_events
        after = store.get_run("r")
        assert (after.state_version, after.last_seq, after.state) == (number, expected_seq, result.state)
        new = store.events("r", after_seq=before.last_seq)
        assert [e.seq for e in new] == list(range(result.first_seq, result.last_seq + 1))
        assert {e.state_version for e in new} == {number}
        if fields.get("to_state"):
            assert (new[0].kind, new[0].from_state, new[0].to_state) == (
                "transition", before.state.value, fields["to_state"].value,
            )
            assert new[0].payload == fields.get("payload", {})
        assert [e.kind for e in new if e.kind != "transition"] == [e.kind for e in fields.get("events", ())]

    seqs = [e.seq for e in store.events("r")]
    assert seqs == list(range(1, expected_seq + 1))
    run = store.get_run("r")
    assert (run.state, run.step, run.attempt) == (S.READY, 1, 2)
    assert [e.seq for e in store.events("r", after_seq=5)] == list(range(6, expected_seq + 1))


def test_events_record_step_and_attempt(store: Any, runs: Runs) -> None:
    runs.new("r")
    runs.move("r", S.MODEL_RUNNING, step=1, attempt=1)
    runs.move("r", S.MODEL_RUNNING, attempt=2)
    last = store.events("r")[-1]
    assert (last.step, last.attempt) == (1, 2)
    assert (store.get_run("r").step, store.get_run("r").attempt) == (1, 2)


def test_a_commit_needs_an_event(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    before = snapshot(raw)
    with pytest.raises(ValueError):
        store.commit(Commit(run_id="r", expected_version=1))
    with pytest.raises(ValueError):
        store.commit(events_only("r", 1, "x", facts={"no_such_table": ({},)}))
    with pytest.raises(ValueError):
        store.commit(events_only("r", 1, "x", counters={"state_version": 5}))
    with pytest.raises(ValueError):
        store.commit(events_only("r", 1, "x", set_fields={"state": "SUCCEEDED"}))
    with pytest.raises(ValueError):
        store.commit(events_only("r", 1, "x", operation_updates=({"operation_id": "o", "tool": "x"},)))
    assert snapshot(raw) == before


def test_counters_and_fields(store: Any, runs: Runs) -> None:
    runs.new("r")
    runs.move("r", S.MODEL_RUNNING, counters={"model_attempts": 1, "tokens_in": 100, "cost_usd": 0.5})
    runs.move(
        "r", S.VALIDATING,
        counters={"tokens_in": 20, "tokens_out": 7, "tool_calls": 2, "cost_usd": 0.25},
        set_fields={"reason": "waiting_for_user", "waiting_json": canonical_json({"kind": "user"})},
    )
    run = store.get_run("r")
    assert (run.model_attempts, run.tokens_in, run.tokens_out, run.tool_calls) == (1, 120, 7, 2)
    assert run.cost_usd == pytest.approx(0.75)
    assert run.reason == "waiting_for_user"
    assert run.waiting == {"kind": "user"}


def test_stale_state_version_writes_nothing(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    runs.move("r", S.MODEL_RUNNING)
    before = snapshot(raw)
    stale = Commit(
        run_id="r",
        expected_version=1,
        to_state=S.VALIDATING,
        events=(NewEvent("e"),),
        artifacts=(Artifact("candidate", {"text": "never stored"}),),
        facts={"candidates": (candidate(1, 1),), "loop_diagnoses": (diagnosis(1),)},
        new_operations=(operation(),),
        counters={"model_attempts": 1},
        set_fields={"reason": "x"},
    )
    with pytest.raises(StaleStateVersion) as caught:
        store.commit(stale)
    error = caught.value
    assert isinstance(error, CommitRejected)
    assert (error.run_id, error.expected, error.actual) == ("r", 1, 2)
    assert snapshot(raw) == before
    with pytest.raises(StaleStateVersion):
        store.commit(Commit(run_id="r", expected_version=3, to_state=S.VALIDATING))
    assert snapshot(raw) == before


def test_transition_not_allowed_names_run_from_and_to_and_writes_nothing(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    before = snapshot(raw)
    bad = Commit(
        run_id="r",
        expected_version=1,
        to_state=S.TOOL_RUNNING,
        events=(NewEvent("e"),),
        artifacts=(Artifact("candidate", {"x": 1}),),
        facts={"candidates": (candidate(1, 1),)},
    )
    with pytest.raises(TransitionNotAllowed) as caught:
        store.commit(bad)
    error = caught.value
    assert (error.run_id, error.source, error.target) == ("r", "READY", "TOOL_RUNNING")
    assert "r" in str(error) and "READY" in str(error) and "TOOL_RUNNING" in str(error)
    assert snapshot(raw) == before


# -- terminal states and late events ------------------------------------------


def test_terminal_only_from_finalizing(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    for state in (S.READY, S.MODEL_RUNNING, S.VALIDATING, S.TOOL_RUNNING):
        runs.drive_to("r", state)
        before = snapshot(raw)
        with pytest.raises(TransitionNotAllowed):
            runs.move("r", S.SUCCEEDED)
        assert snapshot(raw) == before
    runs.drive_to("r", S.FINALIZING)
    result = runs.move("r", S.SUCCEEDED, set_fields={"reason": "completed"})
    run = store.get_run("r")
    assert (result.state, run.state, run.reason) == (S.SUCCEEDED, S.SUCCEEDED, "completed")
    assert run.is_terminal and run.ended_at is not None and run.ended_at >= run.started_at


def test_terminal_is_written_once_and_later_moves_are_late_events(store: Any, runs: Runs) -> None:
    runs.new("r")
    finalizing = runs.drive_to("r", S.FINALIZING)
    store.commit(Commit(run_id="r", expected_version=finalizing.state_version, to_state=S.SUCCEEDED))
    ended = store.get_run("r")

    # A second worker that also saw FINALIZING tries to end the run differently.
    racer = Commit(
        run_id="r",
        expected_version=finalizing.state_version,
        to_state=S.FAILED,
        payload={"reason": "tool_failed"},
        events=(NewEvent("tool_result", {"ok": False}),),
        artifacts=(Artifact("tool_result", {"late": True}),),
        set_fields={"reason": "tool_failed"},
    )
    with pytest.raises(TerminalAlreadySet) as caught:
        store.commit(racer)
    error = caught.value
    assert isinstance(error, CommitRejected)
    assert (error.run_id, error.terminal, error.attempted) == ("r", "SUCCEEDED", "FAILED")

    after = store.get_run("r")
    assert (after.state, after.state_version, after.reason, after.ended_at) == (
        S.SUCCEEDED, ended.state_version, ended.reason, ended.ended_at,
    )
    late = store.events("r", after_seq=ended.last_seq)
    assert [e.seq for e in late] == [ended.last_seq + 1, ended.last_seq + 2]
    assert after.last_seq == late[-1].seq
    assert [e.kind for e in late] == ["late_event", "late_event"]
    assert late[0].payload == {"kind": "transition", "payload": {"reason": "tool_failed"}, "to_state": "FAILED"}
    assert late[1].payload == {"kind": "tool_result", "payload": {"ok": False}}
    assert all(e.to_state is None and e.state_version == ended.state_version for e in late)
    # What arrived late is kept, artifacts included.
    assert store.get_artifact(Artifact("tool_result", {"late": True}).artifact_id) == {"late": True}


def test_events_only_commit_on_a_terminal_run_is_kept_as_late_event_and_refused(store: Any, runs: Runs) -> None:
    runs.new("r")
    runs.drive_to("r", S.FINALIZING)
    runs.move("r", S.CANCELLED)
    ended = store.get_run("r")
    # Any expected_version: the run has ended, nothing can be stale any more.
    # Kept, and refused all the same: its maker must not act on it (a
    # dispatch recorded late must not be sent).
    with pytest.raises(TerminalAlreadySet) as refused:
        store.commit(events_only("r", 1, "background_done", "user_reply"))
    assert (refused.value.terminal, refused.value.attempted) == ("CANCELLED", None)
    late = store.events("r", after_seq=ended.last_seq)
    assert [(e.kind, e.payload) for e in late] == [
        ("late_event", {"kind": "background_done", "payload": {"i": 0}}),
        ("late_event", {"kind": "user_reply", "payload": {"i": 1}}),
    ]
    after = store.get_run("r")
    assert (after.state, after.state_version, after.ended_at) == (S.CANCELLED, ended.state_version, ended.ended_at)
    assert after.last_seq == ended.last_seq + 2
    assert [e.seq for e in store.events("r")] == list(range(1, after.last_seq + 1))


# -- artifacts ----------------------------------------------------------------


def test_artifacts_are_stored_once_per_content(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("a")
    runs.new("b")
    body = {"messages": [{"role": "user", "content": "Refund ORD-1042"}], "budget": 1.0}
    same_body_other_order = {"budget": 1, "messages": [{"content": "Refund ORD-1042", "role": "user"}]}
    first = Artifact("context", body)
    second = Artifact("context", same_body_other_order)
    assert first.artifact_id == second.artifact_id == content_id(body)
    assert first.size_bytes == len(canonical_json(body).encode("utf-8"))

    runs.move("a", S.MODEL_RUNNING, artifacts=(first,))
    runs.move("b", S.MODEL_RUNNING, artifacts=(second, second))
    store.commit(events_only("a", store.get_run("a").state_version, "again", artifacts=(first,)))

    rows = raw.execute(
        "SELECT artifact_id, kind, body, size_bytes, first_run_id FROM artifacts WHERE artifact_id = ?",
        (first.artifact_id,),
    ).fetchall()
    assert rows == [(first.artifact_id, "context", canonical_json(body), first.size_bytes, "a")]
    assert store.get_artifact(first.artifact_id) == {
        "messages": [{"role": "user", "content": "Refund ORD-1042"}], "budget": 1,
    }
    with pytest.raises(KeyError):
        store.get_artifact(content_id({"absent": True}))


def test_artifact_ids_are_sha256_of_canonical_bytes(store: Any, runs: Runs) -> None:
    import hashlib

    body = {"é": ["ü", 1.5, None, True], "a": -0.0}
    artifact = Artifact("final", body)
    assert artifact.artifact_id == hashlib.sha256('{"a":0,"é":["ü",1.5,null,true]}'.encode()).hexdigest()
    runs.new("r", artifacts=(artifact,))
    assert store.get_artifact(artifact.artifact_id) == {"a": 0, "é": ["ü", 1.5, None, True]}


# -- facts and operations -----------------------------------------------------


def test_facts_are_recorded_with_the_commit_seq(store: Any, runs: Runs) -> None:
    runs.new("r")
    result = runs.move(
        "r", S.MODEL_RUNNING, step=1, attempt=1,
        facts={"candidates": (candidate(1, 1),)},
    )
    result2 = runs.move(
        "r", S.VALIDATING,
        facts={"validations": (validation(1, 1), validation(1, 1, "reject")), "loop_diagnoses": (diagnosis(1),)},
    )
    [cand] = store.facts("candidates", "r")
    assert cand == {
        "run_id": "r", **candidate(1, 1), "items_json": canonical_json([{"type": "text", "text": "hello"}]),
        "prompt_hash": None,  # not given: a column the row may leave empty
        "seq": result.last_seq, "schema_version": SCHEMA_VERSION,
    }
    validations = store.facts("validations", "r")
    assert [v["verdict"] for v in validations] == ["accept", "reject"]
    assert {v["seq"] for v in validations} == {result2.last_seq}
    assert validations[0]["evidence_json"] == '{"checked":true}'
    [diag] = store.facts("loop_diagnoses", "r")
    assert (diag["detector"], diag["pattern"], diag["seq"]) == ("loop.repeated_call", "repeated_call", result2.last_seq)
    assert store.facts("candidates", "other") == []
    with pytest.raises(ValueError):
        store.facts("events", "r")


def test_candidate_without_token_counts_gets_the_defaults(store: Any, runs: Runs) -> None:
    row = candidate(1, 1)
    for name in ("tokens_in", "tokens_out", "cost_usd"):
        del row[name]
    runs.new("r")
    runs.move("r", S.MODEL_RUNNING, facts={"candidates": (row,)})
    [stored] = store.facts("candidates", "r")
    assert (stored["tokens_in"], stored["tokens_out"], stored["cost_usd"]) == (0, 0, 0)


def test_operations_are_recorded_and_updated(store: Any, runs: Runs) -> None:
    runs.new("r")
    runs.drive_to("r", S.VALIDATING)
    created = runs.move("r", S.TOOL_RUNNING, new_operations=(operation("k1"),), counters={"tool_calls": 1})
    [op] = store.operations("r")
    assert op == {
        "run_id": "r", **operation("k1"), "expected_resource_version": None, "outcome": None,
        "result_artifact_id": None, "work_id": None,
        "created_seq": created.last_seq, "updated_seq": created.last_seq, "schema_version": SCHEMA_VERSION,
    }
    result = Artifact("tool_result", {"refund_id": "rf-1"})
    updated = runs.move(
        "r", S.READY,
        artifacts=(result,),
        operation_updates=({
            "operation_id": "op-k1", "status": "done", "outcome": "success",
            "dispatch_count": 1, "result_artifact_id": result.artifact_id,
        },),
    )
    [op] = store.operations("r")
    assert (op["status"], op["outcome"], op["dispatch_count"], op["result_artifact_id"]) == (
        "done", "success", 1, result.artifact_id,
    )
    assert (op["created_seq"], op["updated_seq"]) == (created.last_seq, updated.last_seq)


def test_operation_without_dispatch_count_starts_at_zero(store: Any, runs: Runs) -> None:
    op = operation("k1")
    del op["dispatch_count"]
    runs.new("r")
    runs.drive_to("r", S.VALIDATING)
    runs.move("r", S.TOOL_RUNNING, new_operations=(op,))
    assert store.operations("r")[0]["dispatch_count"] == 0


def test_updating_an_unknown_operation_is_refused(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    before = snapshot(raw)
    with pytest.raises(OperationConflict):
        store.commit(events_only("r", 1, "x", operation_updates=({"operation_id": "ghost", "status": "done"},)))
    assert snapshot(raw) == before


@pytest.mark.parametrize("args_as", ["text", "object"])
def test_duplicate_operation_is_a_no_op(store: Any, runs: Runs, raw: Any, args_as: str) -> None:
    args = {"order_id": "ORD-1042", "amount": 25.0}
    op = operation("idem-dup")
    if args_as == "object":
        op["canonical_args_json"] = args
    runs.new("r")
    runs.drive_to("r", S.VALIDATING)
    runs.move("r", S.TOOL_RUNNING, new_operations=(op,))
    runs.move("r", S.READY, operation_updates=({"operation_id": "op-idem-dup", "status": "done", "outcome": "success"},))
    # A retry records the same operation again (e.g. after a crash): no-op.
    runs.drive_to("r", S.TOOL_RUNNING)
    runs.move("r", S.RECONCILING, new_operations=(op,))
    rows = raw.execute("SELECT operation_id, status, outcome, canonical_args_json FROM operations").fetchall()
    assert rows == [("op-idem-dup", "done", "success", canonical_json(args))]


@pytest.mark.parametrize(
    "change",
    [
        {"canonical_args_json": canonical_json({"order_id": "ORD-1042", "amount": 50.0})},
        {"tool": "payments.charge"},
        {"operation_id": "op-other"},
    ],
    ids=["args", "tool", "operation_id"],
)
def test_same_idempotency_key_with_different_content_conflicts(
    store: Any, runs: Runs, raw: Any, change: dict[str, Any]
) -> None:
    runs.new("r")
    runs.drive_to("r", S.VALIDATING)
    runs.move("r", S.TOOL_RUNNING, new_operations=(operation("idem-x"),))
    before = snapshot(raw)
    with pytest.raises(OperationConflict) as caught:
        runs.move("r", S.READY, events=(NewEvent("e"),), new_operations=(operation("idem-x", **change),))
    assert (caught.value.run_id, caught.value.key) == ("r", "idem-x")
    assert isinstance(caught.value, CommitRejected)
    assert snapshot(raw) == before


def test_same_idempotency_key_from_another_run_conflicts(store: Any, runs: Runs, raw: Any) -> None:
    for run_id in ("a", "b"):
        runs.new(run_id)
        runs.drive_to(run_id, S.VALIDATING)
    runs.move("a", S.TOOL_RUNNING, new_operations=(operation("shared"),))
    before = snapshot(raw)
    with pytest.raises(OperationConflict):
        runs.move("b", S.TOOL_RUNNING, new_operations=(operation("shared"),))
    assert snapshot(raw) == before


def test_labels_are_recorded(store: Any, runs: Runs, raw: Any) -> None:
    runs.new("r")
    first = store.add_label(
        {"run_id": "r", "step": 1, "attempt": 1, "candidate_id": "c", "expected_verdict": "reject", "source": "human"}
    )
    second = store.add_label(
        {"run_id": "r", "step": 1, "attempt": 1, "candidate_id": "c", "validator": "structure",
         "expected_verdict": "accept", "source": "scenario", "note": "fine"}
    )
    assert second > first
    rows = raw.execute("SELECT label_id, validator, expected_verdict, source, note FROM labels ORDER BY label_id").fetchall()
    assert rows == [(first, "", "reject", "human", ""), (second, "structure", "accept", "scenario", "fine")]


# -- schema versions ----------------------------------------------------------


def _fill_every_table(store: Any, runs: Runs) -> None:
    runs.new("r", artifacts=(Artifact("context", {"c": 1}),))
    runs.move(
        "r", S.MODEL_RUNNING, step=1, attempt=1,
        facts={"candidates": (candidate(1, 1),), "loop_diagnoses": (diagnosis(1),)},
    )
    runs.move("r", S.VALIDATING, facts={"validations": (validation(1, 1),)})
    runs.move("r", S.TOOL_RUNNING, new_operations=(operation(),))
    store.add_label({"run_id": "r", "step": 1, "attempt": 1, "candidate_id": "c", "expected_verdict": "accept", "source": "human"})


def test_every_row_has_the_schema_version(store: Any, runs: Runs, raw: Any) -> None:
    _fill_every_table(store, runs)
    for table in JOURNAL_TABLES:
        versions = [row[0] for row in raw.execute(f"SELECT schema_version FROM {table}")]
        assert versions, f"{table} is empty"
        assert set(versions) == {SCHEMA_VERSION}, table


READERS = {
    "runs": lambda store: store.get_run("r"),
    "runs (list)": lambda store: store.list_runs(),
    "events": lambda store: store.events("r"),
    "artifacts": lambda store: store.get_artifact(content_id({"c": 1})),
    "candidates": lambda store: store.facts("candidates", "r"),
    "validations": lambda store: store.facts("validations", "r"),
    "loop_diagnoses": lambda store: store.facts("loop_diagnoses", "r"),
    "operations": lambda store: store.operations("r"),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_newer_schema_version_is_refused_on_read(store: Any, runs: Runs, raw: Any, reader: str) -> None:
    _fill_every_table(store, runs)
    READERS[reader](store)  # readable as written
    table = reader.split(" ")[0]
    newer = SCHEMA_VERSION + 1
    raw.execute(f"UPDATE {table} SET schema_version = ?", (newer,))
    with pytest.raises(SchemaVersionError) as caught:
        READERS[reader](store)
    assert (caught.value.table, caught.value.found, caught.value.supported) == (table, newer, SCHEMA_VERSION)


def test_a_batch_is_one_transaction_all_or_nothing(store: Any) -> None:
    with store.batch():
        store.create_run(NewRun(run_id="b1", task_id="t", tenant="acme"))
        store.commit(Commit("b1", 1, State.MODEL_RUNNING, step=1, attempt=1))
        # A refused commit inside is undone alone and raises as usual.
        with pytest.raises(StaleStateVersion):
            store.commit(Commit("b1", 1, State.FINALIZING))
        store.commit(Commit("b1", 2, State.FINALIZING))
        store.add_label({"run_id": "b1", "step": 1, "attempt": 1, "candidate_id": "c", "expected_verdict": "accept",
                         "source": "import"})
    assert store.get_run("b1").state is State.FINALIZING
    assert [e.seq for e in store.events("b1")] == [1, 2, 3]

    with pytest.raises(RuntimeError, match="boom"):
        with store.batch():
            store.create_run(NewRun(run_id="b2", task_id="t", tenant="acme"))
            store.commit(Commit("b1", 3, State.SUCCEEDED))
            raise RuntimeError("boom")
    assert store.run_ids() == {"b1"}
    assert store.get_run("b1").state is State.FINALIZING, "the rolled-back batch left nothing behind"
    # After the rollback the store commits from what the journal says.
    assert store.commit(Commit("b1", 3, State.SUCCEEDED)).state is State.SUCCEEDED


def test_a_group_commit_undoes_a_refused_commit_alone(store: Any, runs: Runs, raw: Any) -> None:
    """Commits of several runs applied as one group (one transaction): a
    commit refused before it writes (stale version, move not allowed) and one
    refused after it began writing (an operation conflict, found after its
    events and facts went in) are each undone alone; the others stand."""
    from loopledger.engine._store import _Slot

    for run_id in ("a", "b", "c", "d", "e"):
        runs.new(run_id)
        runs.drive_to(run_id, S.VALIDATING)
    runs.move("e", S.TOOL_RUNNING, new_operations=(operation("taken"),))
    versions = {run_id: store.get_run(run_id).state_version for run_id in "abcde"}
    before = {run_id: (store.events(run_id), store.facts("validations", run_id)) for run_id in "bcd"}
    slots = [
        _Slot((Commit("a", versions["a"], S.TOOL_RUNNING, facts={"validations": (validation(1, 1),)},
                     new_operations=(operation("fresh"),)),)),
        _Slot((Commit("b", versions["b"] - 1, S.TOOL_RUNNING),)),  # stale
        _Slot((Commit("c", versions["c"], S.SUCCEEDED),)),  # not allowed from VALIDATING
        _Slot((Commit("d", versions["d"], S.TOOL_RUNNING, events=(NewEvent("e"),),
                     facts={"validations": (validation(1, 1),)},
                     new_operations=(operation("taken", call_id="other"),)),)),  # conflicts with run e
        _Slot((Commit("e", versions["e"], S.READY, events=(NewEvent("e"),)),)),
    ]
    store._apply_group(slots)
    assert [type(slot.error) for slot in slots] == [
        type(None), StaleStateVersion, TransitionNotAllowed, OperationConflict, type(None)]
    assert store.get_run("a").state is S.TOOL_RUNNING and store.get_run("e").state is S.READY
    assert [op["operation_id"] for op in store.operations("a")] == ["op-fresh"]
    assert len(store.facts("validations", "a")) == 1
    for run_id in "bcd":
        assert store.get_run(run_id).state_version == versions[run_id]
        assert (store.events(run_id), store.facts("validations", run_id)) == before[run_id]
    # What the store remembers of each run agrees with the journal.
    assert store.commit(Commit("d", versions["d"], S.TOOL_RUNNING)).state is S.TOOL_RUNNING
    assert store.commit(Commit("a", versions["a"] + 1, S.READY)).state is S.READY


def test_group_commit_from_many_threads_returns_each_caller_its_own_durable_commit(store: Any, runs: Runs) -> None:
    """Threads committing at once share transactions (group commit); each
    call returns its own result once its commit is in, and a refused one
    (a stale version) raises in its own caller only."""
    import threading

    threads_n, moves = 16, 20
    for n in range(threads_n):
        runs.new(f"g{n}")
    store.group_commit = True
    errors: list[BaseException] = []
    stale: list[str] = []

    def work(run_id: str) -> None:
        try:
            version = store.get_run(run_id).state_version
            for attempt in range(1, moves + 1):
                # READY -> MODEL_RUNNING, then the next attempt each time.
                result = store.commit(Commit(run_id, version, S.MODEL_RUNNING, attempt=attempt,
                                             events=(NewEvent("e"),)))
                assert (result.run_id, result.state, result.state_version) == (run_id, S.MODEL_RUNNING, version + 1)
                assert store.get_run(run_id).state_version == result.state_version  # already in
                try:
                    store.commit(Commit(run_id, version, S.FINALIZING))
                except StaleStateVersion:
                    stale.append(run_id)
                version = result.state_version
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(f"g{n}",)) for n in range(threads_n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    store.group_commit = False
    assert errors == []
    assert len(stale) == threads_n * moves
    for n in range(threads_n):
        run = store.get_run(f"g{n}")
        assert run.state_version == 1 + moves
        assert [e.seq for e in store.events(f"g{n}")] == list(range(1, run.last_seq + 1))


def test_a_chain_of_commits_is_one_transaction(store: Any, runs: Runs, raw: Any) -> None:
    """Commits of one run chained in one call land together, each with its
    own state version and contiguous seq; a chain whose later commit is
    refused writes nothing, not even its earlier commits."""
    runs.new("r")
    ready = runs.drive_to("r", S.MODEL_RUNNING)
    v = ready.state_version
    to_validating = Commit("r", v, S.VALIDATING, events=(NewEvent("candidate_recorded", {"n": 1}),),
                           artifacts=(Artifact("candidate", {"n": 1}),), facts={"candidates": (candidate(1, 1),)})
    to_tools = Commit("r", v + 1, S.TOOL_RUNNING, facts={"validations": (validation(1, 1),)},
                      new_operations=(operation("one"),))

    before = snapshot(raw)
    refused = Commit("r", v + 1, S.SUCCEEDED)  # not allowed from VALIDATING
    with pytest.raises(TransitionNotAllowed):
        store.commit(to_validating, refused)
    assert snapshot(raw) == before
    with pytest.raises(StaleStateVersion):
        store.commit(to_validating, Commit("r", v, S.TOOL_RUNNING))  # expects the version before the chain
    assert snapshot(raw) == before

    result = store.commit(to_validating, to_tools)
    assert (result.state, result.state_version) == (S.TOOL_RUNNING, v + 2)
    events = store.events("r", after_seq=ready.last_seq)
    assert (result.first_seq, result.last_seq) == (ready.last_seq + 1, ready.last_seq + 3)
    assert [(e.kind, e.to_state, e.state_version) for e in events] == [
        ("transition", "VALIDATING", v + 1), ("candidate_recorded", None, v + 1),
        ("transition", "TOOL_RUNNING", v + 2)]
    assert [e.seq for e in events] == [ready.last_seq + 1, ready.last_seq + 2, ready.last_seq + 3]
    assert [f["seq"] for f in store.facts("candidates", "r")] == [ready.last_seq + 2]
    assert [f["seq"] for f in store.facts("validations", "r")] == [ready.last_seq + 3]
    assert store.get_artifact(Artifact("candidate", {"n": 1}).artifact_id) == {"n": 1}
    # Commits of another run do not belong in the chain.
    runs.new("other")
    with pytest.raises(ValueError, match="one run"):
        store.commit(Commit("r", v + 2, S.READY), Commit("other", 1, S.MODEL_RUNNING))


def test_a_chain_through_finalizing_ends_the_run_once(store: Any, runs: Runs) -> None:
    runs.new("r")
    validating = runs.drive_to("r", S.VALIDATING)
    v = validating.state_version
    result = store.commit(Commit("r", v, S.FINALIZING), Commit("r", v + 1, S.SUCCEEDED, set_fields={"reason": "ok"}))
    assert result.state is S.SUCCEEDED
    moves = [(e.from_state, e.to_state) for e in store.events("r") if e.kind == "transition"]
    assert moves[-2:] == [("VALIDATING", "FINALIZING"), ("FINALIZING", "SUCCEEDED")]
    # A chain on an ended run is kept as late events, and refused as a whole.
    with pytest.raises(TerminalAlreadySet):
        store.commit(Commit("r", v, S.FINALIZING), Commit("r", v + 1, S.FAILED))
    late = store.events("r", after_seq=result.last_seq)
    assert [e.kind for e in late] == ["late_event", "late_event"]
    assert store.get_run("r").state is S.SUCCEEDED


def test_a_group_commit_applies_a_chain_whole_or_not_at_all(store: Any, runs: Runs, raw: Any) -> None:
    from loopledger.engine._store import _Slot

    for run_id in ("a", "b"):
        runs.new(run_id)
        runs.drive_to(run_id, S.MODEL_RUNNING)
    va, vb = (store.get_run(r).state_version for r in "ab")
    before_b = store.events("b")
    slots = [
        _Slot((Commit("a", va, S.VALIDATING), Commit("a", va + 1, S.TOOL_RUNNING))),
        # Its first commit goes in, its second is refused: the chain is undone alone.
        _Slot((Commit("b", vb, S.VALIDATING, events=(NewEvent("e"),)), Commit("b", vb + 1, S.SUCCEEDED))),
    ]
    store._apply_group(slots)
    assert slots[0].error is None and isinstance(slots[1].error, TransitionNotAllowed)
    assert (store.get_run("a").state, store.get_run("a").state_version) == (S.TOOL_RUNNING, va + 2)
    assert store.get_run("b").state_version == vb and store.events("b") == before_b
    assert store.commit(Commit("b", vb, S.VALIDATING)).state is S.VALIDATING


def test_many_fact_rows_in_one_commit_keep_their_order(store: Any, runs: Runs) -> None:
    """Rows go in as multi-row INSERTs, some statements' worth of them: all
    are recorded, in order, and rows that omit a column still get its default."""
    runs.new("r")
    runs.drive_to("r", S.VALIDATING)
    rows = tuple({**validation(1, 1), "validator": f"v{n:03d}", "code": f"c{n}"} for n in range(123))
    sparse = tuple({k: v for k, v in candidate(1, n).items() if k not in ("tokens_in", "cost_usd")}
                   for n in range(1, 4))
    runs.move("r", S.READY, facts={"validations": rows, "candidates": sparse},
              events=tuple(NewEvent(f"e{n}") for n in range(60)))
    recorded = store.facts("validations", "r")
    assert [row["validator"] for row in recorded] == [f"v{n:03d}" for n in range(123)]
    assert len({row["seq"] for row in recorded}) == 1
    assert [(row["attempt"], row["tokens_in"], row["cost_usd"]) for row in store.facts("candidates", "r")] == [
        (1, 0, 0.0), (2, 0, 0.0), (3, 0, 0.0)]
    events = store.events("r")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events[-60:]] == [f"e{n}" for n in range(60)]


# -- who drives a run ----------------------------------------------------------------


def _hold_claim(where: str, run_id: str, ready: Any) -> None:
    """A child that takes the claim on a run and keeps it until it is killed."""
    import time

    from journal_kit import open_any

    assert open_any(where).claim(run_id)
    ready.set()
    time.sleep(600)


def test_one_driver_per_run_among_stores_and_processes(store: Any, store_kind: str, journal_at: Any) -> None:
    import multiprocessing

    other = open_store(store_kind, journal_at)
    try:
        assert store.claim("r") and store.claim("r")  # reentrant in a thread
        assert not other.claim("r") and not other.claim("r", wait_s=0.2)
        assert other.claim("s")  # other runs are free
        store.release("r")
        assert not other.claim("r")  # still held once
        store.release("r")
        assert other.claim("r") and not store.claim("r")
        other.release("r")
        other.release("s")
        # A process that dies holding a claim leaves none behind.
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        child = context.Process(target=_hold_claim, args=(str(journal_at), "t", ready))
        child.start()
        try:
            assert ready.wait(120)
            assert not store.claim("t")
        finally:
            child.kill()
            child.join()
        assert store.claim("t", wait_s=10)
        store.release("t")
    finally:
        other.close()


def test_a_watch_is_seen_by_other_stores_until_it_is_let_go(store: Any, store_kind: str, journal_at: Any) -> None:
    import time

    other = open_store(store_kind, journal_at)
    try:
        assert not store.watched_elsewhere("r-1") and not other.watched_elsewhere("r-1")
        other.watch("r-1")
        assert store.watched_elsewhere("r-1") and not other.watched_elsewhere("r-1")
        # A watch is no claim: the run can still be driven by another.
        assert store.claim("r-1", 0)
        store.release("r-1")
        other.unwatch("r-1")
        assert not store.watched_elsewhere("r-1")
        other.watch("r-1")
    finally:
        other.close()
    deadline = time.monotonic() + 10  # a server lets go of a closed session's locks a moment later
    while store.watched_elsewhere("r-1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.watched_elsewhere("r-1")


def test_asking_whether_a_batch_is_held_takes_nothing_others_can_see(
        store: Any, store_kind: str, journal_at: Any) -> None:
    """Two processes resuming runs of one batch whose maker is gone each ask
    whether the batch is held. An asker that took the batch's lock to find
    out made the other, asking at that moment, see a live maker and leave a
    run undriven."""
    import threading
    import time

    other = open_store(store_kind, journal_at)
    try:
        seen: list[bool] = []

        def ask(s: Any) -> None:
            seen.extend(s.batch_held_elsewhere("b-1") for _ in range(1500))

        askers = [threading.Thread(target=ask, args=(s,)) for s in (store, other)]
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        assert len(seen) == 3000 and not any(seen)
        other.hold_batch("b-1")
        assert store.batch_held_elsewhere("b-1") and not other.batch_held_elsewhere("b-1")
    finally:
        other.close()
    # Its holder closed (a server lets go of a session's locks once the
    # session has ended, a moment after its client closed it).
    deadline = time.monotonic() + 10
    while store.batch_held_elsewhere("b-1") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.batch_held_elsewhere("b-1")
