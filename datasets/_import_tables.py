"""Imported runs → rows of the trace tables, without the journal.

An imported run is over before it is imported: nothing resumes it, waits on
it or finalises it, so it has no use for the journal, whose job is to make a
live run's next step durable before the engine takes it. The importer
therefore writes the trace tables themselves (the recorder publishes them
as the import's own segments, ``traces/<table>/imp-<id>.parquet``).

:class:`TraceRows` is the store the :class:`~._import_writer.RunWriter`
commits to. It applies the journal's commit rules in memory (compare-and-set
on ``state_version``, moves checked against ``ALLOWED``, contiguous ``seq``,
artifacts stored once per content id, operations recorded then updated,
run counters) and keeps, for each table, exactly the rows that committing
the same commits to the journal and exporting them would give. A test holds
the two paths equal on real traces (tests/datasets/test_import_tables.py).

Times: each call may say when it happened (``at``, the source's time,
microseconds since the epoch); without it, the import's clock (the engine's,
so ``LOOPLEDGER_NOW`` pins it) stamps the rows, as the journal's does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Container, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from loopledger.canonical import canonical_json
from loopledger.engine import Artifact, Commit, CommitResult, NewEvent, NewRun, State
from loopledger.engine._clock import now_us
from loopledger.engine._errors import StaleStateVersion, TerminalAlreadySet, TransitionNotAllowed, UnknownRun
from loopledger.engine._records import FACT_COLUMNS, OPERATION_COLUMNS, SCHEMA_VERSION
from loopledger.engine._states import ALLOWED, INITIAL, TERMINAL
from loopledger.engine._store import _check_commit_shape as check_commit_shape
from loopledger.engine._store import _column_value as column_value
from loopledger.engine._tables import TABLES, arrow_batch

#: Column defaults for columns a commit leaves out: the journal's, except
#: usage and price, which an import leaves out when its source does not give
#: them. The journal, whose runs always know them, stores 0 there; an import
#: stores null (unknown), which sums and means pass over.
DEFAULTS: Mapping[str, Any] = {"dispatch_count": 0}
#: Each fact table's columns, and whether the journal stores the column as canonical JSON.
_FACT_TABLE_COLUMNS = {name: tuple((c, c.endswith("_json")) for c in TABLES[name].column_names)
                       for name in FACT_COLUMNS}
_RUN_COLUMNS = tuple(TABLES["runs"].column_names)
_OPERATION_COLUMNS = tuple(TABLES["operations"].column_names)
#: An empty mapping, the default of a commit's mappings.
_NONE: Mapping[str, Any] = MappingProxyType({})


def _wall_us() -> int:
    return time.time_ns() // 1000


class TraceRows:
    """Trace-table rows of the runs committed to it (see the module doc).

    ``known_artifacts``: ids the trace tables already hold; such artifacts
    are not written again, as the journal would not store them twice."""

    def __init__(self, known_artifacts: Container[str] = frozenset()) -> None:
        self.known_artifacts = known_artifacts
        self.stored: set[str] = set()
        self.events: list[tuple[Any, ...]] = []
        self.artifacts: list[tuple[Any, ...]] = []
        self.facts: dict[str, list[tuple[Any, ...]]] = {name: [] for name in FACT_COLUMNS}
        self.labels: list[tuple[Any, ...]] = []
        self.runs: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self._state: dict[str, State] = {}
        # The engine's clock, read without its per-call check of LOOPLEDGER_NOW unless that is set.
        self._now: Callable[[], int] = now_us if os.environ.get("LOOPLEDGER_NOW") else _wall_us

    # -- the store's calls ------------------------------------------------------

    def create_run(self, new: NewRun, at: int | None = None) -> None:
        if new.run_id in self.runs:
            raise ValueError(f"run {new.run_id} is already recorded")
        now = self._now() if at is None else at
        self.runs[new.run_id] = {
            "run_id": new.run_id, "thread_id": new.thread_id or new.run_id, "task_id": new.task_id,
            "tenant": new.tenant, "prompt_version": new.prompt_version, "prompt_hash": new.prompt_hash,
            "model_route": new.model_route, "status": INITIAL.value, "reason": None, "started_at": now,
            "ended_at": None, "steps": 0, "attempt": 0, "model_attempts": 0, "tool_calls": 0, "tokens_in": None,
            "tokens_out": None, "cost_usd": None, "reward": None, "state_version": 1, "last_seq": 1,
            "waiting_json": None, "spec_json": canonical_json(dict(new.spec)), "schema_version": SCHEMA_VERSION,
        }
        self._state[new.run_id] = INITIAL
        self.events.append((new.run_id, 1, now, "run_created", None, INITIAL.value, 0, 0, 1, "{}", SCHEMA_VERSION))
        self._store(new.artifacts, new.run_id, now)

    def commit(self, c: Commit) -> CommitResult:
        check_commit_shape(c)
        run = self.runs.get(c.run_id)
        first = run["last_seq"] + 1 if run is not None else 0
        version = self.append(c.run_id, c.expected_version, c.to_state, c.step, c.attempt, c.payload, c.events,
                              c.artifacts, c.facts, c.new_operations, c.operation_updates, c.counters, c.set_fields)
        return CommitResult(c.run_id, self._state[c.run_id], version, first, self.runs[c.run_id]["last_seq"])

    def append(self, run_id: str, expected_version: int, target: State | None, step: int | None,
               attempt: int | None, payload: Mapping[str, Any], events: Iterable[NewEvent],
               artifacts: Iterable[Artifact] = (), facts: Mapping[str, Iterable[Mapping[str, Any]]] = _NONE,
               new_operations: Iterable[Mapping[str, Any]] = (),
               operation_updates: Iterable[Mapping[str, Any]] = (), counters: Mapping[str, float] = _NONE,
               set_fields: Mapping[str, Any] = _NONE, at: int | None = None) -> int:
        """:meth:`commit` of a commit with these fields, without making the
        :class:`Commit` or checking its shape: the importer's writer commits
        through here (its commits have fixed shapes, which the journal path
        of the tests checks with the journal's own rules), at the time
        ``at``. Returns the run's new ``state_version``."""
        run = self.runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        state = self._state[run_id]
        if state in TERMINAL:
            # The journal keeps such commits as late events; an importer never makes one.
            raise TerminalAlreadySet(run_id, state.value, target.value if target else None)
        version = run["state_version"]
        if expected_version != version:
            raise StaleStateVersion(run_id, expected_version, version)
        if target is not None and target not in ALLOWED[state]:
            raise TransitionNotAllowed(run_id, state.value, target.value)
        final = target or state
        now = self._now() if at is None else at
        new_version = version + 1
        if step is None:
            step = run["steps"]
        if attempt is None:
            attempt = run["attempt"]
        seq = run["last_seq"]
        rows = self.events
        if target is not None:
            seq += 1
            rows.append((run_id, seq, now, "transition", state._value_, target._value_, step, attempt,
                         new_version, canonical_json(payload), SCHEMA_VERSION))
        for event in events:
            seq += 1
            rows.append((run_id, seq, now, event.kind, final._value_, None, step, attempt, new_version,
                         canonical_json(event.payload), SCHEMA_VERSION))
        if artifacts:
            self._store(artifacts, run_id, now)
        for table, table_rows in facts.items():
            out = self.facts[table]
            for row in table_rows:
                values = {**row, "run_id": run_id, "seq": seq, "schema_version": SCHEMA_VERSION}
                out.append(tuple((column_value(values, name) if is_json else values[name]) if name in values
                                 else DEFAULTS.get(name) for name, is_json in _FACT_TABLE_COLUMNS[table]))
        for op in new_operations:
            self._new_operation(run_id, seq, op)
        for update in operation_updates:
            self._update_operation(run_id, seq, update)
        run.update(status=final._value_, state_version=new_version, last_seq=seq, steps=step, attempt=attempt)
        for name, amount in counters.items():
            run[name] = amount if run[name] is None else run[name] + amount
        for name in set_fields:
            run[name] = column_value(set_fields, name)
        if final in TERMINAL:
            run["ended_at"] = now
        self._state[run_id] = final
        return new_version

    def add_label(self, label: Mapping[str, Any], at: int | None = None) -> None:
        # label_id numbers the journal's labels; an imported label has none.
        self.labels.append((None, label["run_id"], int(label["step"]), int(label["attempt"]), label["candidate_id"],
                            label.get("validator") or "", label["expected_verdict"], label["source"],
                            label.get("note") or "", self._now() if at is None else at, SCHEMA_VERSION))

    # -- helpers ------------------------------------------------------------------

    def _store(self, artifacts: Iterable[Artifact], run_id: str, now: int) -> None:
        for a in artifacts:
            if a.artifact_id in self.stored or a.artifact_id in self.known_artifacts:
                continue
            self.stored.add(a.artifact_id)
            self.artifacts.append((a.artifact_id, run_id, a.kind, now, a.size_bytes, a.canonical, SCHEMA_VERSION))

    def _new_operation(self, run_id: str, seq: int, op: Mapping[str, Any]) -> None:
        existing = self.operations.get(op["operation_id"])
        row = {name: column_value(op, name) if name in op else DEFAULTS.get(name) for name in OPERATION_COLUMNS}
        row["run_id"] = run_id
        if existing is not None:
            if any(existing[k] != row[k] for k in ("run_id", "tool", "tool_version", "canonical_args_json")):
                raise ValueError(f"operation {op['operation_id']}: recorded again with different content")
            return
        row.update(created_seq=seq, updated_seq=seq, schema_version=SCHEMA_VERSION)
        self.operations[op["operation_id"]] = row

    def _update_operation(self, run_id: str, seq: int, update: Mapping[str, Any]) -> None:
        row = self.operations.get(update["operation_id"])
        if row is None or row["run_id"] != run_id:
            raise ValueError(f"operation {update['operation_id']}: no such operation in run {run_id}")
        for name, value in update.items():
            if name != "operation_id":
                row[name] = value
        row["updated_seq"] = seq

    # -- the tables -----------------------------------------------------------------

    def tables(self) -> dict[str, Any]:
        """Each trace table's new rows as a pyarrow Table (every table, maybe empty),
        in the recorder's row order."""
        import pyarrow as pa

        runs = sorted(self.runs.values(), key=lambda r: (r["started_at"], r["run_id"]))
        ops = sorted(self.operations.values(), key=lambda o: (o["run_id"], o["created_seq"], o["operation_id"]))
        rows: dict[str, list[tuple[Any, ...]]] = {
            "runs": [tuple(r[name] for name in _RUN_COLUMNS) for r in runs],
            "events": self.events,
            "artifacts": self.artifacts,
            "operations": [tuple(o[name] for name in _OPERATION_COLUMNS) for o in ops],
            "labels": self.labels,
            **self.facts,
        }
        out = {}
        for name, table in TABLES.items():
            columns = list(zip(*rows[name])) if rows[name] else [()] * len(table.columns)
            out[name] = pa.Table.from_batches([arrow_batch(name, columns)])
        return out


def concat_tables(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The tables of several ``TraceRows`` (of different runs, in order) as one
    ``TraceRows`` holding all those runs would have made them: an artifact
    that more than one stored is kept where it came first, and the snapshot
    tables are in the recorder's order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {name: pa.concat_tables([p[name] for p in parts]) for name in TABLES}
    seen: Any = None
    kept = []
    for part in parts:
        artifacts = part["artifacts"]
        ids = artifacts.column("artifact_id")
        if seen is not None:
            artifacts = artifacts.filter(pc.invert(pc.is_in(ids, value_set=seen)))
        seen = ids.combine_chunks() if seen is None else pa.concat_arrays([seen, ids.combine_chunks()])
        kept.append(artifacts)
    out["artifacts"] = pa.concat_tables(kept)
    out["runs"] = out["runs"].sort_by([("started_at", "ascending"), ("run_id", "ascending")])
    out["operations"] = out["operations"].sort_by(
        [("run_id", "ascending"), ("created_seq", "ascending"), ("operation_id", "ascending")])
    return out


def save_tables(tables: Mapping[str, Any], folder: str) -> None:
    """Each table as an Arrow IPC file in ``folder`` (made here), for
    :func:`load_tables` in another process."""
    import pyarrow as pa

    os.mkdir(folder)
    for name, table in tables.items():
        with pa.OSFile(os.path.join(folder, name), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)


def load_tables(folder: str) -> dict[str, Any]:
    """The tables :func:`save_tables` wrote, memory-mapped (the files may be
    removed once this returns)."""
    import pyarrow as pa

    return {name: pa.ipc.open_file(pa.memory_map(os.path.join(folder, name))).read_all() for name in TABLES}
