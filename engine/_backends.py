"""Deterministic demo tool backends (CONTRACT.md, "Scenario files").

:class:`DemoBackend` plays the systems behind the demo tools: a workspace
per tenant, an order service, a payment provider, a report warehouse, a test
runner and a deploy API. Its state lives in ``<home>/demo_backend.sqlite``
(plus ``<home>/workspaces/``) so side effects can be counted across crashes
and processes.

The tables anyone may read
--------------------------
``executions``: one row per **real execution of a side effect**
(``tool``, ``idempotency_key``, ``execution_no``, ``run_id``,
``operation_id``, ``executed_at`` in µs since the epoch, the outcome). A
provider that honours idempotency keys executes a key once: a second send
returns the recorded result and adds no row (a partial unique index enforces
``idempotency_key`` unique for those tools). ``payments.refund`` is
non-idempotent, like many real payment APIs: a second send with the same key
refunds again and adds a row with ``execution_no = 2``. So

    SELECT idempotency_key, COUNT(*) FROM executions GROUP BY 1 HAVING COUNT(*) > 1

lists every key that took effect twice: for a correct engine it is empty,
whatever crashed. ``deliveries`` has one row per request that reached a
side-effecting tool (executed, deduplicated, refused or faulted): it counts
sends, so a double send shows even when the provider refused the second one
(a second full refund fails on the balance and is no execution).

Faults
------
A :class:`Fault` applies to the tool's N-th call in the run, where N is the
``call_number`` the engine passes (it counts dispatches, re-sends included).
A fault fires **once** per ``(run, tool, call)``: it is recorded in
``fault_firings`` in the same transaction as what it did, so a request
delivered again with the same call number (after a crash, by a less careful
engine) meets a healthy backend instead of crashing forever.

Errors (``execute`` never raises for anything a request can contain)::

    EngineError
    └── BackendError          the backend's own state cannot be used
        ├── BackendUnavailable  its database cannot be opened or read (also an
        │                       ``Unavailable``: the command exits 3)
        ├── Fenced            a request from a driver that lost the run (a later
        │                     claim's requests came first): refused, nothing done
        └── UnknownWork       poll_work / cancel_work of a work id never issued
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from loopledger.canonical import canonical_json, content_id, loads

from . import _faults
from ._clock import now_us
from ._errors import BadInput, EngineError, Unavailable
from . import _services as svc
from ._testlog import test_run_result
from ._tools import EVIDENCE_KIND, TOOL_TRAITS, ToolTraits, demo_tool, evidence_subject
from ._workspace import ToolRefused, Workspaces, printable

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Fenced",
    "DemoBackend",
    "FAULT_KINDS",
    "Fault",
    "OUTCOMES",
    "ToolOutcome",
    "ToolRequest",
    "UnknownWork",
    "WorkStatus",
    "failure",
    "fault_candidates",
    "parse_faults",
]

FAULT_KINDS = (
    "timeout_before_commit",
    "timeout_after_commit",
    "rate_limit",
    "permission_denied",
    "state_conflict",
    "crash_after_dispatch",
    "fails",
    "object_ambiguous",
)
#: Faults that stop a request before it executes anything.
_BEFORE = frozenset({"timeout_before_commit", "rate_limit", "permission_denied", "state_conflict",
                     "object_ambiguous"})
_TIMEOUTS = frozenset({"timeout_before_commit", "timeout_after_commit"})

#: The CONTRACT's terminal results of a tool request. A tool that refuses a
#: request or reports a failure (not found, a conflict, failing tests, a
#: provider's decline) gives ``validation_failed``, its ``error_code`` saying
#: which; a rate limit the runtime cannot wait out ends ``cancelled``.
OUTCOMES = frozenset({
    "success", "validation_failed", "permission_denied", "approval_required", "timeout", "cancelled",
    "background_accepted", "unknown_outcome", "unknown_or_disabled_tool",
})

RATE_LIMIT_RETRY_AFTER_S = 0.05
DEFAULT_EXPORT_DELAY_S = 0.5
#: Exports at least this long run on the batch cluster, whose cancel API
#: only queues a request: ``cancel_work`` cannot confirm the stop (None).
UNCONFIRMABLE_CANCEL_DELAY_S = 60.0
BUSY_TIMEOUT_S = 30.0


class BackendError(EngineError):
    code = "backend_error"


class BackendUnavailable(BackendError, Unavailable):
    code = "backend_unavailable"


class Fenced(BackendError):
    code = "fenced"

    def __init__(self, run_id: str, epoch: int, current: int) -> None:
        super().__init__(f"run {run_id}: a request under claim {epoch}, after requests under claim {current}: "
                         "its driver lost the run; refused, nothing done")
        self.run_id = run_id
        self.epoch = epoch
        self.current = current


class UnknownWork(BackendError):
    code = "unknown_work"

    def __init__(self, work_id: str) -> None:
        super().__init__(f"no background work {work_id!r}")
        self.work_id = work_id


# --- request and outcome types -------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """An injected fault: ``kind`` happens on the ``call``-th call of ``tool`` in a run."""

    tool: str
    call: int
    kind: str
    #: ``object_ambiguous``: the objects the request's subject could mean.
    candidates: tuple[str, ...] = ()

    @classmethod
    def parse(cls, mapping: Any, where: str) -> Fault:
        """Build a fault from a scenario's ``faults:`` entry; ``where`` names
        it (``file.yaml: faults[0]``) in the :class:`BadInput` raised for a
        bad field."""
        if not isinstance(mapping, Mapping):
            raise BadInput(where, f"expected a mapping with tool, call and kind, got {type(mapping).__name__}")
        extra = sorted(set(mapping) - {"tool", "call", "kind", "candidates"})
        if extra:
            raise BadInput(f"{where}.{extra[0]}", "unknown field; expected tool, call, kind (and candidates)")
        tool = mapping.get("tool")
        spec = demo_tool(tool) if isinstance(tool, str) else None
        if spec is None or TOOL_TRAITS[spec.name].control:
            known = ", ".join(n for n, t in TOOL_TRAITS.items() if not t.control)
            raise BadInput(f"{where}.tool", f"expected a demo tool ({known}), got {tool!r}")
        call = mapping.get("call", 1)
        if type(call) is not int or call < 1:
            raise BadInput(f"{where}.call", f"expected an integer >= 1, got {call!r}")
        kind = mapping.get("kind")
        if kind not in FAULT_KINDS:
            raise BadInput(f"{where}.kind", f"expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        try:
            candidates = fault_candidates(kind, mapping.get("candidates"))
        except ValueError as exc:
            raise BadInput(f"{where}.candidates", str(exc)) from None
        return cls(tool, call, kind, candidates)


def fault_candidates(kind: str, candidates: Any) -> tuple[str, ...]:
    """A fault's ``candidates``: two or more different non-empty texts (the
    objects the call could mean) for ``object_ambiguous``, none for any
    other kind; ValueError saying what was expected otherwise."""
    if kind != "object_ambiguous":
        if candidates is not None:
            raise ValueError(f"only an object_ambiguous fault has candidates, not {kind}")
        return ()
    if (not isinstance(candidates, (list, tuple)) or len(candidates) < 2
            or not all(isinstance(c, str) and c for c in candidates) or len(set(candidates)) != len(candidates)):
        raise ValueError("expected a list of two or more different non-empty texts (the objects the call could "
                         f"mean), got {candidates!r}")
    return tuple(candidates)


def parse_faults(value: Any, where: str) -> tuple[Fault, ...]:
    """A scenario's ``faults:`` list. Two faults on the same call are refused:
    only one thing can happen to one request."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise BadInput(where, f"expected a list of faults, got {type(value).__name__}")
    faults: list[Fault] = []
    seen: dict[tuple[str, int], int] = {}
    for index, entry in enumerate(value):
        fault = Fault.parse(entry, f"{where}[{index}]")
        first = seen.setdefault((fault.tool, fault.call), index)
        if first != index:
            raise BadInput(f"{where}[{index}]", f"{fault.tool} call {fault.call} already has a fault ({where}[{first}])")
        faults.append(fault)
    return tuple(faults)


@dataclass(frozen=True)
class ToolRequest:
    """One dispatch of an operation to a backend."""

    operation_id: str
    #: Names the side effect, not the send: a re-send reuses it.
    idempotency_key: str
    run_id: str
    tenant: str
    tool: str
    #: The version the operation was authorised for; None means the current one.
    version: str | None
    #: Canonical arguments (workspace paths already canonical).
    arguments: dict[str, Any]
    #: This is the N-th dispatch of ``tool`` in the run (1-based, re-sends
    #: included), counted by the engine from its journal.
    call_number: int
    faults: tuple[Fault, ...] = ()
    #: Optimistic concurrency: the version of the resource the operation was
    #: planned against (an order's ``version`` as a string, a file's sha256 or
    #: ``absent``). A mismatch is STATE_CONFLICT and nothing executes.
    expected_resource_version: str | None = None
    #: The contract's forbidden globs. The workspace checks them against the
    #: path on disk as well, which a symlink can make differ from the
    #: canonical path the validators judged.
    forbidden_paths: tuple[str, ...] = ()
    #: The number of the sender's claim on the run, where a claim can be lost
    #: while its process lives (a PostgreSQL journal's; None otherwise): a
    #: side effect sent under a lower number than one already seen for the
    #: run is refused (:class:`Fenced`).
    fence: int | None = None


@dataclass(frozen=True)
class ToolOutcome:
    """The terminal result of one tool request."""

    #: One of :data:`OUTCOMES`.
    outcome: str
    #: Tool status, kept apart from the run's state: accepted, running, succeeded, failed.
    status: str
    #: JSON value that becomes the result artifact. Errors carry
    #: ``{"error": CODE, "message": ...}``. Never another tenant's data.
    result: Any
    #: ``{"kind", "subject"}`` entries; empty unless ``outcome`` is success.
    evidence: tuple[dict[str, str], ...]
    #: Stable code for the recovery table (PERMISSION_DENIED, RATE_LIMIT, ...).
    error_code: str | None
    #: For RATE_LIMIT: wait at least this long before the next send.
    retry_after_s: float | None
    #: For background work: the id its completion is linked by.
    work_id: str | None
    #: This request executed the side effect. Never True for
    #: ``unknown_outcome``: a caller whose response was lost cannot know;
    #: :meth:`DemoBackend.lookup` is how it finds out.
    executed: bool
    #: The provider matched the idempotency key and returned the recorded
    #: result without executing again.
    deduplicated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome, "status": self.status, "result": self.result,
            "evidence": [dict(e) for e in self.evidence], "error_code": self.error_code,
            "retry_after_s": self.retry_after_s, "work_id": self.work_id, "executed": self.executed,
            "deduplicated": self.deduplicated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolOutcome:
        return cls(
            outcome=data["outcome"], status=data["status"], result=data.get("result"),
            evidence=tuple(dict(e) for e in data.get("evidence", ())), error_code=data.get("error_code"),
            retry_after_s=data.get("retry_after_s"), work_id=data.get("work_id"),
            executed=bool(data.get("executed")), deduplicated=bool(data.get("deduplicated", False)),
        )


@dataclass(frozen=True)
class WorkStatus:
    """Where a piece of background work stands."""

    work_id: str
    state: str  # running | succeeded | failed | cancelled
    progress: float  # 0.0 .. 1.0
    outcome: ToolOutcome | None = field(default=None)  # set once the state is not running


def failure(outcome: str, code: str, message: str, *, retry_after_s: float | None = None, **details: Any) -> ToolOutcome:
    """A request's terminal result when nothing was executed: ``{"error":
    code, "message": ...}`` and no evidence."""
    result = {"error": code, "message": message, **details}
    if retry_after_s is not None:
        result["retry_after_s"] = retry_after_s
    return ToolOutcome(outcome=outcome, status="failed", result=result, evidence=(), error_code=code,
                       retry_after_s=retry_after_s, work_id=None, executed=False)


def _success(tool: str, subject: str, result: Any, *, executed: bool) -> ToolOutcome:
    return ToolOutcome(outcome="success", status="succeeded", result=result,
                       evidence=({"kind": EVIDENCE_KIND[tool], "subject": subject},),
                       error_code=None, retry_after_s=None, work_id=None, executed=executed)


def _check_fence(conn: sqlite3.Connection, run_id: str, epoch: int | None) -> None:
    """Inside the caller's transaction: refuse a request under a lower claim
    than one already seen for the run (:class:`Fenced`), else record its
    claim as the run's highest. Claims are numbered in the order they were
    taken, so the driver that took a run over always holds the higher one."""
    if epoch is None:
        return
    row = conn.execute("SELECT epoch FROM fences WHERE run_id = ?", (run_id,)).fetchone()
    if row is not None and row[0] > epoch:
        raise Fenced(run_id, epoch, row[0])
    conn.execute("INSERT INTO fences (run_id, epoch) VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE SET epoch = "
                 "excluded.epoch", (run_id, epoch))


def _timeout(tool: str) -> ToolOutcome:
    return failure("unknown_outcome", "TIMEOUT",
                  f"{tool}: no response within 30s; the call may or may not have taken effect")


_VALIDATORS: dict[str, Draft202012Validator] = {}


def _schema_errors(tool: str, arguments: Any) -> list[str]:
    validator = _VALIDATORS.get(tool)
    if validator is None:
        spec = demo_tool(tool)
        assert spec is not None
        validator = _VALIDATORS[tool] = Draft202012Validator(spec.schema_)
    if not isinstance(arguments, dict):
        return ["$: arguments must be an object"]
    return sorted(
        "$" + "".join(f".{p}" for p in e.absolute_path) + f": {e.message}" for e in validator.iter_errors(arguments)
    )[:5]


# --- the backend --------------------------------------------------------------------------


class DemoBackend:
    """The demo tool backends of one data directory. Safe for several
    threads (one lock) and several processes (SQLite write locks)."""

    def __init__(self, home: str | Path) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.path = self.home / "demo_backend.sqlite"
        self._worlds: dict[str, Workspaces] = {}
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            self._create()
            #: Which backend this is: each run records the one it acts on, and
            #: is driven only by a process using the same (the demo backends
            #: live in a data directory, and several may share one journal;
            #: reconciling a run against another's backend would send again
            #: what was sent).
            self.identity = svc.backend_identity(self._conn)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"{self.path}: cannot open the demo backend: {exc}") from exc

    def _create(self) -> None:
        # Schema and seed in one transaction, guarded by user_version: two
        # processes opening a fresh home at once create and seed it once.
        with self._txn() as conn:
            svc.create_schema(conn, now_us(), self.path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> DemoBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- execute ---------------------------------------------------------------------

    def execute(self, req: ToolRequest) -> ToolOutcome:
        """Run one request; exactly one :class:`ToolOutcome` comes back (or,
        under ``crash_after_dispatch``, the process dies after committing)."""
        spec = demo_tool(req.tool)
        traits = TOOL_TRAITS.get(req.tool)
        if spec is None or traits is None or traits.control or not spec.enabled:
            why = "is a control tool the engine handles" if traits and traits.control else "is not a demo tool"
            return failure("unknown_or_disabled_tool", "UNKNOWN_TOOL", f"{printable(req.tool)!r} {why}")
        if req.version is not None and req.version != spec.version:
            return failure("unknown_or_disabled_tool", "VERSION_MISMATCH",
                          f"{req.tool}@{req.version} is not offered; the current version is {spec.version}",
                          requested=req.version, current=spec.version)
        problems = _schema_errors(req.tool, req.arguments)
        if problems:
            return failure("validation_failed", "INVALID_ARGUMENT", "; ".join(problems), problems=problems)
        self._enter_world(req.run_id)
        fault = next((f for f in req.faults if f.tool == req.tool and f.call == req.call_number), None)
        if traits.side_effect:
            outcome, fired = self._execute_side_effect(req, traits, fault)
        else:
            outcome, fired = self._execute_read(req, fault)
        if fired == "crash_after_dispatch":
            _faults.die()  # after the commit: the effect is recorded, the caller never hears of it
        if fired == "timeout_after_commit":
            return _timeout(req.tool)
        return outcome

    def workspaces_for(self, run_id: str) -> Workspaces:
        """The run's own workspaces, ``<home>/workspaces/<run_id>/<tenant>/``."""
        with self._lock:
            if run_id not in self._worlds:
                # A run id is one folder name (scenario ids are checked when
                # loaded); anything else would place files outside the home.
                if run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id or "\x00" in run_id:
                    raise BackendError(f"run id {run_id!r} cannot name a workspace folder")
                self._worlds[run_id] = Workspaces(self.home / "workspaces" / run_id)
            return self._worlds[run_id]

    def _enter_world(self, run_id: str) -> None:
        """Seed the run's own orders before its first call (see ``ensure_world``)."""
        if run_id in self._worlds:
            return
        with self._txn() as conn:
            svc.ensure_world(conn, run_id, now_us())
        self.workspaces_for(run_id)

    def _fire(self, conn: sqlite3.Connection, req: ToolRequest, fault: Fault | None) -> str | None:
        """Record the fault as fired; its kind, or None if there is none or it already fired."""
        if fault is None:
            return None
        cur = conn.execute(
            "INSERT INTO fault_firings (run_id, tool, call_number, kind, idempotency_key, fired_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (req.run_id, req.tool, req.call_number, fault.kind, req.idempotency_key, now_us()),
        )
        return fault.kind if cur.rowcount == 1 else None

    def _before(self, conn: sqlite3.Connection, req: ToolRequest, kind: str, fault: Fault | None) -> ToolOutcome:
        if kind == "object_ambiguous":
            # The request names more than one object (a customer with two
            # orders by that reference): nothing runs; a person says which.
            subject = evidence_subject(req.tool, req.arguments)
            candidates = list(fault.candidates) if fault is not None else []
            return failure("validation_failed", "OBJECT_AMBIGUOUS",
                           f"{req.tool}: {subject!r} matches {len(candidates)} objects", subject=subject,
                           candidates=candidates)
        if kind == "timeout_before_commit":
            return _timeout(req.tool)
        if kind == "rate_limit":
            return failure("cancelled", "RATE_LIMIT", f"{req.tool}: too many requests",
                          retry_after_s=RATE_LIMIT_RETRY_AFTER_S)
        if kind == "permission_denied":
            return failure("permission_denied", "PERMISSION_DENIED", f"{req.tool}: the provider denied this call")
        # state_conflict: the resource changed under the caller; report its
        # current version when it is one the tenant may see.
        details: dict[str, Any] = {}
        version = svc.order_version(conn, req.run_id, req.arguments.get("order_id"), req.tenant)
        if version is not None:
            details = {"order_id": req.arguments["order_id"], "current_version": version}
        return failure("validation_failed", "STATE_CONFLICT", f"{req.tool}: the resource changed; refresh it and replan", **details)

    def _execute_read(self, req: ToolRequest, fault: Fault | None) -> tuple[ToolOutcome, str | None]:
        fired = None
        if fault is not None:
            with self._txn() as conn:
                fired = self._fire(conn, req, fault)
                if fired in _BEFORE:
                    return self._before(conn, req, fired, fault), fired
        try:
            # Under the lock: another thread's open write transaction on the
            # shared connection must not show a read its uncommitted rows.
            with self._lock:
                outcome = self._run(self._conn, req, fails=fired == "fails")
        except ToolRefused as refused:
            outcome = failure(refused.outcome, refused.code, refused.message, **refused.details)
        return outcome, fired

    def _execute_side_effect(self, req: ToolRequest, traits: ToolTraits, fault: Fault | None) -> tuple[ToolOutcome, str | None]:
        args_hash = content_id(req.arguments)
        with self._txn() as conn:
            _check_fence(conn, req.run_id, req.fence)
            fired = self._fire(conn, req, fault)
            dedup = False
            if fired in _BEFORE:
                outcome = self._before(conn, req, fired, fault)
            else:
                recorded = None
                if traits.honours_idempotency_key:
                    recorded = conn.execute(
                        "SELECT tool, args_hash, outcome_json FROM executions WHERE idempotency_key = ?"
                        " ORDER BY execution_no LIMIT 1", (req.idempotency_key,)).fetchone()
                if recorded is not None and (recorded["tool"], recorded["args_hash"]) != (req.tool, args_hash):
                    outcome = failure("validation_failed", "IDEMPOTENCY_CONFLICT",
                                     f"idempotency key already used for a different {recorded['tool']} call")
                elif recorded is not None:
                    dedup = True
                    stored = ToolOutcome.from_dict(loads(recorded["outcome_json"]))
                    outcome = replace(stored, executed=False, deduplicated=True)
                else:
                    try:
                        outcome = self._run(conn, req, fails=fired == "fails")
                    except ToolRefused as refused:
                        outcome = failure(refused.outcome, refused.code, refused.message, **refused.details)
                    if outcome.executed:
                        self._record_execution(conn, req, traits, args_hash, outcome)
            conn.execute(
                "INSERT INTO deliveries (idempotency_key, tool, run_id, operation_id, call_number, received_at,"
                " fault, executed, deduplicated, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (req.idempotency_key, req.tool, req.run_id, req.operation_id, req.call_number, now_us(),
                 fired, int(outcome.executed), int(dedup), outcome.outcome),
            )
        return outcome, fired

    def _record_execution(self, conn: sqlite3.Connection, req: ToolRequest, traits: ToolTraits,
                          args_hash: str, outcome: ToolOutcome) -> None:
        number = conn.execute("SELECT COALESCE(MAX(execution_no), 0) + 1 FROM executions WHERE idempotency_key = ?",
                              (req.idempotency_key,)).fetchone()[0]
        conn.execute(
            "INSERT INTO executions (tool, idempotency_key, execution_no, honours_key, run_id, operation_id, tenant,"
            " call_number, args_hash, executed_at, outcome_json, result_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (req.tool, req.idempotency_key, number, int(traits.honours_idempotency_key), req.run_id,
             req.operation_id, req.tenant, req.call_number, args_hash, now_us(),
             canonical_json(outcome.to_dict()), canonical_json(outcome.result)),
        )

    # -- the tools ---------------------------------------------------------------------

    def _run(self, conn: sqlite3.Connection, req: ToolRequest, *, fails: bool) -> ToolOutcome:
        args, tenant, tool = req.arguments, req.tenant, req.tool
        ws = self.workspaces_for(req.run_id)
        if fails and tool != "tests.run" and tool != "reports.export":
            # The call reached the tool and it reported an error of its own.
            code, message = _TOOL_FAILURES[tool]
            return failure("validation_failed", code, f"{tool}: {message}")
        if tool == "workspace.read_file":
            result = ws.read_file(tenant, args["path"], req.forbidden_paths)
            svc.check_version(req, result["sha256"], result["path"])
            return _success(tool, result["path"], result, executed=False)
        if tool == "workspace.list":
            result = ws.list(tenant, args["path"], req.forbidden_paths)
            return _success(tool, result["path"], result, executed=False)
        if tool == "workspace.write_file":
            if req.expected_resource_version is not None:
                svc.check_version(req, ws.current_version(tenant, args["path"], req.forbidden_paths), args["path"])
            result = ws.write_file(tenant, args["path"], args["content"], req.forbidden_paths)
            return _success(tool, result["path"], result, executed=True)
        if tool == "tests.run":
            result = test_run_result(args["suite"], failing=fails)
            if fails:
                return ToolOutcome("validation_failed", "failed", result, (), "TESTS_FAILED", None, None, executed=False)
            return _success(tool, args["suite"], result, executed=False)
        if tool == "orders.get_order":
            order = svc.find_order(conn, req)
            return _success(tool, order["order_id"], svc.order_view(order), executed=False)
        if tool == "orders.update_address":
            return _success(tool, args["order_id"], svc.update_address(conn, req, now_us()), executed=True)
        if tool == "payments.refund":
            return _success(tool, args["order_id"], svc.refund(conn, req, now_us()), executed=True)
        if tool == "deploy.service":
            return _success(tool, args["service"], svc.deploy(conn, req, now_us()), executed=True)
        if tool == "reports.export":
            return self._export(conn, req, fails=fails)
        raise AssertionError(f"demo tool {tool} has no backend")  # the registry and this table disagree

    def _export(self, conn: sqlite3.Connection, req: ToolRequest, *, fails: bool) -> ToolOutcome:
        delay = float(req.arguments.get("delay_s", DEFAULT_EXPORT_DELAY_S))
        work_id = "work-" + content_id(["reports.export", req.idempotency_key])[:20]
        now = now_us()
        conn.execute(
            "INSERT INTO work (work_id, idempotency_key, run_id, tenant, tool, query, accepted_at, due_at, will_fail,"
            " state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
            (work_id, req.idempotency_key, req.run_id, req.tenant, req.tool, req.arguments["query"], now,
             now + round(delay * 1_000_000), int(fails)),
        )
        result = {"work_id": work_id, "query": req.arguments["query"], "eta_s": delay}
        return ToolOutcome("background_accepted", "accepted", result, (), None, None, work_id, executed=True)

    # -- reconciliation ---------------------------------------------------------------------

    def lookup(self, idempotency_key: str, *, run_id: str | None = None,
               fence: int | None = None) -> ToolOutcome | None:
        """What became of a key whose response was lost.

        ``run_id`` and ``fence``: the asker's claim on the run, as a send's
        (``ToolRequest.fence``). A lookup raises the run's fence: once a new
        driver has asked, a send from the driver that lost the run is
        refused, so what the lookup says stays true until the new driver acts.

        * the recorded outcome (of the latest execution) if it executed;
        * None if it is confirmed not executed (including every read-only
          tool: reads record nothing, and sending a read again is safe);
        * an ``unknown_outcome`` outcome (``OUTCOME_UNCONFIRMABLE``) when the
          provider cannot tell: the deploy API after a timed-out request.
          Only a person can settle that one.
        """
        if run_id is not None and fence is not None:
            with self._txn() as conn:
                _check_fence(conn, run_id, fence)
        with self._lock:
            last = self._conn.execute(
                "SELECT tool, fault FROM deliveries WHERE idempotency_key = ? ORDER BY delivery_id DESC LIMIT 1",
                (idempotency_key,)).fetchone()
            row = self._conn.execute(
                "SELECT outcome_json FROM executions WHERE idempotency_key = ? ORDER BY execution_no DESC LIMIT 1",
                (idempotency_key,)).fetchone()
        if last is not None and last["fault"] in _TIMEOUTS and not TOOL_TRAITS[last["tool"]].confirms_after_timeout:
            return failure("unknown_outcome", "OUTCOME_UNCONFIRMABLE",
                          f"{last['tool']} cannot say whether a timed-out request took effect; ask a person")
        if row is None:
            return None
        return replace(ToolOutcome.from_dict(loads(row["outcome_json"])), executed=False, deduplicated=False)

    # -- background work ------------------------------------------------------------------------

    def poll_work(self, work_id: str) -> WorkStatus:
        """The work's state now (by the engine clock, so ``LOOPLEDGER_NOW``
        moves it). Finishing is recorded on the first poll past the due time."""
        now = now_us()
        row = self._work(work_id)
        if row["state"] == "running" and now >= row["due_at"]:
            with self._txn() as conn:
                row = self._finish(conn, work_id, now)
        return self._status(row, now)

    def cancel_work(self, work_id: str) -> bool | None:
        """Ask the work to stop. True: stopped (or already cancelled); False:
        it had already finished; None: the stop cannot be confirmed (exports
        of ``UNCONFIRMABLE_CANCEL_DELAY_S`` or more run on the batch cluster,
        whose cancel only queues a request; such a job goes on and finishes)."""
        now = now_us()
        with self._txn() as conn:
            row = self._work(work_id, conn)
            if row["state"] == "running" and now >= row["due_at"]:
                row = self._finish(conn, work_id, now)
            if row["state"] == "cancelled":
                return True
            if row["state"] != "running":
                return False
            if (row["due_at"] - row["accepted_at"]) >= UNCONFIRMABLE_CANCEL_DELAY_S * 1_000_000:
                conn.execute("UPDATE work SET cancel_requested_at = COALESCE(cancel_requested_at, ?) WHERE work_id = ?",
                             (now, work_id))
                return None
            outcome = ToolOutcome("cancelled", "failed", {"work_id": work_id, "error": "CANCELLED",
                                                          "message": "cancelled before it finished"},
                                  (), "CANCELLED", None, work_id, executed=False)
            conn.execute("UPDATE work SET state = 'cancelled', finished_at = ?, outcome_json = ? WHERE work_id = ?",
                         (now, canonical_json(outcome.to_dict()), work_id))
            return True

    def _work(self, work_id: str, conn: sqlite3.Connection | None = None) -> sqlite3.Row:
        with self._lock:
            row = (conn or self._conn).execute("SELECT * FROM work WHERE work_id = ?", (work_id,)).fetchone()
        if row is None:
            raise UnknownWork(work_id)
        return row

    def _finish(self, conn: sqlite3.Connection, work_id: str, now: int) -> sqlite3.Row:
        row = self._work(work_id, conn)
        if row["state"] != "running":  # another process finished it first
            return row
        if row["will_fail"]:
            outcome = ToolOutcome("validation_failed", "failed", {"work_id": work_id, "error": "EXPORT_FAILED",
                                                       "message": "the warehouse query was aborted"},
                                  (), "EXPORT_FAILED", None, work_id, executed=True)
        else:
            report = svc.report(conn, row["run_id"], row["tenant"], row["query"])
            outcome = replace(_success("reports.export", work_id, {"work_id": work_id, **report}, executed=True),
                              work_id=work_id)
        state = "succeeded" if outcome.outcome == "success" else "failed"
        conn.execute("UPDATE work SET state = ?, finished_at = ?, outcome_json = ? WHERE work_id = ?",
                     (state, now, canonical_json(outcome.to_dict()), work_id))
        return self._work(work_id, conn)

    @staticmethod
    def _status(row: sqlite3.Row, now: int) -> WorkStatus:
        span = row["due_at"] - row["accepted_at"]
        if row["state"] != "running":
            outcome = ToolOutcome.from_dict(loads(row["outcome_json"]))
            done = row["state"] != "cancelled"
            return WorkStatus(row["work_id"], row["state"], 1.0 if done else _progress(row, row["finished_at"]), outcome)
        progress = 0.0 if span <= 0 else min(max((now - row["accepted_at"]) / span, 0.0), 0.99)
        return WorkStatus(row["work_id"], "running", progress, None)

    # -- counting (tests and ``expect.side_effects``) -------------------------------------------------

    def side_effects(self, run_id: str) -> dict[str, int]:
        """Real executions per tool for one run (what ``expect.side_effects`` compares)."""
        with self._lock:
            rows = self._conn.execute("SELECT tool, COUNT(*) FROM executions WHERE run_id = ? GROUP BY tool",
                                      (run_id,)).fetchall()
        return {tool: count for tool, count in rows}

    def execution_count(self, idempotency_key: str) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM executions WHERE idempotency_key = ?",
                                      (idempotency_key,)).fetchone()[0]

    def delivery_count(self, idempotency_key: str) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM deliveries WHERE idempotency_key = ?",
                                      (idempotency_key,)).fetchone()[0]


def _progress(row: sqlite3.Row, at: int | None) -> float:
    span = row["due_at"] - row["accepted_at"]
    if span <= 0 or at is None:
        return 1.0
    return min(max((at - row["accepted_at"]) / span, 0.0), 1.0)


#: What a ``fails`` fault makes each tool report (tests.run and reports.export have their own).
_TOOL_FAILURES: dict[str, tuple[str, str]] = {
    "workspace.read_file": ("IO_ERROR", "input/output error reading the file"),
    "workspace.write_file": ("IO_ERROR", "disk quota exceeded"),
    "workspace.list": ("IO_ERROR", "input/output error listing the directory"),
    "orders.get_order": ("TOOL_ERROR", "the order service answered 500 Internal Server Error"),
    "orders.update_address": ("TOOL_ERROR", "the address could not be validated by the carrier"),
    "payments.refund": ("PROVIDER_ERROR", "the card network declined the refund"),
    "deploy.service": ("DEPLOY_FAILED", "health checks failed; the rollout was rolled back"),
}
