"""The run store: the journal's one contract and its shared SQL logic.

``RunStore`` is the protocol the engine, the recorder and the commands use.
``SQLRunStore`` holds everything the SQL dialects share; a dialect (SQLite,
PostgreSQL) overrides only small hooks: connecting, beginning a write or a
read transaction, locking a run row, the parameter placeholder, streaming a
long result, and telling a transient abort from other errors.

The heart is :meth:`SQLRunStore.commit`, of one commit or of a chain of one
run's commits. In one transaction it

1. takes the run's head (the one it remembers, else the row, read under the
   write lock),
2. keeps the commits as ``late_event`` rows if the run is already terminal
   (and raises ``TerminalAlreadySet``: whoever made them must not act on them),
3. else checks each commit's ``expected_version`` and move against
   ``ALLOWED``, before anything is written,
4. advances the run row: state, ``state_version`` (+1 per commit),
   ``last_seq``, counters; guarded by the first expected version, this
   update is the compare-and-set,
5. appends events with seq ``last_seq + 1 ...``, stores new artifacts (once
   per content id), facts and operations.

A commit that is refused writes nothing (except the late-event case, which
is the point of it). ``public()`` owns the transaction; ``_x_txn(conn)`` does
the work inside it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from operator import itemgetter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from loopledger.canonical import canonical_json

from . import _faults
from ._clock import now_us
from ._errors import (
    CommitRejected,
    SchemaVersionError,
    StaleStateVersion,
    TerminalAlreadySet,
    TransitionNotAllowed,
    UnknownRun,
)
from ._records import (
    FACT_COLUMNS,
    OPERATION_COLUMNS,
    OPERATION_MUTABLE,
    RUN_COUNTERS,
    RUN_SETTABLE,
    SCHEMA_VERSION,
    Artifact,
    Commit,
    CommitResult,
    EventRecord,
    NewEvent,
    NewRun,
    RunRecord,
)
from ._states import ALLOWED, INITIAL, TERMINAL, State

_T = TypeVar("_T")

_EVENTS_INSERT = ("INSERT INTO events (run_id, seq, ts, kind, from_state, to_state, step, attempt,"
                  " state_version, payload_json, schema_version)")
_EVENT_WIDTH = 11
#: Rows per multi-row INSERT statement (well within SQLite's parameter limit).
ROWS_PER_INSERT = 50
_STATEMENTS = {
    "insert_event": _EVENTS_INSERT + " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "insert_artifact": "INSERT INTO artifacts (artifact_id, kind, created_at, size_bytes, body,"
    " first_run_id, first_seq, schema_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (artifact_id) DO NOTHING",
}

RUN_FIELDS = tuple(RunRecord.__dataclass_fields__)
#: The run row joined with its spec, as RunRecord reads it.
_RUN_SELECT = (
    "SELECT " + ", ".join("s.spec_json" if f == "spec_json" else f"r.{f}" for f in RUN_FIELDS)
    + " FROM runs r JOIN run_specs s ON s.run_id = r.run_id"
)

#: Per fact table: its columns as a set, a getter of all of them in order,
#: and the positions of the columns stored as canonical JSON.
_FACT_SETS = {table: frozenset(columns) for table, columns in FACT_COLUMNS.items()}
_FACT_GETTERS = {table: itemgetter(*columns) for table, columns in FACT_COLUMNS.items()}
_FACT_JSON_AT = {table: tuple(i for i, c in enumerate(columns) if c.endswith("_json"))
                 for table, columns in FACT_COLUMNS.items()}
_OPERATION_SET = frozenset(OPERATION_COLUMNS)
_OPERATION_REQUIRED = frozenset(
    {"operation_id", "idempotency_key", "tool", "canonical_args_json", "policy_decision", "status", "step"})

#: The transition table and the terminal states by state name: the hot path
#: looks states up by their (cached-hash) string, not by the enum member.
_ALLOWED_NAMES = {source._value_: frozenset(t._value_ for t in targets) for source, targets in ALLOWED.items()}
_TERMINAL_NAMES = frozenset(s._value_ for s in TERMINAL)

#: Refusals that ``_commit_txn`` raises only before its first write.
_REFUSED_BEFORE_WRITING = (StaleStateVersion, TransitionNotAllowed, UnknownRun)

#: How often a transaction that the server aborted to break a conflict with
#: another transaction (see ``SQLRunStore._is_transient``) is redone before
#: the error is handed on.
TRANSIENT_RETRIES = 5

#: How often a claim on a run another process drives is tried again (``SQLRunStore.claim``).
CLAIM_POLL_S = 0.05


def claim_key(name: str) -> int:
    """The 63-bit key of what is claimed (a run id, or a batch's name, see
    ``_batch_name``) among the claims of one journal's processes."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1


def _batch_name(batch_id: str) -> str:
    """A batch's name among the claims, apart from every run id (which
    cannot hold a space)."""
    return f"batch {batch_id}"


def _watch_name(run_id: str) -> str:
    """A watch's name among the claims, apart from run ids and batches."""
    return f"watch {run_id}"


#: Runs whose head a store remembers (see ``SQLRunStore._remember_head``).
MAX_HEADS = 100_000
EVENT_FIELDS = tuple(EventRecord.__dataclass_fields__)


class OperationConflict(CommitRejected):
    """An operation with this idempotency key (or id) is already recorded with
    different content: the caller's history is not the journal's."""

    code = "operation_conflict"

    def __init__(self, run_id: str, key: str, reason: str) -> None:
        super().__init__(run_id, f"run {run_id}: operation {key}: {reason}")
        self.key = key
        self.reason = reason


@runtime_checkable
class RunStore(Protocol):
    """The journal. Synchronous by design: one contract, not a sync and an
    async twin of every method."""

    def create_run(self, new: NewRun) -> RunRecord: ...

    def commit(self, commit: Commit, *then: Commit) -> CommitResult: ...

    def append_at_head(self, run_id: str, events: Sequence[NewEvent]) -> CommitResult: ...

    def get_run(self, run_id: str) -> RunRecord: ...

    def list_runs(self, states: Iterable[State] | None = None) -> list[RunRecord]: ...

    def events(self, run_id: str, after_seq: int = 0) -> list[EventRecord]: ...

    def get_artifact(self, artifact_id: str) -> Any: ...

    def facts(self, table: str, run_id: str) -> list[dict[str, Any]]: ...

    def operations(self, run_id: str) -> list[dict[str, Any]]: ...

    def add_label(self, label: Mapping[str, Any]) -> int: ...

    def labels(self, run_id: str) -> list[dict[str, Any]]: ...

    def run_ids(self) -> set[str]: ...

    def journal_id(self) -> str: ...

    def batch(self) -> AbstractContextManager[None]: ...

    def claim(self, run_id: str, wait_s: float = 0.0) -> bool: ...

    def hold_batch(self, batch_id: str) -> None: ...

    def batch_held_elsewhere(self, batch_id: str) -> bool: ...

    def watch(self, run_id: str) -> bool: ...

    def unwatch(self, run_id: str) -> None: ...

    def watched_elsewhere(self, run_id: str) -> bool: ...

    def release(self, run_id: str) -> None: ...

    def close(self) -> None: ...


def upgrade_row(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """The one place where rows written by older versions are brought up to
    date. Version 1 is the first, so there is nothing to upgrade yet; a newer
    row than this code understands is refused."""
    found = int(row["schema_version"])
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(table, found, SCHEMA_VERSION)
    return row


class SQLRunStore:
    """Shared logic of the SQL run stores. Subclasses set ``dialect`` and
    implement the hooks below."""

    dialect = "sql"
    #: The temporary table of an export's per-run ranges (engine/_recorder.py).
    ranges_table_sql = ("CREATE TEMP TABLE IF NOT EXISTS _export_ranges"
                        " (run_id TEXT PRIMARY KEY, lo INTEGER NOT NULL, hi INTEGER NOT NULL) WITHOUT ROWID")
    #: How the export's ranges join the tables they select from (TraceTable.select_sql).
    driving_join = "CROSS JOIN"

    def __init__(self) -> None:
        #: Group commit: concurrent callers' commits share one transaction and
        #: one fsync; each caller still returns only once its commit is durable.
        self.group_commit = False
        self._group = _GroupCommitter(self)
        self._batch_owner: int | None = None
        self._lock = threading.RLock()
        self._conn: Any = None
        self._update_cache: dict[tuple[Any, ...], str] = {}
        self._heads: dict[str, tuple[int, State, int, int, int]] = {}
        self._stmt = {name: self._sql(sql) for name, sql in _STATEMENTS.items()}
        self._stmt["lock_run"] = self._sql(self._lock_run_sql())
        #: Runs this store's threads drive: run_id -> (thread, depth).
        self._claims: dict[str, tuple[int, int]] = {}
        #: The number of each claim held, where a claim can be lost while
        #: its process lives (see :meth:`claim_number`).
        self._numbers: dict[str, int] = {}
        #: Batches this process holds (:meth:`hold_batch`), until it closes the store.
        self._batches: set[str] = set()
        #: Runs this process keeps under way between its drives (:meth:`watch`).
        self._watches: set[str] = set()
        self._claims_lock = threading.Lock()
        #: What the dialect keeps its claims among processes in (``_open_drivers``).
        self._drivers: Any = None

    # -- dialect hooks -------------------------------------------------

    def _connect(self) -> Any:
        raise NotImplementedError

    def _begin_write(self, conn: Any) -> None:
        raise NotImplementedError

    def _lock_run_sql(self) -> str:
        """SELECT of a run row that also takes the row's write lock."""
        raise NotImplementedError

    def _is_transient(self, exc: BaseException) -> bool:
        """Whether the server aborted the transaction to break a conflict
        with another one (PostgreSQL's deadlock and serialization failures:
        two commits storing the same new artifacts in different orders), so
        that doing the whole transaction again succeeds. SQLite has none:
        its writers queue on one lock."""
        return False

    def _sql(self, statement: str) -> str:
        """Rewrite ``?`` placeholders for the dialect (identity for SQLite)."""
        return statement

    def _begin_read(self, conn: Any) -> None:
        """Begin a read transaction on a ``read_connection()``: every read
        inside sees one snapshot of the journal, taken while no label is
        being written (the recorder reads the labels' upper bound from it).
        SQLite's writers take turns, so any snapshot will do."""
        conn.execute("BEGIN")

    def _writing_labels(self, conn: Any) -> None:
        """Called in a transaction that adds a label, before the insert
        (see ``_begin_read``)."""

    def _stream(self, conn: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        """A cursor over a long result, fetched in batches (``fetchmany``)."""
        return conn.execute(self._sql(statement), params)

    def read_connection(self) -> Any:
        """A separate connection for long reads (the recorder), so a reader
        never holds the writer's connection."""
        raise NotImplementedError

    def execute(self, conn: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        """Run a ``?``-placeholder statement on one of this store's connections."""
        return conn.execute(self._sql(statement), params)

    def execute_many(self, conn: Any, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        conn.cursor().executemany(self._sql(statement), rows)

    # -- transactions ----------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Any]:
        with self._lock:
            conn = self._conn
            if self._in_batch():
                # Inside batch(): a savepoint, so a refused write is undone alone.
                conn.execute("SAVEPOINT one_write")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK TO one_write")
                    conn.execute("RELEASE one_write")
                    raise
                conn.execute("RELEASE one_write")
                return
            self._begin_write(conn)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        _faults.after_commit()

    def _in_batch(self) -> bool:
        return self._batch_owner == threading.get_ident()

    def _transaction(self, work: Callable[[Any], _T], forget: Callable[[], object]) -> _T:
        """``work(conn)`` in a write transaction on the store's connection
        (the caller holds ``_lock``); redone from the start when the server
        aborted it to break a conflict. ``forget`` drops what ``work`` may
        have remembered of a transaction that was rolled back."""
        conn = self._conn
        retries = 0
        while True:
            self._begin_write(conn)
            try:
                value = work(conn)
            except BaseException as exc:
                conn.execute("ROLLBACK")
                forget()
                if retries < TRANSIENT_RETRIES and self._is_transient(exc):
                    retries += 1
                    continue
                raise
            conn.execute("COMMIT")
            return value

    def _write_retried(self, work: Callable[[Any], _T], forget: Callable[[], object]) -> _T:
        """One write, as ``_write()``, but redone whole after a transient abort."""
        if self._in_batch():
            with self._write() as conn:
                return work(conn)
        with self._lock:
            value = self._transaction(work, forget)
        _faults.after_commit()
        return value

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many writes (``create_run``, ``commit``, ``add_label``) by this
        thread as one transaction: one fsync, and all of them or none. A
        refused commit inside is undone alone and raises as usual; leaving
        the block with an exception rolls everything back. Other threads
        wait until the batch is done."""
        with self._lock:
            if self._in_batch():
                raise RuntimeError("batch() does not nest")
            conn = self._conn
            self._begin_write(conn)
            self._batch_owner = threading.get_ident()
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                self._heads.clear()  # heads remembered inside are gone with it
                raise
            finally:
                self._batch_owner = None
            conn.execute("COMMIT")
        _faults.after_commit()

    def run_ids(self) -> set[str]:
        """Every run id the journal has."""
        with self._lock:
            return {row[0] for row in self._conn.execute("SELECT run_id FROM runs")}

    # -- runs ------------------------------------------------------------

    def create_run(self, new: NewRun) -> RunRecord:
        now = now_us()
        spec_json = canonical_json(dict(new.spec))

        def write(conn: Any) -> None:
            self.execute(
                conn,
                "INSERT INTO runs (run_id, thread_id, task_id, tenant, prompt_version, prompt_hash, model_route,"
                " state, state_version, last_seq, step, attempt, started_at, updated_at,"
                " schema_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 1, 0, 0, ?, ?, ?)",
                (
                    new.run_id,
                    new.thread_id or new.run_id,
                    new.task_id,
                    new.tenant,
                    new.prompt_version,
                    new.prompt_hash,
                    new.model_route,
                    INITIAL.value,
                    now,
                    now,
                    SCHEMA_VERSION,
                ),
            )
            self.execute(
                conn,
                "INSERT INTO run_specs (run_id, spec_json, schema_version) VALUES (?, ?, ?)",
                (new.run_id, spec_json, SCHEMA_VERSION),
            )
            created = {key: value for key, value in (("backend", new.backend_id), ("batch", new.batch_id)) if value}
            self._insert_event(conn, new.run_id, 1, now, "run_created", None, INITIAL.value, 0, 0, 1, created)
            self._store_artifacts(conn, new.run_id, 1, now, new.artifacts)

        self._write_retried(write, lambda: None)
        self._remember_head(new.run_id, (1, INITIAL, 1, 0, 0))
        return self.get_run(new.run_id)

    def get_run(self, run_id: str) -> RunRecord:
        with self._lock:
            row = self.execute(self._conn, _RUN_SELECT + " WHERE r.run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise UnknownRun(run_id)
        return _run_record(row)

    def list_runs(self, states: Iterable[State] | None = None) -> list[RunRecord]:
        query = _RUN_SELECT
        params: list[Any] = []
        if states is not None:
            wanted = [State(s).value for s in states]
            if not wanted:
                return []
            query += f" WHERE r.state IN ({', '.join('?' for _ in wanted)})"
            params = wanted
        with self._lock:
            rows = self.execute(self._conn, query + " ORDER BY r.started_at, r.run_id", params).fetchall()
        return [_run_record(row) for row in rows]

    def events(self, run_id: str, after_seq: int = 0) -> list[EventRecord]:
        with self._lock:
            rows = self.execute(
                self._conn,
                f"SELECT {', '.join(EVENT_FIELDS)} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run_id, after_seq),
            ).fetchall()
        return [EventRecord(**upgrade_row("events", dict(zip(EVENT_FIELDS, row)))) for row in rows]

    def get_artifact(self, artifact_id: str) -> Any:
        from loopledger.canonical import loads

        with self._lock:
            row = self.execute(
                self._conn,
                "SELECT body, schema_version FROM artifacts WHERE artifact_id = ?",
                (artifact_id,),
            ).fetchone()
        if row is None:
            raise KeyError(artifact_id)
        upgrade_row("artifacts", {"schema_version": row[1]})
        return loads(row[0])

    def facts(self, table: str, run_id: str) -> list[dict[str, Any]]:
        if table not in FACT_COLUMNS:
            raise ValueError(f"unknown fact table {table!r}; known: {', '.join(FACT_COLUMNS)}")
        columns = ("run_id",) + FACT_COLUMNS[table] + ("seq", "schema_version")
        with self._lock:
            rows = self.execute(
                self._conn,
                f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
        return [upgrade_row(table, dict(zip(columns, row))) for row in rows]

    def operations(self, run_id: str) -> list[dict[str, Any]]:
        columns = ("run_id",) + OPERATION_COLUMNS + ("created_seq", "updated_seq", "schema_version")
        with self._lock:
            rows = self.execute(
                self._conn,
                f"SELECT {', '.join(columns)} FROM operations WHERE run_id = ? ORDER BY created_seq, operation_id",
                (run_id,),
            ).fetchall()
        return [upgrade_row("operations", dict(zip(columns, row))) for row in rows]

    def journal_id(self) -> str:
        """This journal's identity, made once when it was created."""
        with self._lock:
            (journal_id,) = self._conn.execute("SELECT journal_id FROM journal_identity").fetchone()
        return str(journal_id)

    def labels(self, run_id: str) -> list[dict[str, Any]]:
        """The run's labels, oldest first."""
        columns = ("label_id", "run_id", "step", "attempt", "candidate_id", "validator", "expected_verdict",
                   "source", "note", "created_at", "schema_version")
        with self._lock:
            rows = self.execute(self._conn, f"SELECT {', '.join(columns)} FROM labels WHERE run_id = ?"
                                " ORDER BY label_id", (run_id,)).fetchall()
        return [upgrade_row("labels", dict(zip(columns, row))) for row in rows]

    def add_label(self, label: Mapping[str, Any]) -> int:
        with self._write() as conn:
            self._writing_labels(conn)
            cursor = self.execute(
                conn,
                "INSERT INTO labels (run_id, step, attempt, candidate_id, validator, expected_verdict,"
                " source, note, created_at, schema_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING label_id",
                (
                    label["run_id"],
                    int(label["step"]),
                    int(label["attempt"]),
                    label["candidate_id"],
                    label.get("validator") or "",
                    label["expected_verdict"],
                    label["source"],
                    label.get("note") or "",
                    now_us(),
                    SCHEMA_VERSION,
                ),
            )
            return int(cursor.fetchall()[0][0])

    # -- the commit ------------------------------------------------------

    def commit(self, commit: Commit, *then: Commit) -> CommitResult:
        """Apply ``commit`` atomically; with ``then``, also each of those
        commits of the same run, in order, each expecting the state version
        the one before it leaves, in the same transaction: all of them are
        durable or none is. Returns the last one's result (its ``first_seq``
        the first one's)."""
        chain = (commit, *then)
        _check_commit_shape(commit)
        for c in then:
            _check_commit_shape(c)
            if c.run_id != commit.run_id:
                raise ValueError(f"a chain of commits is one run's: {c.run_id} after {commit.run_id}")
        if self.group_commit and not self._in_batch():
            return self._group.submit(chain)
        # In a batch, _write_retried writes inside the batch's transaction.
        result, late = self._write_retried(lambda conn: self._commit_txn(conn, chain),
                                           lambda: self._heads.pop(commit.run_id, None))
        if late is not None:
            raise late
        return result

    def append_at_head(self, run_id: str, events: Sequence[NewEvent]) -> CommitResult:
        """Append ``events`` to the run as it stands, in one commit that
        advances its state version but not its state: the version is the
        one read under the write lock, so this cannot lose a compare-and-set
        race. For a request from outside the process driving the run (a
        cancel): a driver committing every few milliseconds would win every
        race of a load and a commit. The driver's next commit then meets a
        stale version and reads the run again. On an ended run the events
        are kept as late events (``TerminalAlreadySet``)."""

        def work(conn: Any) -> tuple[CommitResult, TerminalAlreadySet | None]:
            self._heads.pop(run_id, None)
            version = self._read_head(conn, run_id)[0]
            return self._commit_txn(conn, (Commit(run_id, version, None, events=tuple(events)),))

        result, late = self._write_retried(work, lambda: self._heads.pop(run_id, None))
        if late is not None:
            raise late
        return result

    def _commit_txn(
        self, conn: Any, chain: Sequence[Commit], now: int | None = None
    ) -> tuple[CommitResult, TerminalAlreadySet | None]:
        """Apply ``chain`` (one commit, or several of one run, each expecting
        the version the one before it leaves) in the caller's transaction.

        Every commit is checked before anything is written, so a refusal
        writes nothing. Then one update of the run row (the compare-and-set,
        for the whole chain) and one insert of all the events; each commit
        keeps its own state version, transition event, and ``seq`` on its
        facts and operations.
        """
        run_id = chain[0].run_id
        head = self._heads.get(run_id)
        remembered = head is not None and head[0] == chain[0].expected_version
        if not remembered:
            head = self._read_head(conn, run_id)
        version, state, last_seq, step, attempt = head
        if now is None:
            now = now_us()
        if state._value_ in _TERMINAL_NAMES:
            return self._late_chain(conn, chain, head, now)

        seq, rows, ends = last_seq, [], []
        deltas: dict[str, list[Any]] = {}
        set_fields: dict[str, Any] = {}
        for c in chain:
            if c.expected_version != version:
                raise StaleStateVersion(run_id, c.expected_version, version)
            source = state._value_
            if source in _TERMINAL_NAMES:
                raise ValueError(f"run {run_id}: a commit after the terminal state in one chain")
            target = c.to_state
            if target is not None:
                if target._value_ not in _ALLOWED_NAMES[source]:
                    raise TransitionNotAllowed(run_id, source, target._value_)
                state = target
            name = state._value_
            version += 1
            if c.step is not None:
                step = c.step
            if c.attempt is not None:
                attempt = c.attempt
            if target is not None:
                seq += 1
                rows.append((run_id, seq, now, "transition", source, name, step, attempt, version,
                             canonical_json(c.payload), SCHEMA_VERSION))
            for event in c.events:
                seq += 1
                rows.append((run_id, seq, now, event.kind, name, None, step, attempt, version,
                             canonical_json(event.payload), SCHEMA_VERSION))
            ends.append(seq)
            for counter, delta in c.counters.items():
                deltas.setdefault(counter, []).append(delta)
            set_fields.update(c.set_fields)

        # The compare-and-set comes first: when the head this store
        # remembered is stale (another process moved the run), nothing has
        # been written yet, and the run is read for the precise refusal.
        # Counters add each commit's delta in turn, as separate commits would.
        terminal = state._value_ in _TERMINAL_NAMES
        # A chain that ends in the state it started from (a retry, events
        # only) leaves the state column, and so the runs_by_state index
        # (one page fewer to write), alone.
        moved = state is not head[1]
        params: list[Any] = [state._value_] if moved else []
        params += (version, seq, step, attempt, now)
        for values in deltas.values():
            params += values
        if set_fields:
            params += (_column_value(set_fields, name) for name in set_fields)
        if terminal:
            params.append(now)
        params += (run_id, head[0])
        shape = tuple((counter, len(values)) for counter, values in deltas.items())
        updated = conn.execute(self._update_run_sql(shape, tuple(set_fields), terminal, moved), params)
        if updated.rowcount != 1:
            if remembered:
                self._heads.pop(run_id, None)
                return self._commit_txn(conn, chain, now)
            # Read under the write lock a moment ago: cannot happen; refuse loudly.
            raise StaleStateVersion(run_id, chain[0].expected_version, -1)

        self._insert_rows(conn, _EVENTS_INSERT, _EVENT_WIDTH, rows)
        for c, at in zip(chain, ends):
            if c.artifacts:
                self._store_artifacts(conn, run_id, at, now, c.artifacts)
            if c.facts:
                self._insert_facts(conn, run_id, at, c.facts)
            if c.new_operations or c.operation_updates:
                self._write_operations(conn, run_id, at, c.new_operations, c.operation_updates)
        if terminal:
            self._heads.pop(run_id, None)
        else:
            self._remember_head(run_id, (version, state, seq, step, attempt))
        return CommitResult(run_id, state, version, last_seq + 1, seq), None

    def _late_chain(
        self, conn: Any, chain: Sequence[Commit], head: tuple[int, State, int, int, int], now: int
    ) -> tuple[CommitResult, TerminalAlreadySet | None]:
        """Every commit of ``chain`` on a run that has ended, as late events;
        the first refusal is the chain's."""
        version, state, last_seq, step, attempt = head
        first_seq, refused = last_seq + 1, None
        for c in chain:
            result, late = self._late_txn(conn, c, state, version, last_seq, step, attempt, now)
            last_seq, refused = result.last_seq, refused or late
        return replace(result, first_seq=first_seq), refused

    def _read_head(self, conn: Any, run_id: str) -> tuple[int, State, int, int, int]:
        row = conn.execute(self._stmt["lock_run"], (run_id,)).fetchone()
        if row is None:
            raise UnknownRun(run_id)
        head = (int(row[1]), State(row[0]), int(row[2]), int(row[3]), int(row[4]))
        self._remember_head(run_id, head)
        return head

    def _remember_head(self, run_id: str, head: tuple[int, State, int, int, int]) -> None:
        """What this store last saw of a run: it spares the read before a
        commit. Never trusted alone: the commit's compare-and-set checks it."""
        if head[1]._value_ in _TERMINAL_NAMES:
            self._heads.pop(run_id, None)
            return
        if run_id not in self._heads and len(self._heads) >= MAX_HEADS:
            self._heads.pop(next(iter(self._heads)))
        self._heads[run_id] = head

    def _apply_group(self, slots: list[_Slot]) -> None:
        """Apply many runs' commits in one transaction, one fsync. A refused
        commit (a lost compare-and-set) must be undone alone and the others
        stand: a commit refused before it wrote anything (the common refusals:
        a stale state version, a move not allowed, an unknown run) needs no
        undoing, so the commits are first applied without savepoints; when one
        fails after it began writing, the transaction is rolled back and the
        group applied again, each commit in its own savepoint."""
        def apply(conn: Any) -> None:
            if not self._apply_slots(conn, slots):
                conn.execute("ROLLBACK")
                forget()
                self._begin_write(conn)
                self._apply_slots_in_savepoints(conn, slots)

        def forget() -> None:
            for slot in slots:
                slot.result = slot.late = slot.error = None
            self._heads.clear()

        with self._lock:
            self._transaction(apply, forget)
        for slot in slots:
            if slot.error is None:
                _faults.after_commit()

    def _apply_slots(self, conn: Any, slots: list[_Slot]) -> bool:
        """Apply each slot's commit; False when one failed after it may have
        written (the transaction then holds a partial commit)."""
        for slot in slots:
            try:
                slot.result, slot.late = self._commit_txn(conn, slot.chain)
            except _REFUSED_BEFORE_WRITING as exc:
                self._heads.pop(slot.chain[0].run_id, None)
                slot.error = exc
            except Exception as exc:  # noqa: BLE001 - redone in savepoints, where it is handed to its caller
                if self._is_transient(exc):
                    raise  # the whole group is redone
                return False
        return True

    def _apply_slots_in_savepoints(self, conn: Any, slots: list[_Slot]) -> None:
        for slot in slots:
            conn.execute("SAVEPOINT one_commit")
            try:
                slot.result, slot.late = self._commit_txn(conn, slot.chain)
            except Exception as exc:  # noqa: BLE001 - handed to the caller that owns it
                if self._is_transient(exc):
                    raise  # the whole group is redone
                conn.execute("ROLLBACK TO one_commit")
                self._heads.pop(slot.chain[0].run_id, None)
                slot.error = exc
            conn.execute("RELEASE one_commit")

    def _update_run_sql(self, counters: tuple[tuple[str, int], ...], fields: tuple[str, ...], terminal: bool,
                        moved: bool = True) -> str:
        """The run row's compare-and-set; ``counters``: (name, how many
        deltas are added to it); ``moved``: the state changes."""
        key = (counters, fields, terminal, moved)
        sql = self._update_cache.get(key)
        if sql is None:
            assignments = ["state = ?"] if moved else []
            assignments += ["state_version = ?", "last_seq = ?", "step = ?", "attempt = ?", "updated_at = ?"]
            assignments += [f"{name} = {name}" + " + ?" * times for name, times in counters]
            assignments += [f"{name} = ?" for name in fields]
            if terminal:
                assignments.append("ended_at = ?")
            sql = self._sql(f"UPDATE runs SET {', '.join(assignments)} WHERE run_id = ? AND state_version = ?")
            self._update_cache[key] = sql
        return sql

    def _late_txn(
        self, conn: Any, c: Commit, state: State, version: int, last_seq: int, step: int, attempt: int, now: int
    ) -> tuple[CommitResult, TerminalAlreadySet | None]:
        """Keep what arrived after the end, without touching the outcome."""
        seq = last_seq
        originals = ([("transition", c.payload)] if c.to_state is not None else []) + [
            (e.kind, e.payload) for e in c.events
        ]
        for kind, payload in originals:
            seq += 1
            late_payload = {"kind": kind, "payload": dict(payload)}
            if kind == "transition":
                late_payload["to_state"] = c.to_state.value if c.to_state else None
            self._insert_event(
                conn, c.run_id, seq, now, "late_event", state.value, None, step, attempt, version, late_payload
            )
        self._store_artifacts(conn, c.run_id, seq, now, c.artifacts)
        self.execute(conn, "UPDATE runs SET last_seq = ?, updated_at = ? WHERE run_id = ?", (seq, now, c.run_id))
        result = CommitResult(c.run_id, state, version, last_seq + 1, seq, late=True)
        # Refused even without a move: its caller must not act on it (a
        # dispatch recorded late must not be sent; the run ended without it).
        return result, TerminalAlreadySet(c.run_id, state.value, c.to_state.value if c.to_state else None)

    def _insert_event(
        self, conn: Any, run_id: str, seq: int, ts: int, kind: str, from_state: str | None,
        to_state: str | None, step: int, attempt: int, state_version: int, payload: Mapping[str, Any],
    ) -> None:
        conn.execute(
            self._stmt["insert_event"],
            (run_id, seq, ts, kind, from_state, to_state, step, attempt, state_version,
             canonical_json(payload), SCHEMA_VERSION),
        )

    def _store_artifacts(
        self, conn: Any, run_id: str, seq: int, now: int, artifacts: Sequence[Artifact]
    ) -> None:
        # Content addressing makes storing idempotent: the same bytes have the
        # same id, so a conflict means the row is already exactly this.
        for artifact in artifacts:
            conn.execute(
                self._stmt["insert_artifact"],
                (artifact.artifact_id, artifact.kind, now, artifact.size_bytes, artifact.canonical,
                 run_id, seq, SCHEMA_VERSION),
            )

    def _insert_facts(
        self, conn: Any, run_id: str, seq: int, facts: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> None:
        for table, rows in facts.items():
            # Rows that supply the same columns go in one executemany; omitted
            # columns take the table's defaults instead of an explicit NULL.
            # The common case, a row with every column (only known ones pass
            # _check_commit_shape), is read with one C-level getter.
            columns = FACT_COLUMNS[table]
            width = len(columns)
            getter = _FACT_GETTERS[table]
            json_at = _FACT_JSON_AT[table]
            full: list[tuple[Any, ...]] = []
            batches: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
            for row in rows:
                if len(row) == width:
                    values = getter(row)
                    for index in json_at:
                        value = values[index]
                        if value is not None and not isinstance(value, str):
                            values = values[:index] + (canonical_json(value),) + values[index + 1:]
                    full.append((run_id, *values, seq, SCHEMA_VERSION))
                    continue
                present = tuple(c for c in columns if c in row)
                batches.setdefault(present, []).append(
                    (run_id, *(_column_value(row, c) for c in present), seq, SCHEMA_VERSION))
            if full:
                self._insert_rows(conn, self._fact_insert(table, columns), width + 3, full)
            for present, values in batches.items():
                self._insert_rows(conn, self._fact_insert(table, present), len(present) + 3, values)

    def _insert_rows(self, conn: Any, insert: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        """``rows`` as one multi-row INSERT (per ``ROWS_PER_INSERT``): one
        statement to run instead of one per row, and what SQLite sets up
        once per statement (the IN list of a CHECK, as on
        ``validations.verdict``) is set up once."""
        for start in range(0, len(rows), ROWS_PER_INSERT):
            chunk = rows[start:start + ROWS_PER_INSERT]
            key = (insert, len(chunk))
            sql = self._update_cache.get(key)
            if sql is None:
                one = "(" + ", ".join("?" * width) + ")"
                sql = self._sql(f"{insert} VALUES {', '.join([one] * len(chunk))}")
                self._update_cache[key] = sql
            conn.execute(sql, chunk[0] if len(chunk) == 1 else [v for row in chunk for v in row])

    def _fact_insert(self, table: str, columns: tuple[str, ...]) -> str:
        key = (table, columns)
        sql = self._update_cache.get(key)
        if sql is None:
            sql = f"INSERT INTO {table} (run_id, {', '.join(columns)}, seq, schema_version)"
            self._update_cache[key] = sql
        return sql

    def _write_operations(
        self, conn: Any, run_id: str, seq: int,
        new: Sequence[Mapping[str, Any]], updates: Sequence[Mapping[str, Any]],
    ) -> None:
        for op in new:
            columns = tuple(c for c in OPERATION_COLUMNS if c in op)  # omitted: the table's default
            insert = self._operation_insert_sql(columns)
            values = tuple(_column_value(op, c) for c in columns)
            cursor = conn.execute(insert, (run_id, *values, seq, seq, SCHEMA_VERSION))
            if cursor.rowcount == 1:
                continue
            # Idempotency keys are primary keys: recording the same operation
            # again is a no-op, recording a different one under its key is not.
            existing = self.execute(
                conn,
                "SELECT operation_id, run_id, tool, tool_version, canonical_args_json FROM operations"
                " WHERE idempotency_key = ? OR operation_id = ?",
                (op["idempotency_key"], op["operation_id"]),
            ).fetchall()
            mine = (
                op["operation_id"], run_id, op["tool"], op.get("tool_version"),
                _column_value(op, "canonical_args_json"),
            )
            if any(tuple(row) != mine for row in existing):
                raise OperationConflict(run_id, op["idempotency_key"], "recorded with different content")
        for update in updates:
            fields = {k: v for k, v in update.items() if k != "operation_id"}
            cursor = conn.execute(
                self._operation_update_sql(tuple(fields)),
                (*fields.values(), seq, update["operation_id"], run_id),
            )
            if cursor.rowcount != 1:
                raise OperationConflict(run_id, update["operation_id"], "no such operation in this run")

    def _operation_insert_sql(self, columns: tuple[str, ...]) -> str:
        key = ("operations", columns)
        sql = self._update_cache.get(key)
        if sql is None:
            sql = self._sql(
                f"INSERT INTO operations (run_id, {', '.join(columns)}, created_seq, updated_seq,"
                f" schema_version) VALUES ({', '.join('?' for _ in range(len(columns) + 4))})"
                " ON CONFLICT DO NOTHING"
            )
            self._update_cache[key] = sql
        return sql

    def _operation_update_sql(self, fields: tuple[str, ...]) -> str:
        key = ("operation_update", fields)
        sql = self._update_cache.get(key)
        if sql is None:
            assignments = ", ".join(f"{name} = ?" for name in fields)
            sql = self._sql(
                f"UPDATE operations SET {assignments}, updated_seq = ? WHERE operation_id = ? AND run_id = ?")
            self._update_cache[key] = sql
        return sql

    # -- who drives a run ------------------------------------------------------

    def claim(self, run_id: str, wait_s: float = 0.0) -> bool:
        """Take the right to drive ``run_id``: one thread of one process at a
        time, whatever the journal's other processes do (a ``reply`` while a
        ``resume`` runs). Waits up to ``wait_s`` seconds for whoever holds it;
        False if it is still held. Reentrant within a thread; held until
        :meth:`release`, or until the process ends (the operating system, or
        the server, lets go of a dead process's claims)."""
        me = threading.get_ident()
        deadline = time.monotonic() + wait_s
        while True:
            with self._claims_lock:
                holder = self._claims.get(run_id)
                if holder is not None and holder[0] == me:
                    self._claims[run_id] = (me, holder[1] + 1)
                    return True
                if holder is None and self._claim_outside_now(run_id):
                    try:
                        number = self._claim_number()
                    except BaseException:
                        self._release_outside(run_id)
                        raise
                    self._claims[run_id] = (me, 1)
                    if number is not None:
                        self._numbers[run_id] = number
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(CLAIM_POLL_S)

    def hold_batch(self, batch_id: str) -> None:
        """Hold ``batch_id`` for as long as this store is open: the runs a
        ``run`` command creates name its batch, and a process that finds a
        run of a batch held elsewhere, not yet started, leaves it to the
        process that made it (:meth:`batch_held_elsewhere`). One claim per
        batch, however many runs it has; the operating system, or the server,
        lets go of it when the process ends."""
        self._hold(self._batches, batch_id, _batch_name(batch_id))

    def batch_held_elsewhere(self, batch_id: str) -> bool:
        """Whether another process, alive, holds ``batch_id``."""
        return self._held_elsewhere(self._batches, batch_id, _batch_name(batch_id))

    def watch(self, run_id: str) -> bool:
        """Say that this process keeps ``run_id`` under way between its
        drives (it polls the run's background work, releasing its claim in
        between) and will report how it ends: another process that drives it
        meanwhile and finds it still waiting leaves it to this one
        (:meth:`watched_elsewhere`) instead of reporting a wait that is
        ending. Held until :meth:`unwatch`, or until the process ends.
        False when another process watches it already."""
        return self._hold(self._watches, run_id, _watch_name(run_id))

    def unwatch(self, run_id: str) -> None:
        with self._claims_lock:
            if run_id in self._watches:
                self._watches.discard(run_id)
                self._release_outside(_watch_name(run_id))

    def watched_elsewhere(self, run_id: str) -> bool:
        """Whether another process, alive, watches ``run_id``."""
        return self._held_elsewhere(self._watches, run_id, _watch_name(run_id))

    def _hold(self, mine: set[str], key: str, name: str) -> bool:
        """Hold ``name`` among the claims for ``key`` in ``mine`` (this
        store's batches or watches) unless it is held already; False when
        another process holds it."""
        with self._claims_lock:
            if key not in mine:
                if not self._claim_outside_now(name):
                    return False
                mine.add(key)
            return True

    def _held_elsewhere(self, mine: set[str], key: str, name: str) -> bool:
        with self._claims_lock:
            if key in mine:
                return False
            self._open_drivers_once()
            return self._held_outside(name)

    def still_holds(self, run_id: str) -> bool:
        """Whether this process still holds its claim on ``run_id``: asked
        before a side effect is sent. A claim can be lost while the process
        lives only where it lives on a server's session (PostgreSQL: the
        claims' connection closed, and another process may take the run)."""
        with self._claims_lock:
            return run_id in self._claims and self._drivers is not None and self._claims_alive()

    def _claims_alive(self) -> bool:
        """Whether the claims held on ``self._drivers`` still stand."""
        return True

    def claim_number(self, run_id: str) -> int | None:
        """The number of this process's claim on ``run_id``, for the backends
        to fence with (``ToolRequest.fence``), or None where a claim cannot
        be lost while its process lives (SQLite's: the kernel's lock). Claims
        are numbered in the order they are taken, so a driver that took a
        run over holds a higher number than the one that lost it."""
        with self._claims_lock:
            return self._numbers.get(run_id)

    def _claim_number(self) -> int | None:
        """A new claim number (under ``_claims_lock``, the claim just taken)."""
        return None

    def _open_drivers_once(self) -> None:
        """Open what the claims among processes are kept in, at first use."""
        if self._drivers is None:
            self._drivers = self._open_drivers()

    def _claim_outside_now(self, name: str) -> bool:
        self._open_drivers_once()
        return self._claim_outside(name)

    def release(self, run_id: str) -> None:
        with self._claims_lock:
            holder, depth = self._claims[run_id]
            if depth > 1:
                self._claims[run_id] = (holder, depth - 1)
                return
            del self._claims[run_id]
            self._numbers.pop(run_id, None)
            self._release_outside(run_id)

    # The dialect's claims among processes, on ``self._drivers`` (under ``_claims_lock``).

    def _open_drivers(self) -> Any:
        raise NotImplementedError

    def _claim_outside(self, name: str) -> bool:
        """Claim ``name`` (a run id, or a batch's name) without waiting;
        False when another process holds it."""
        raise NotImplementedError

    def _release_outside(self, name: str) -> None:
        raise NotImplementedError

    def _held_outside(self, name: str) -> bool:
        """Whether another process (or another store) holds ``name``, found
        out without taking it: a claim taken only to ask would be seen by
        another asker at that moment as a live holder."""
        raise NotImplementedError

    def _close_drivers(self, drivers: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        with self._claims_lock:
            if self._drivers is not None:
                self._close_drivers(self._drivers)  # lets go of this store's claims
                self._drivers = None
                self._claims.clear()
                self._numbers.clear()
                self._batches.clear()
                self._watches.clear()


@dataclass
class _Slot:
    chain: tuple[Commit, ...]  # one commit, or a chain applied together
    result: CommitResult | None = None
    late: TerminalAlreadySet | None = None
    error: BaseException | None = None
    done: bool = False
    #: Held while its caller waits; released once, when the commit is done
    #: or when the caller is handed the lead.
    wake: Any = None


class _GroupCommitter:
    """Leader/follower group commit. The first caller to find no group in
    progress leads: it applies every commit queued so far in one
    transaction, then hands the lead to the first caller that queued
    meanwhile, if any. Each waiting caller sleeps on a lock of its own and
    is woken once: when its commit is done (durable), or when it is handed
    the lead. No thread of its own."""

    def __init__(self, store: SQLRunStore) -> None:
        self.store = store
        self._mutex = threading.Lock()
        self._queue: list[_Slot] = []
        self._leading = False

    def submit(self, chain: tuple[Commit, ...]) -> CommitResult:
        slot = _Slot(chain)
        wake = slot.wake = threading.Lock()
        wake.acquire()
        with self._mutex:
            self._queue.append(slot)
            lead = not self._leading
            self._leading = True
        if not lead:
            wake.acquire()
        if not slot.done:
            self._lead(slot)
        if slot.error is not None:
            raise slot.error
        if slot.late is not None:
            raise slot.late
        assert slot.result is not None
        return slot.result

    def _lead(self, mine: _Slot) -> None:
        with self._mutex:
            batch, self._queue = self._queue, []
        try:
            self.store._apply_group(batch)
        except BaseException as exc:
            for other in batch:
                other.error = other.error or exc
        finally:
            for other in batch:
                other.done = True
            with self._mutex:
                successor = self._queue[0] if self._queue else None
                if successor is None:
                    self._leading = False
            for other in batch:
                if other is not mine:
                    other.wake.release()
            if successor is not None:
                successor.wake.release()


def _column_value(row: Mapping[str, Any], column: str) -> Any:
    value = row.get(column)
    if column.endswith("_json") and value is not None and not isinstance(value, str):
        return canonical_json(value)
    return value


def _run_record(row: Sequence[Any]) -> RunRecord:
    values = upgrade_row("runs", dict(zip(RUN_FIELDS, row)))
    values["state"] = State(values["state"])
    return RunRecord(**values)


def _check_commit_shape(c: Commit) -> None:
    """Refuse a malformed commit before opening a transaction: a programming
    error in the engine must not reach the journal."""
    if c.to_state is None and not c.events:
        raise ValueError(f"run {c.run_id}: a commit needs a transition or at least one event")
    if not (c.facts or c.new_operations or c.operation_updates or c.counters or c.set_fields):
        return
    for table, rows in c.facts.items():
        known = _FACT_SETS.get(table)
        if known is None:
            raise ValueError(f"unknown fact table {table!r}")
        for row in rows:
            if not row.keys() <= known:
                raise ValueError(f"{table}: unknown columns {sorted(set(row) - known)}")
    for op in c.new_operations:
        keys = op.keys()
        if not (keys <= _OPERATION_SET and keys >= _OPERATION_REQUIRED):
            unknown = set(op) - _OPERATION_SET
            missing = _OPERATION_REQUIRED - set(op)
            raise ValueError(f"operation: unknown {sorted(unknown)}, missing {sorted(missing)}")
    for update in c.operation_updates:
        if "operation_id" not in update or not set(update) - {"operation_id"} <= OPERATION_MUTABLE:
            raise ValueError(f"operation update may change only {sorted(OPERATION_MUTABLE)}")
    if not c.counters.keys() <= RUN_COUNTERS:
        raise ValueError(f"unknown run counters {sorted(set(c.counters) - RUN_COUNTERS)}")
    if not c.set_fields.keys() <= RUN_SETTABLE:
        raise ValueError(f"run fields that a commit may not set: {sorted(set(c.set_fields) - RUN_SETTABLE)}")
