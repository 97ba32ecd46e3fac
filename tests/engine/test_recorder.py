"""The recorder: journal -> Parquet trace tables.

The Parquet row sets are compared with the journal table by table, on every
column the Parquet table has. The expected rows are read from the journal
with SQL written here (CONTRACT names mapped to journal columns by hand), not
with the recorder's own table description.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from journal_kit import Runs, raw_connection
from loopledger.canonical import canonical_json
from loopledger.engine import (
    Artifact,
    Commit,
    NewEvent,
    Recorder,
    SQLiteRunStore,
    open_journal,
    State,
    TerminalAlreadySet,
)
from loopledger.replay import TracesError, replay

S = State

#: CONTRACT.md, "Parquet tables": every table and its required columns.
CONTRACT_TABLES: dict[str, list[str]] = {
    "runs": ["run_id", "thread_id", "task_id", "tenant", "prompt_version", "model_route", "status", "reason",
             "started_at", "ended_at", "steps", "model_attempts", "tool_calls", "tokens_in", "tokens_out",
             "cost_usd", "reward"],
    "events": ["run_id", "seq", "ts", "kind", "from_state", "to_state", "step", "attempt", "payload_json"],
    "artifacts": ["artifact_id", "run_id", "kind", "created_at", "size_bytes", "body"],
    "candidates": ["run_id", "step", "attempt", "candidate_id", "context_artifact_id", "finish_reason",
                   "items_json", "prompt_version", "model_route"],
    "validations": ["run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                    "suite_version", "verdict", "code", "message", "evidence_json"],
    "operations": ["operation_id", "run_id", "step", "tool", "tool_version", "idempotency_key",
                   "canonical_args_json", "policy_decision", "outcome", "dispatch_count"],
    "loop_diagnoses": ["run_id", "step", "detector", "detector_version", "pattern", "evidence_json"],
    "labels": ["run_id", "step", "attempt", "candidate_id", "validator", "expected_verdict", "source", "note"],
}
TIMESTAMPS = {"runs": ["started_at", "ended_at"], "events": ["ts"], "artifacts": ["created_at"]}

#: Where a Parquet column comes from when the journal names it differently.
RENAMED = {
    ("runs", "status"): "state",
    ("runs", "steps"): "step",
    ("artifacts", "run_id"): "first_run_id",
    # The spec lives in its own journal table; the trace puts it on the run.
    ("runs", "spec_json"): "(SELECT spec_json FROM run_specs WHERE run_specs.run_id = runs.run_id)",
}


# -- reading both sides ---------------------------------------------------------


def parquet_files(traces: Path, table: str) -> list[Path]:
    return sorted((traces / table).glob("*.parquet"))


def read_parquet(traces: Path, table: str) -> tuple[list[str], Counter[tuple[Any, ...]]]:
    files = parquet_files(traces, table)
    assert files, f"no Parquet file for {table}"
    schemas = {pq.read_schema(f) for f in files}
    assert len(schemas) == 1, f"{table}: files disagree on the schema"
    rows: Counter[tuple[Any, ...]] = Counter()
    columns: list[str] = []
    for path in files:
        data = pq.read_table(path)
        columns = data.column_names
        arrays = [
            col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col
            for col in data.columns
        ]
        rows.update(zip(*(a.to_pylist() for a in arrays)))
    return columns, rows


@dataclass(frozen=True)
class Journal:
    """The test's journal: its store kind and where it is (a file or a URL)."""

    kind: str
    where: str | Path

    @property
    def url(self) -> str:
        return str(self.where) if self.kind == "postgresql" else f"sqlite:{self.where}"

    def connect(self) -> Any:
        return raw_connection(self.kind, self.where)


def read_journal(journal: Journal, table: str, columns: list[str]) -> Counter[tuple[Any, ...]]:
    exprs = [RENAMED.get((table, c), c) for c in columns]
    conn = journal.connect()
    try:
        return Counter(tuple(r) for r in conn.execute(f"SELECT {', '.join(exprs)} FROM {table}"))
    finally:
        conn.close()


def assert_traces_equal_journal(traces: Path, journal: Journal) -> dict[str, int]:
    counts = {}
    for table in CONTRACT_TABLES:
        columns, rows = read_parquet(traces, table)
        expected = read_journal(journal, table, columns)
        assert rows == expected, f"{table}: Parquet differs from the journal"
        assert max(rows.values(), default=1) == 1, f"{table}: duplicate rows"
        counts[table] = sum(rows.values())
    assert not list(traces.rglob("*.tmp")), "a temporary file was left behind"
    return counts


def bookkeeping(journal: Journal, table: str) -> list[str]:
    """Statuses of the recorder's own journal rows (exports, compactions)."""
    key = {"exports": "export_id", "compactions": "compaction_id"}[table]
    conn = journal.connect()
    try:
        return [status for (status,) in conn.execute(f"SELECT status FROM {table} ORDER BY {key}")]
    finally:
        conn.close()


# -- a journal with every kind of fact ------------------------------------------


def candidate(step: int, attempt: int, run_id: str) -> dict[str, Any]:
    return {
        "step": step, "attempt": attempt, "candidate_id": f"{run_id}-c{step}.{attempt}",
        "context_artifact_id": "ctx", "finish_reason": "tool_calls",
        "items_json": [{"type": "tool_call", "call_id": "c1", "name": "orders.get_order", "version": None,
                        "arguments": {"order_id": "ORD-1042"}}],
        "prompt_version": "v1", "model_route": "scripted", "tokens_in": 100, "tokens_out": 20, "cost_usd": 0.001,
    }


def validation(step: int, attempt: int, run_id: str, validator: str, verdict: str) -> dict[str, Any]:
    return {
        "step": step, "attempt": attempt, "candidate_id": f"{run_id}-c{step}.{attempt}",
        "validator": validator, "validator_version": "1", "suite_version": "s1", "verdict": verdict,
        "code": "ok" if verdict == "accept" else "needs_work", "message": f"{validator} said {verdict}",
        "evidence_json": {"why": [validator, verdict]},
    }


def populate(store: Any, prefix: str) -> None:
    """Runs through every kind of fact: candidates, validations, operations
    (created then updated), loop diagnoses, labels, late events, shared
    artifacts, a run left waiting."""
    runs = Runs(store)
    shared = Artifact("context", {"policy": "shared by every run", "v": 1})

    done = f"{prefix}-done"
    runs.new(done, prompt_version="v1", spec={"goal": "refund"}, artifacts=(shared,))
    runs.move(done, S.MODEL_RUNNING, step=1, attempt=1, counters={"model_attempts": 1, "tokens_in": 100},
              artifacts=(Artifact("context", {"run": done, "step": 1}),),
              facts={"candidates": (candidate(1, 1, done),)})
    runs.move(done, S.VALIDATING, artifacts=(Artifact("candidate", {"run": done}),),
              facts={"validations": (validation(1, 1, done, "structure", "accept"),
                                     validation(1, 1, done, "permission", "accept"))})
    op = {
        "operation_id": f"{done}-op1", "step": 1, "call_id": "c1", "tool": "payments.refund", "tool_version": "v1",
        "idempotency_key": f"{done}-key1", "canonical_args_json": {"order_id": "ORD-1042", "amount": 25.0},
        "policy_decision": "allow", "status": "committed", "dispatch_count": 0,
    }
    runs.move(done, S.TOOL_RUNNING, new_operations=(op,), counters={"tool_calls": 1})
    result = Artifact("tool_result", {"refund": "rf-1", "run": done})
    runs.move(done, S.READY, artifacts=(result,), operation_updates=(
        {"operation_id": f"{done}-op1", "status": "done", "outcome": "success", "dispatch_count": 1,
         "result_artifact_id": result.artifact_id},
    ))
    runs.move(done, S.MODEL_RUNNING, step=2, attempt=1, facts={"candidates": (candidate(2, 1, done),)},
              counters={"model_attempts": 1, "tokens_out": 40, "cost_usd": 0.002})
    runs.move(done, S.MODEL_RUNNING, attempt=2, facts={"candidates": (candidate(2, 2, done),)},
              events=(NewEvent("stream_broken", {"at": 17}),))
    runs.move(done, S.VALIDATING, facts={"validations": (validation(2, 2, done, "completion_gate", "accept"),)})
    runs.move(done, S.FINALIZING, artifacts=(Artifact("final", {"text": "Refund issued", "run": done}),))
    runs.move(done, S.SUCCEEDED, set_fields={"reason": "completed"})
    # Late arrivals after the end are kept (and refused).
    with pytest.raises(TerminalAlreadySet):
        store.commit(Commit(run_id=done, expected_version=1, events=(NewEvent("work_completed", {"work_id": "w1"}),)))
    with pytest.raises(TerminalAlreadySet):
        runs.move(done, S.FAILED)

    looped = f"{prefix}-loop"
    runs.new(looped, prompt_version="v2", model_route="openai:gpt-4.1", artifacts=(shared,))
    runs.move(looped, S.MODEL_RUNNING, step=1, attempt=1, facts={"candidates": (candidate(1, 1, looped),)})
    runs.move(looped, S.VALIDATING, facts={"validations": (validation(1, 1, looped, "tool_exists", "reject"),)})
    runs.move(looped, S.READY, facts={"loop_diagnoses": (
        {"step": 1, "detector": "loop.repeated_call", "detector_version": "1", "pattern": "repeated_call",
         "evidence_json": {"calls": ["a", "a"]}},
        {"step": 1, "detector": "loop.no_progress", "detector_version": "2", "pattern": "no_progress",
         "evidence_json": {"window": 4}},
    )})
    runs.move(looped, S.FINALIZING)
    runs.move(looped, S.POLICY_STOPPED, set_fields={"reason": "loop_detected"})

    waiting = f"{prefix}-wait"
    runs.new(waiting, thread_id=f"{prefix}-thread")
    runs.drive_to(waiting, S.VALIDATING)
    runs.move(waiting, S.WAITING_USER, set_fields={
        "reason": "waiting_for_user", "waiting_json": canonical_json({"kind": "user", "expires_at": 1}),
    })

    store.add_label({"run_id": done, "step": 1, "attempt": 1, "candidate_id": f"{done}-c1.1",
                     "validator": "structure", "expected_verdict": "accept", "source": "human", "note": "ok"})
    store.add_label({"run_id": looped, "step": 1, "attempt": 1, "candidate_id": f"{looped}-c1.1",
                     "expected_verdict": "reject", "source": "scenario"})


def advance(store: Any, prefix: str) -> None:
    """More activity on existing runs: the waiting run finishes, a terminal run
    gets another late event, an operation changes, a label is added."""
    runs = Runs(store)
    waiting = f"{prefix}-wait"
    runs.move(waiting, S.TOOL_RUNNING, set_fields={"waiting_json": None}, new_operations=({
        "operation_id": f"{waiting}-op", "step": 1, "tool": "deploy.service", "tool_version": "v2",
        "idempotency_key": f"{waiting}-k", "canonical_args_json": {"service": "api", "version": "2"},
        "policy_decision": "approved", "status": "dispatched", "dispatch_count": 1,
    },))
    runs.move(waiting, S.WAITING_TOOL, operation_updates=(
        {"operation_id": f"{waiting}-op", "outcome": "background_accepted", "work_id": "w9"},
    ))
    runs.move(waiting, S.FINALIZING)
    runs.move(waiting, S.SUCCEEDED, set_fields={"reason": "completed"},
              artifacts=(Artifact("context", {"policy": "shared by every run", "v": 1}),))
    with pytest.raises(TerminalAlreadySet):  # kept as a late event
        store.commit(Commit(run_id=f"{prefix}-done", expected_version=1, events=(NewEvent("late_again"),)))
    store.add_label({"run_id": waiting, "step": 1, "attempt": 1, "candidate_id": "x",
                     "expected_verdict": "ask", "source": "import"})


@pytest.fixture
def journal(store: Any, store_kind: str, journal_at: str | Path) -> Journal:
    return Journal(store_kind, journal_at)


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    return tmp_path / "traces"


def file_names(traces: Path) -> dict[str, list[str]]:
    return {t: [p.name for p in parquet_files(traces, t)] for t in CONTRACT_TABLES}


# -- tests ----------------------------------------------------------------------


def test_every_contract_table_exists_with_its_columns_even_when_empty(store: Any, traces: Path, journal: Journal) -> None:
    Recorder(store, traces).export()
    for table, required in CONTRACT_TABLES.items():
        files = parquet_files(traces, table)
        assert files, f"{table} has no file"
        schema = pq.read_schema(files[0])
        missing = [c for c in required if c not in schema.names]
        assert not missing, f"{table} lacks {missing}"
        for column in TIMESTAMPS.get(table, []):
            assert schema.field(column).type == pa.timestamp("us", tz="UTC"), (table, column)
        assert sum(pq.read_table(f).num_rows for f in files) == 0
    assert_traces_equal_journal(traces, journal)


def test_duckdb_reads_the_tables(store: Any, traces: Path) -> None:
    import duckdb

    populate(store, "a")
    Recorder(store, traces).export()
    con = duckdb.connect()
    runs = con.execute(
        f"SELECT run_id, status, reason FROM read_parquet('{traces}/runs/*.parquet') ORDER BY run_id"
    ).fetchall()
    assert runs == [("a-done", "SUCCEEDED", "completed"), ("a-loop", "POLICY_STOPPED", "loop_detected"),
                    ("a-wait", "WAITING_USER", "waiting_for_user")]
    gaps = con.execute(
        f"SELECT run_id, count(*), max(seq) FROM read_parquet('{traces}/events/*.parquet') GROUP BY run_id"
    ).fetchall()
    assert all(count == top for _, count, top in gaps)


def test_export_equals_the_journal_and_twice_adds_no_rows(store: Any, traces: Path, journal: Journal) -> None:
    populate(store, "a")
    recorder = Recorder(store, traces)
    first = recorder.export()
    assert first.export_id is not None and first.appended > 0
    counts = assert_traces_equal_journal(traces, journal)
    assert counts["events"] == sum(r.last_seq for r in store.list_runs())
    assert counts["artifacts"] > 0 and counts["labels"] == 2
    names = file_names(traces)

    second = recorder.export()
    assert second.appended == 0
    assert assert_traces_equal_journal(traces, journal) == counts
    assert file_names(traces) == names


def test_incremental_exports_equal_the_journal(store: Any, traces: Path, journal: Journal) -> None:
    recorder = Recorder(store, traces)
    populate(store, "a")
    recorder.export()
    advance(store, "a")
    populate(store, "b")
    recorder.export()
    counts = assert_traces_equal_journal(traces, journal)
    advance(store, "b")
    recorder.export()
    later = assert_traces_equal_journal(traces, journal)
    assert later["events"] > counts["events"] and later["labels"] == counts["labels"] + 1
    # The snapshot of a mutable operation shows its latest state.
    _, ops = read_parquet(traces, "operations")
    assert len(ops) == 4


def test_a_new_recorder_on_the_same_journal_adds_no_rows(store: Any, traces: Path, journal: Journal) -> None:
    populate(store, "a")
    Recorder(store, traces).export()
    counts = assert_traces_equal_journal(traces, journal)
    reopened = open_journal(journal.url)
    try:
        Recorder(reopened, traces).export()
    finally:
        reopened.close()
    assert assert_traces_equal_journal(traces, journal) == counts


@pytest.mark.parametrize("deleted", [("events",), ("labels",), ("runs", "artifacts", "validations")])
def test_a_deleted_table_folder_is_written_again_from_the_journal(store: Any, traces: Path, journal: Journal,
                                                                   deleted: tuple[str, ...]) -> None:
    """Not "up to date" with a table gone: the journal is the source of
    truth, and what this folder had of the table comes back, once, beside
    the rows that are new since."""
    import shutil

    populate(store, "a")
    recorder = Recorder(store, traces)
    recorder.export()
    for name in deleted:
        shutil.rmtree(traces / name)
    advance(store, "a")
    result = recorder.export()
    assert set(result.refilled) == set(deleted)
    assert_traces_equal_journal(traces, journal)
    assert recorder.export().appended == 0
    assert_traces_equal_journal(traces, journal)


class Interrupted(Exception):
    pass


def test_an_export_interrupted_after_writing_its_files_is_completed(
    store: Any, traces: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    populate(store, "a")
    Recorder(store, traces).export()
    advance(store, "a")
    populate(store, "b")

    # The intent is recorded and every file written, then the process dies
    # before the export is marked done.
    original = Recorder._publish

    def publish_then_die(self: Recorder, *args: Any, **kwargs: Any) -> Any:
        def refuse() -> Any:
            raise Interrupted

        monkeypatch.setattr(self.store, "_write", refuse)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "_publish", publish_then_die)
    with pytest.raises(Interrupted):
        Recorder(store, traces).export()
    monkeypatch.undo()
    assert bookkeeping(journal, "exports")[-1] == "pending"

    Recorder(store, traces).export()
    assert set(bookkeeping(journal, "exports")) == {"done"}
    assert_traces_equal_journal(traces, journal)
    assert Recorder(store, traces).export().appended == 0
    assert_traces_equal_journal(traces, journal)


def test_an_export_interrupted_while_writing_its_files_is_completed(
    store: Any, traces: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopledger.engine import _recorder

    populate(store, "a")
    Recorder(store, traces).export()
    advance(store, "a")
    populate(store, "b")

    original = _recorder.write_parquet
    calls = {"n": 0}

    def write_some_then_die(path: Path, *args: Any, **kwargs: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 4:
            path.with_name(path.name + ".tmp").write_bytes(b"half a file")
            raise Interrupted
        return original(path, *args, **kwargs)

    monkeypatch.setattr(_recorder, "write_parquet", write_some_then_die)
    with pytest.raises(Interrupted):
        Recorder(store, traces).export()
    monkeypatch.undo()

    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


def loopledger(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("loopledger")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    full_env.update(env or {})
    return subprocess.run([str(command), *args], capture_output=True, text=True, env=full_env, timeout=120)


def make_home(tmp_path: Path, *prefixes: str) -> Path:
    home = tmp_path / "home"
    store = SQLiteRunStore(home / "journal.sqlite")
    try:
        for prefix in prefixes:
            populate(store, prefix)
    finally:
        store.close()
    return home


def add_to_home(home: Path, action: Any, prefix: str) -> None:
    store = SQLiteRunStore(home / "journal.sqlite")
    try:
        action(store, prefix)
    finally:
        store.close()


@pytest.mark.parametrize("crash_after", [1, 2])
def test_an_export_killed_by_sigkill_is_completed_by_the_next(tmp_path: Path, crash_after: int) -> None:
    home = make_home(tmp_path, "a")
    assert loopledger("export", "--home", str(home)).returncode == 0
    add_to_home(home, advance, "a")
    add_to_home(home, populate, "b")

    killed = loopledger("export", "--home", str(home), env={"LOOPLEDGER_CRASH_AFTER_COMMITS": str(crash_after)})
    assert killed.returncode == -signal.SIGKILL

    again = loopledger("export", "--home", str(home))
    assert again.returncode == 0, again.stderr
    assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))


@pytest.mark.parametrize(("first_export", "deleted"), [(False, None), (True, "events"), (True, "validations")])
def test_an_export_killed_after_its_intent_writes_each_row_once(tmp_path: Path, first_export: bool,
                                                                deleted: str | None) -> None:
    """Killed right after its intent, before any file: the first export of a
    home (its folders are empty, but nothing was lost), or the refill of a
    deleted table folder. The next export writes each row once."""
    home = make_home(tmp_path, "a")
    if first_export:
        assert loopledger("export", "--home", str(home)).returncode == 0
        add_to_home(home, populate, "b")
    if deleted:
        shutil.rmtree(home / "traces" / deleted)

    killed = loopledger("export", "--home", str(home), env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "1"})
    assert killed.returncode == -signal.SIGKILL

    again = loopledger("export", "--home", str(home))
    assert again.returncode == 0, again.stderr
    assert loopledger("export", "--home", str(home)).returncode == 0
    assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))


def test_compact_keeps_the_rows_and_leaves_one_file_per_table(store: Any, traces: Path, journal: Journal) -> None:
    recorder = Recorder(store, traces)
    recorder.export()  # empty: every table gets its schema file
    populate(store, "a")
    recorder.export()
    advance(store, "a")
    populate(store, "b")
    recorder.export()
    advance(store, "b")
    recorder.export()
    before = {t: read_parquet(traces, t)[1] for t in CONTRACT_TABLES}
    assert len(parquet_files(traces, "events")) >= 3

    merged = recorder.compact()
    assert merged.get("events", 0) >= 3
    after = {t: read_parquet(traces, t)[1] for t in CONTRACT_TABLES}
    assert after == before
    for table in CONTRACT_TABLES:
        assert len(parquet_files(traces, table)) == 1, (table, file_names(traces)[table])
    assert_traces_equal_journal(traces, journal)

    # Compacting again has nothing to merge; exporting again adds nothing.
    assert recorder.compact() == {}
    assert recorder.export().appended == 0
    assert_traces_equal_journal(traces, journal)

    # And the cycle goes on.
    populate(store, "c")
    recorder.export()
    recorder.compact()
    assert_traces_equal_journal(traces, journal)
    for table in CONTRACT_TABLES:
        assert len(parquet_files(traces, table)) == 1, (table, file_names(traces)[table])


def test_an_interrupted_compaction_is_finished_by_the_next_export(
    store: Any, traces: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(store, traces)
    populate(store, "a")
    recorder.export()
    populate(store, "b")
    recorder.export()
    segments_before = {t: [p.name for p in recorder.segments(t)] for t in CONTRACT_TABLES}

    # The merged file is published, then the process dies before the
    # originals are removed.
    def die(self: Recorder, *args: Any, **kwargs: Any) -> None:
        raise Interrupted

    monkeypatch.setattr(Recorder, "_retire", die)
    with pytest.raises(Interrupted):
        recorder.compact()
    monkeypatch.undo()
    assert bookkeeping(journal, "compactions") == ["pending"]
    events_files = [p.name for p in parquet_files(traces, "events")]
    assert any(n.startswith("compact-") for n in events_files)
    assert set(segments_before["events"]) <= set(events_files)

    populate(store, "c")
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)
    assert set(bookkeeping(journal, "compactions")) == {"done"}
    assert not set(segments_before["events"]) & {p.name for p in parquet_files(traces, "events")}


def test_a_compaction_interrupted_before_its_merged_file_is_abandoned(
    store: Any, traces: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopledger.engine import _recorder

    recorder = Recorder(store, traces)
    populate(store, "a")
    recorder.export()
    populate(store, "b")
    recorder.export()

    original = _recorder.write_parquet

    def half_written(path: Path, *args: Any, **kwargs: Any) -> int:
        if path.name.startswith("compact-"):
            path.with_name(path.name + ".tmp").write_bytes(b"half a file")
            raise Interrupted
        return original(path, *args, **kwargs)

    monkeypatch.setattr(_recorder, "write_parquet", half_written)
    with pytest.raises(Interrupted):
        recorder.compact()
    monkeypatch.undo()

    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)
    Recorder(store, traces).compact()
    assert_traces_equal_journal(traces, journal)


def export_in_process(home: Path) -> None:
    store = SQLiteRunStore(home / "journal.sqlite")
    try:
        Recorder(store, home / "traces").export()
    finally:
        store.close()


@pytest.mark.slow
def test_export_compact_killed_at_its_commits_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path, "a")
    for prefix in ("b", "c"):
        export_in_process(home)
        add_to_home(home, populate, prefix)
    export_in_process(home)

    # Kill `export --compact` right after its n-th journal commit: each
    # table's compaction commits three times (intent, merged file published,
    # originals removed), so 1-6 cover every boundary of the first two tables.
    # Between publishing a merged file and removing the files it replaces the
    # folder holds both; the next export finishes the compaction, so the
    # check comes after it.
    for crash_after in range(1, 7):
        result = loopledger("export", "--compact", "--home", str(home),
                            env={"LOOPLEDGER_CRASH_AFTER_COMMITS": str(crash_after)})
        assert result.returncode == -signal.SIGKILL, (crash_after, result.stderr)
        add_to_home(home, populate, f"k{crash_after}")
        export_in_process(home)
        assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))

    final = loopledger("export", "--compact", "--home", str(home))
    assert final.returncode == 0, final.stderr
    assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))
    for table in CONTRACT_TABLES:
        assert len(parquet_files(home / "traces", table)) == 1, (table, file_names(home / "traces")[table])


def test_cli_export_twice_adds_no_rows(tmp_path: Path) -> None:
    home = make_home(tmp_path, "a", "b")
    first = loopledger("export", "--home", str(home))
    assert first.returncode == 0, first.stderr
    counts = assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))
    second = loopledger("export", "--home", str(home))
    assert second.returncode == 0, second.stderr
    assert assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite")) == counts
    assert "up to date" in second.stdout or "Nothing" in second.stdout
    compacted = loopledger("export", "--compact", "--home", str(home))
    assert compacted.returncode == 0, compacted.stderr
    assert assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite")) == counts


def test_compact_after_an_interrupted_export_duplicates_nothing(
    store: Any, traces: Path, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    populate(store, "a")
    Recorder(store, traces).export()
    populate(store, "b")
    original = Recorder._publish

    def publish_then_die(self: Recorder, *args: Any, **kwargs: Any) -> Any:
        def refuse() -> Any:
            raise Interrupted

        monkeypatch.setattr(self.store, "_write", refuse)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "_publish", publish_then_die)
    with pytest.raises(Interrupted):
        Recorder(store, traces).export()
    monkeypatch.undo()

    # The interrupted export's segments are merged before it is redone.
    Recorder(store, traces).compact()
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


def test_exports_from_several_processes_at_once_publish_each_row_once(store: Any, traces: Path, journal: Journal) -> None:
    populate(store, "a")
    script = (
        "import sys\n"
        "from loopledger.engine import Recorder, open_journal\n"
        "store = open_journal(sys.argv[1])\n"
        "for _ in range(5):\n"
        "    Recorder(store, sys.argv[2]).export()\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, journal.url, str(traces)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    advance(store, "a")
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


def test_an_export_seeks_the_rows_of_its_runs_instead_of_scanning_the_journal(tmp_path: Path) -> None:
    """The per-run ranges drive every append table's query, in key order:
    an export of a few runs costs their rows, not the journal's size, and a
    full export needs no sort. Read from SQLite's own query plans."""
    from loopledger.engine import SQLiteRunStore
    from loopledger.engine._sqlite import connect
    from loopledger.engine._tables import TABLES

    store = SQLiteRunStore(tmp_path / "journal.sqlite")
    store.close()
    conn = connect(tmp_path / "journal.sqlite")
    conn.execute(SQLiteRunStore.ranges_table_sql)
    by_range = [t for t in TABLES.values() if t.kind == "append" and not t.bounded]
    assert {t.name for t in by_range} >= {"events", "candidates", "validations", "loop_diagnoses"}
    for table in by_range:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + table.select_sql())]
        assert plan[0] == "SCAN x", (table.name, plan)
        assert plan[1].startswith("SEARCH t USING"), (table.name, plan)
        assert not any(step.startswith("SCAN t") for step in plan), (table.name, plan)
        assert "USE TEMP B-TREE FOR ORDER BY" not in plan, (table.name, plan)
    conn.close()


# -- one traces folder, one journal -------------------------------------------------


def test_a_traces_folder_takes_the_exports_of_one_journal_only(store: Any, traces: Path, journal: Journal,
                                                               tmp_path: Path) -> None:
    """A second journal's segment numbers would overwrite the first one's:
    its exports are refused and the first journal's traces stay whole."""
    from loopledger.engine import JournalError

    populate(store, "a")
    Recorder(store, traces).export()
    assert (traces / ".journal").read_text().split()[0] == store.journal_id()
    before = {t: read_parquet(traces, t) for t in ("runs", "events")}
    other = SQLiteRunStore(tmp_path / "other.sqlite")
    try:
        assert other.journal_id() != store.journal_id()
        populate(other, "b")
        with pytest.raises(JournalError, match="exported from another journal"):
            Recorder(other, traces).export()
        with pytest.raises(JournalError, match="exported from another journal"):
            Recorder(other, traces).claim()
    finally:
        other.close()
    assert {t: read_parquet(traces, t) for t in ("runs", "events")} == before
    assert_traces_equal_journal(traces, journal)


def exported_before_folder_ids(journal: Journal) -> None:
    """The journal as migration 0008 left one that had exported before
    folders had ids: its exports under the folder id ''."""
    conn = journal.connect()
    try:
        for table in ("exports", "export_marks"):
            conn.execute(f"UPDATE {table} SET traces_id = ''")
    finally:
        conn.close()


def test_segments_from_before_folders_named_their_journal(store: Any, traces: Path, tmp_path: Path,
                                                         journal: Journal) -> None:
    """Traces exported before the folder recorded its journal (and before
    exports were tracked per folder, migration 0008, which gave them the
    folder id ''): the journal that exported them adopts them and goes on
    from where they ended; a new journal is refused."""
    from loopledger.engine import JournalError

    populate(store, "a")
    Recorder(store, traces).export()
    (traces / ".journal").unlink()
    exported_before_folder_ids(journal)
    fresh = SQLiteRunStore(tmp_path / "fresh.sqlite")
    try:
        with pytest.raises(JournalError, match="holds exported segments but no marker"):
            Recorder(fresh, traces).claim()
    finally:
        fresh.close()
    Recorder(store, traces).claim()
    assert (traces / ".journal").read_text().split() == [store.journal_id()]
    advance(store, "a")
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


def test_a_marker_from_before_folder_ids_is_taken_where_its_exports_were(store: Any, traces: Path,
                                                                         journal: Journal) -> None:
    """Markers once held the journal's id alone; migration 0008 gave those
    folders' exports the folder id ''. Such a home goes on exporting."""
    populate(store, "a")
    Recorder(store, traces).export()
    exported_before_folder_ids(journal)
    (traces / ".journal").write_text(f"{store.journal_id()}\n")
    advance(store, "a")
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


@pytest.mark.parametrize("damage", ["not utf-8", "folder id cut off", "empty", "deleted", "folder id changed"])
def test_a_damaged_marker_is_refused_and_nothing_is_written_twice(store: Any, traces: Path, journal: Journal,
                                                                  damage: str) -> None:
    """A marker that was cut short or changed could make an export take the
    folder for one it never wrote to and publish every row again beside the
    ones there: it is refused, naming the marker and the way back (move the
    folder aside: the next export writes it whole from the journal)."""
    from loopledger.engine import JournalError

    populate(store, "a")
    Recorder(store, traces).export()
    marker = traces / ".journal"
    journal_id, folder_id = marker.read_text().split("\n")[:2]
    damaged = {"not utf-8": b"\xff\n", "folder id cut off": f"{journal_id}\n".encode(), "empty": b"",
               "deleted": None, "folder id changed": f"{journal_id}\n{'0' * 16}\n".encode()}[damage]
    if damaged is None:
        marker.unlink()
    else:
        marker.write_bytes(damaged)
    advance(store, "a")
    before = {t: read_parquet(traces, t) for t in ("runs", "events")}
    with pytest.raises(JournalError, match="move .* aside and run `loopledger export`"):
        Recorder(store, traces).export()
    assert {t: read_parquet(traces, t) for t in ("runs", "events")} == before
    shutil.move(traces, traces.with_name("traces.damaged"))
    Recorder(store, traces).export()
    assert_traces_equal_journal(traces, journal)


def test_every_traces_folder_of_a_shared_journal_gets_every_row(store: Any, journal: Journal,
                                                                tmp_path: Path) -> None:
    """Several data directories may share one journal (--store): each
    folder's exports are tracked apart, so each gets every row once, and
    a folder made anew (say, after its traces were deleted) is filled from
    the start."""
    first, second = tmp_path / "first" / "traces", tmp_path / "second" / "traces"
    populate(store, "a")
    Recorder(store, first).export()
    advance(store, "a")
    Recorder(store, second).export()
    populate(store, "b")
    Recorder(store, first).export()
    Recorder(store, second).export()
    for traces in (first, second):
        assert_traces_equal_journal(traces, journal)
    assert (first / ".journal").read_text().split()[1] != (second / ".journal").read_text().split()[1]
    shutil.rmtree(first)
    Recorder(store, first).export()
    assert_traces_equal_journal(first, journal)


def test_compact_names_a_segment_it_cannot_read_and_keeps_the_files(tmp_path: Path) -> None:
    home = make_home(tmp_path, "a")
    assert loopledger("export", "--home", str(home)).returncode == 0
    add_to_home(home, populate, "b")
    assert loopledger("export", "--home", str(home)).returncode == 0
    segments = sorted((home / "traces" / "events").glob("seg-*.parquet"))
    assert len(segments) >= 2
    data = bytearray(segments[0].read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer):  # the pages broken, the footer whole
        data[i] = (data[i] * 7 + 13) % 256
    segments[0].write_bytes(bytes(data))

    done = loopledger("export", "--compact", "--home", str(home))
    assert done.returncode == 3, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and segments[0].name in lines[0] and "not a readable Parquet file" in lines[0]
    assert sorted((home / "traces" / "events").glob("*.parquet")) == segments


@pytest.mark.parametrize("url", [None, 3, b"sqlite:journal.sqlite", Path("journal.sqlite")])
def test_open_journal_refuses_what_is_not_a_store_url(url: Any) -> None:
    from loopledger.engine import BadInput

    with pytest.raises(BadInput, match=r"^url: expected a store URL string") as caught:
        open_journal(url)
    assert caught.value.where == "url"


def test_a_recorder_refuses_what_is_not_a_journal_or_a_folder_before_touching_anything(tmp_path: Path) -> None:
    from loopledger.engine import BadInput

    store = SQLiteRunStore(tmp_path / "journal.sqlite")
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    traces = tmp_path / "traces"
    try:
        for given_store, folder, where in ((None, traces, "store"), (f"sqlite:{tmp_path}/j", traces, "store"),
                                           (store, 5, "traces_dir"), (store, None, "traces_dir"),
                                           (store, "", "traces_dir"), (store, a_file, "traces_dir")):
            with pytest.raises(BadInput) as caught:
                Recorder(given_store, folder).export()
            assert caught.value.where == where, str(caught.value)
        assert not traces.exists() and a_file.read_text() == "kept"
        Recorder(store, str(traces)).export()  # a str is a path too
        assert (traces / "runs").is_dir()
    finally:
        store.close()


# -- repair: unreadable trace files written again from the journal ----------------------


def break_file(path: Path, *, footer: bool) -> None:
    """Damage a Parquet file as a bad copy or disk would: cut it short
    (``footer``), or scramble its pages and keep the footer whole."""
    data = bytearray(path.read_bytes())
    if footer:
        path.write_bytes(bytes(data[: len(data) // 2]))
        return
    kept = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - kept):
        data[i] = (data[i] * 7 + 13) % 256
    path.write_bytes(bytes(data))


def exported(store: Any, traces: Path, *prefixes: str) -> Recorder:
    """A recorder on ``traces`` after one export per prefix, each of a new
    ``populate``."""
    recorder = Recorder(store, traces)
    for prefix in prefixes:
        populate(store, prefix)
        recorder.export()
    return recorder


def import_events_copy(recorder: Recorder, traces: Path) -> None:
    """Publish a copy of the first events file as an imported run's rows."""
    events = pq.read_table(parquet_files(traces, "events")[0]).replace_schema_metadata(None)
    imported = events.set_column(0, events.schema.field(0), pa.array(["imp-run"] * events.num_rows))
    assert recorder.publish_import(lambda known: {"events": imported}) == {"events": events.num_rows}


def test_repair_writes_unreadable_segments_and_snapshots_again_from_the_journal(
        store: Any, traces: Path, journal: Journal) -> None:
    recorder = exported(store, traces, "a")
    advance(store, "a")
    populate(store, "b")
    recorder.export()
    assert recorder.repair().rewritten == []
    counts = assert_traces_equal_journal(traces, journal)
    first, second = sorted((traces / "events").glob("seg-*.parquet"))
    break_file(first, footer=True)
    break_file(second, footer=False)
    break_file(traces / "runs" / "runs.parquet", footer=True)
    break_file(traces / "operations" / "operations.parquet", footer=False)
    assert recorder.export().export_id is None, "an export alone reads no file: it finds nothing new"

    result = recorder.repair()
    assert sorted(result.rewritten) == sorted(["events/" + first.name, "events/" + second.name, "runs/runs.parquet",
                                               "operations/operations.parquet"])
    assert result.left == [] and result.checked == sum(len(parquet_files(traces, t)) for t in CONTRACT_TABLES)
    assert assert_traces_equal_journal(traces, journal) == counts
    # Nothing is left to do, and the exports after it go on from the same marks.
    assert recorder.repair().rewritten == []
    populate(store, "c")
    assert recorder.export().appended > 0
    assert_traces_equal_journal(traces, journal)


def test_repair_writes_a_compacted_file_again_as_the_segments_it_merged(
        store: Any, traces: Path, journal: Journal) -> None:
    recorder = exported(store, traces, "a", "b")
    recorder.compact()
    populate(store, "c")
    recorder.export()
    recorder.compact()  # a compaction of a compaction and a segment
    (merged,) = parquet_files(traces, "validations")
    assert merged.name.startswith("compact-")
    counts = assert_traces_equal_journal(traces, journal)
    break_file(merged, footer=True)

    result = recorder.repair()
    assert result.rewritten == ["validations/" + merged.name] and result.left == []
    assert not merged.exists()
    assert sorted(p.name for p in parquet_files(traces, "validations")) == [
        "seg-00000001.parquet", "seg-00000002.parquet", "seg-00000003.parquet"]
    assert assert_traces_equal_journal(traces, journal) == counts
    # The segments merged again, repair finds nothing to do and writes no row twice.
    recorder.compact()
    assert recorder.repair().rewritten == []
    assert assert_traces_equal_journal(traces, journal) == counts


def test_repair_names_the_imported_rows_it_cannot_write_again(tmp_path: Path) -> None:
    """Imported runs were never in the journal: a damaged file of theirs is
    named with what to do (exit 3), and every other file is still checked
    and written again."""
    home = make_home(tmp_path, "a")
    assert loopledger("export", "--home", str(home)).returncode == 0
    store = SQLiteRunStore(home / "journal.sqlite")
    try:
        import_events_copy(Recorder(store, home / "traces"), home / "traces")
    finally:
        store.close()
    (imp,) = (home / "traces" / "events").glob("imp-*.parquet")
    (seg,) = (home / "traces" / "events").glob("seg-*.parquet")
    break_file(imp, footer=True)
    break_file(seg, footer=True)

    done = loopledger("export", "--repair", "--home", str(home))
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "written again from the journal: events/" + seg.name in done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"loopledger: events/{imp.name}: not readable (") and "import those runs again" in line
    assert pq.read_table(seg).num_rows > 0
    assert imp.exists(), "what cannot be written again is left where it is"


def test_a_replay_of_a_damaged_segment_says_how_to_write_it_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "happy-refund.yaml"
    assert loopledger("run", str(scenario), "--home", str(home)).returncode == 0
    (seg,) = (home / "traces" / "events").glob("seg-*.parquet")
    break_file(seg, footer=False)

    refused = loopledger("replay", "--suite", "default", "--home", str(home))
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert str(seg) in refused.stderr
    assert f"`loopledger export --repair --home {home}` writes it again from the journal" in refused.stderr
    # A copy of the folder has no journal beside it: the hint says where the repair runs.
    copy = tmp_path / "copy" / "traces"
    shutil.copytree(home / "traces", copy)
    with pytest.raises(TracesError) as caught:
        replay(copy, "default", workers=1)
    assert "on the journal that exported this folder" in str(caught.value)
    assert "no journal.sqlite is beside the folder" in str(caught.value) and f"--home {home}" not in str(caught.value)
    repaired = loopledger("export", "--repair", "--home", str(home))
    assert repaired.returncode == 0, repaired.stderr
    assert "written again from the journal: events/" + seg.name in repaired.stdout
    assert loopledger("replay", "--suite", "default", "--home", str(home)).returncode == 0
    assert_traces_equal_journal(home / "traces", Journal("sqlite", home / "journal.sqlite"))


def test_repair_leaves_a_compacted_file_that_merged_imported_rows(store: Any, traces: Path, journal: Journal) -> None:
    recorder = exported(store, traces, "a")
    import_events_copy(recorder, traces)
    recorder.compact()
    (merged,) = parquet_files(traces, "events")
    break_file(merged, footer=True)
    (left_alone,) = parquet_files(traces, "validations")

    result = recorder.repair()
    assert result.rewritten == []
    ((where, why),) = result.left
    assert where == "events/" + merged.name
    assert "imp-00000001.parquet" in why and "move it aside" in why
    assert parquet_files(traces, "events") == [merged] and parquet_files(traces, "validations") == [left_alone]


def test_repair_writes_the_journal_rows_of_a_compacted_file_that_is_gone(
        store: Any, traces: Path, journal: Journal) -> None:
    """Moved aside as the message for a damaged file with imported rows
    says: its journal rows come back, its imported ones are named as lost,
    and nothing comes back twice after the next compaction."""
    recorder = exported(store, traces, "a")
    import_events_copy(recorder, traces)
    populate(store, "b")
    recorder.export()
    recorder.compact()
    populate(store, "b2")
    recorder.export()
    (merged,) = [p for p in parquet_files(traces, "events") if p.name.startswith("compact-")]
    merged.rename(traces / "aside.bin")

    result = recorder.repair()
    assert result.rewritten == [f"events/{merged.name} (gone: its journal rows)"]
    ((where, why),) = result.left
    assert where == "events/" + merged.name and "imp-00000001.parquet" in why and "import those runs again" in why
    assert_traces_equal_journal(traces, journal)
    assert recorder.repair().rewritten == [] and recorder.repair().left == []
    recorder.compact()
    populate(store, "c")
    recorder.export()
    assert recorder.repair().rewritten == []
    assert_traces_equal_journal(traces, journal)


def test_a_table_folder_deleted_after_a_compaction_is_written_once(
        store: Any, traces: Path, journal: Journal) -> None:
    """Its rows come back with the next export, and a repair after it finds
    nothing to bring back (the compaction's record went with its file)."""
    import shutil

    recorder = exported(store, traces, "a", "b")
    recorder.compact()
    shutil.rmtree(traces / "events")
    assert recorder.export().refilled == ("events",)
    result = recorder.repair()
    assert result.rewritten == [] and result.left == []
    assert_traces_equal_journal(traces, journal)
