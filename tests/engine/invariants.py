"""The CONTRACT's hard rules, checked on every run of a data directory.

Used by the scenario, wait and crash tests: whatever happened to a run, its
journal and its Parquet traces must satisfy these. The journal is the
home's SQLite file, or the PostgreSQL database ``store_url`` names.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "CANCEL_UNKNOWN", "BUDGET_EXHAUSTED", "POLICY_STOPPED", "EXPIRED"}
RESULT_OUTCOMES = {
    "success", "validation_failed", "permission_denied", "approval_required", "timeout", "cancelled",
    "background_accepted", "unknown_outcome", "unknown_or_disabled_tool",
}


def _journal(home: Path, store_url: str | None) -> Any:
    if store_url is not None and store_url.startswith("sqlite:"):
        return sqlite3.connect(store_url.removeprefix("sqlite:"))
    if store_url is not None:
        from journal_kit import raw_connection

        return raw_connection("postgresql", store_url)
    return sqlite3.connect(home / "journal.sqlite")


def journal_violations(home: Path, store_url: str | None = None) -> list[str]:
    """Every breach of the hard rules in the journal, as readable lines."""
    conn = _journal(home, store_url)
    found: list[str] = []
    runs = {row[0]: row[1:] for row in conn.execute("SELECT run_id, state, last_seq FROM runs")}
    events: dict[str, list[tuple]] = defaultdict(list)
    for row in conn.execute(
        "SELECT run_id, seq, kind, from_state, to_state, payload_json FROM events ORDER BY run_id, seq"
    ):
        events[row[0]].append(row[1:])
    for run_id, (state, last_seq) in runs.items():
        seqs = [e[0] for e in events[run_id]]
        if seqs != list(range(1, len(seqs) + 1)) or seqs[-1] != last_seq:
            found.append(f"{run_id}: seq not contiguous from 1 to last_seq ({seqs[:5]}..., last_seq {last_seq})")
        terminal_moves = [e for e in events[run_id] if e[1] == "transition" and e[3] in TERMINAL]
        if state in TERMINAL:
            if len(terminal_moves) != 1:
                found.append(f"{run_id}: {len(terminal_moves)} terminal transitions")
            elif terminal_moves[0][2] != "FINALIZING" or terminal_moves[0][3] != state:
                found.append(f"{run_id}: terminal {state} entered from {terminal_moves[0][2]}")
            after = [e for e in events[run_id] if e[0] > terminal_moves[0][0] and e[1] != "late_event"] if terminal_moves else []
            if after:
                found.append(f"{run_id}: events after the terminal one that are not late_event: {after[:2]}")
        elif terminal_moves:
            found.append(f"{run_id}: is {state} but has a terminal transition")
        # Retries reuse the context: every attempt of a step has the step's context.
        contexts = defaultdict(set)
        for step, context in conn.execute(
            "SELECT step, context_artifact_id FROM candidates WHERE run_id = ?", (run_id,)
        ):
            contexts[step].add(context)
        for step, ids in contexts.items():
            if len(ids) != 1:
                found.append(f"{run_id}: step {step} attempts used {len(ids)} context artifacts")
        # A candidate's event carries the step and attempt of its candidate row.
        rows = {cid: (step, attempt) for cid, step, attempt in conn.execute(
            "SELECT candidate_id, step, attempt FROM candidates WHERE run_id = ?", (run_id,))}
        for cid, step, attempt in conn.execute(
            "SELECT json_extract(payload_json, '$.candidate_id'), step, attempt FROM events "
            "WHERE run_id = ? AND kind = 'candidate_recorded'", (run_id,)
        ) if store_url is None else ():
            if rows.get(cid) != (step, attempt):
                found.append(f"{run_id}: candidate {cid[:12]} recorded at step/attempt {(step, attempt)}, "
                             f"its row says {rows.get(cid)}")
        # A step is closed once (the loop detectors' step table reads these).
        closed = Counter(json.loads(e[4])["step"] for e in events[run_id] if e[1] == "step_closed")
        for step, times in closed.items():
            if times > 1:
                found.append(f"{run_id}: step {step} closed {times} times")
        # One terminal result per tool request.
        results = Counter(json.loads(e[4])["operation_id"] for e in events[run_id] if e[1] == "operation_result")
        said = {p["operation_id"]: p["outcome"] for p in (json.loads(e[4]) for e in events[run_id]
                                                           if e[1] == "operation_result")}
        for op_id, outcome in conn.execute("SELECT operation_id, outcome FROM operations WHERE run_id = ?", (run_id,)):
            # The table holds the request's result as its event says it, and
            # none before it (but approval_required while a person decides).
            waits_for_approval = outcome == "approval_required" and state == "WAITING_USER"
            if said.get(op_id) != outcome and not (op_id not in said and waits_for_approval):
                found.append(f"{run_id}: operation {op_id} outcome {outcome!r} in the table, "
                             f"{said.get(op_id)!r} in its result event")
            if results[op_id] > 1:
                found.append(f"{run_id}: operation {op_id} has {results[op_id]} terminal results")
            if outcome is not None and outcome not in RESULT_OUTCOMES:
                found.append(f"{run_id}: operation {op_id} outcome {outcome!r} is not in the taxonomy")
            if state in TERMINAL and results[op_id] != 1 and not _ended_in_flight(events[run_id], op_id, state):
                found.append(f"{run_id}: ended {state} but operation {op_id} has {results[op_id]} results")
        # ... and every tool call a model proposed is a request: each has its
        # operation (the calls that were never sent included), once; a run
        # that waits has decided each of its candidates too.
        if state in TERMINAL or state in ("WAITING_USER", "WAITING_TOOL"):
            proposed = Counter(
                (step, item.get("call_id"))
                for step, items in conn.execute("SELECT step, items_json FROM candidates WHERE run_id = ?", (run_id,))
                for item in (json.loads(items) if isinstance(items, str) else items) if item.get("type") == "tool_call")
            recorded = Counter(tuple(row) for row in conn.execute(
                "SELECT step, call_id FROM operations WHERE run_id = ?", (run_id,)))
            if proposed != recorded:
                found.append(f"{run_id}: ended {state} with tool calls proposed {sorted(proposed.items())} but "
                             f"operations {sorted(recorded.items())} (by step and call id)")
    return found


def _ended_in_flight(events: list[tuple], op_id: str, state: str) -> bool:
    """A run may end with a send whose outcome nobody could confirm only as CANCEL_UNKNOWN."""
    return state == "CANCEL_UNKNOWN"


def side_effect_violations(home: Path) -> list[str]:
    conn = sqlite3.connect(home / "demo_backend.sqlite")
    twice = conn.execute(
        "SELECT idempotency_key, tool, COUNT(*) FROM executions GROUP BY idempotency_key HAVING COUNT(*) > 1"
    ).fetchall()
    return [f"side effect {tool} executed {n} times for key {key}" for key, tool, n in twice]


def parquet_violations(home: Path, store_url: str | None = None) -> list[str]:
    """The exported traces hold exactly the journal's events, runs and candidates."""
    conn = _journal(home, store_url)
    found = []
    for table, key in (("events", ("run_id", "seq")), ("candidates", ("run_id", "step", "attempt")),
                       ("runs", ("run_id",))):
        journal = {tuple(row) for row in conn.execute(f"SELECT {', '.join(key)} FROM {table}").fetchall()}
        data = ds.dataset(home / "traces" / table, format="parquet").to_table(columns=list(key)).to_pylist()
        parquet = [tuple(row[k] for k in key) for row in data]
        if len(parquet) != len(set(parquet)):
            found.append(f"{table}: duplicate rows in Parquet")
        if set(parquet) != journal:
            found.append(f"{table}: Parquet has {len(set(parquet))} keys, journal {len(journal)}")
    return found


def all_violations(home: Path, store_url: str | None = None) -> list[str]:
    return (journal_violations(home, store_url) + side_effect_violations(home)
            + parquet_violations(home, store_url))
