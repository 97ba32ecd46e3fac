"""What goes into the journal and what comes out of it.

Inputs (``NewRun``, ``Artifact``, ``NewEvent``, ``Commit``) are built by the
engine; outputs (``RunRecord``, ``EventRecord``) are read back. Payloads are
plain JSON (dicts, lists, strings, numbers), never pickled objects, so a
journal can be read by any version of loopledger and by other tools.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loopledger.canonical import canonical_json, loads

from ._states import State

#: Version of every record this code writes. A reader upgrades older rows in
#: one place (``_store.upgrade_row``) and refuses newer ones.
SCHEMA_VERSION = 1

#: Append-only fact tables a commit may write, with the columns the engine
#: supplies. ``run_id``, ``seq`` and ``schema_version`` are filled in by the store.
FACT_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "candidates": (
        "step",
        "attempt",
        "candidate_id",
        "context_artifact_id",
        "finish_reason",
        "items_json",
        "prompt_version",
        "model_route",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "prompt_hash",
    ),
    "validations": (
        "step",
        "attempt",
        "candidate_id",
        "validator",
        "validator_version",
        "suite_version",
        "verdict",
        "code",
        "message",
        "evidence_json",
    ),
    "loop_diagnoses": ("step", "detector", "detector_version", "pattern", "evidence_json"),
}

#: Columns of a new operation (``run_id``, ``created_seq``, ``updated_seq`` and
#: ``schema_version`` are filled in by the store).
OPERATION_COLUMNS: tuple[str, ...] = (
    "operation_id",
    "step",
    "call_id",
    "tool",
    "tool_version",
    "idempotency_key",
    "canonical_args_json",
    "expected_resource_version",
    "policy_decision",
    "status",
    "outcome",
    "dispatch_count",
    "result_artifact_id",
    "work_id",
)

#: What an operation update may change; identity and canonical content never change.
OPERATION_MUTABLE: frozenset[str] = frozenset(
    {"status", "outcome", "dispatch_count", "result_artifact_id", "work_id"}
)

#: Run counters a commit may increment.
RUN_COUNTERS: frozenset[str] = frozenset(
    {"model_attempts", "tool_calls", "tokens_in", "tokens_out", "cost_usd"}
)

#: Run fields a commit may set.
RUN_SETTABLE: frozenset[str] = frozenset({"reason", "waiting_json", "reward"})


class Artifact:
    """An immutable, content-addressed value. Its id is the sha256 of its
    canonical JSON, so identical content is stored once. The canonical form
    is made once, when the artifact is."""

    __slots__ = ("kind", "body", "canonical", "artifact_id", "size_bytes")

    def __init__(self, kind: str, body: Any) -> None:
        self.kind = kind  # context, candidate, tool_result, question, final, diagnosis, ...
        self.body = body  # any JSON value
        self.canonical = canonical_json(body)
        data = self.canonical.encode("utf-8")
        # The same as content_id(body), from the bytes already made.
        self.artifact_id = hashlib.sha256(data).hexdigest()
        self.size_bytes = len(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Artifact) and (self.kind, self.artifact_id) == (other.kind, other.artifact_id)

    def __hash__(self) -> int:
        return hash((self.kind, self.artifact_id))

    def __repr__(self) -> str:
        return f"Artifact({self.kind!r}, id={self.artifact_id[:12]}, {self.size_bytes} bytes)"


@dataclass(frozen=True)
class NewRun:
    """A run to create. It starts in READY with state_version 1 and event 1."""

    run_id: str
    task_id: str
    tenant: str
    prompt_version: str = "default"
    model_route: str = "scripted"
    prompt_hash: str | None = None  # sha256 of the prompt file, when the run has one
    thread_id: str | None = None  # a new thread named after the run when None
    spec: Mapping[str, Any] = field(default_factory=dict)  # contract, budgets, ...
    artifacts: tuple[Artifact, ...] = ()
    #: The tool backend the run acts on (``DemoBackend.identity``), recorded
    #: in its ``run_created`` event; None for a backend without one.
    backend_id: str | None = None
    #: The batch of the ``run`` command that created it (``SQLRunStore.hold_batch``).
    batch_id: str | None = None


@dataclass(frozen=True)
class NewEvent:
    """An event that is not a state change (the transition event, if any, is
    made by the store from ``Commit.to_state``)."""

    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Commit:
    """One atomic step of a run: events, artifacts and facts are appended and
    the run advances, or nothing happens at all.

    The store checks ``expected_version`` against the run's ``state_version``
    (compare-and-set) and ``to_state`` against ``ALLOWED``.
    """

    run_id: str
    expected_version: int
    to_state: State | None = None  # None: events only, the state stays
    step: int | None = None  # None: keep the run's current step
    attempt: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)  # of the transition event
    events: tuple[NewEvent, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    facts: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    new_operations: tuple[Mapping[str, Any], ...] = ()
    operation_updates: tuple[Mapping[str, Any], ...] = ()  # each has operation_id
    counters: Mapping[str, float] = field(default_factory=dict)
    set_fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitResult:
    run_id: str
    state: State
    state_version: int
    first_seq: int
    last_seq: int
    late: bool = False  # the run was terminal: events were kept as late_event


@dataclass(frozen=True)
class RunRecord:
    """A run as committed. ``state_version`` is the token for the next commit."""

    run_id: str
    thread_id: str
    task_id: str
    tenant: str
    prompt_version: str
    model_route: str
    state: State
    state_version: int
    last_seq: int
    reason: str | None
    step: int
    attempt: int
    model_attempts: int
    tool_calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    reward: float | None
    waiting_json: str | None
    started_at: int  # microseconds since the epoch
    ended_at: int | None
    updated_at: int
    spec_json: str
    schema_version: int
    prompt_hash: str | None = None

    @property
    def spec(self) -> Any:
        return loads(self.spec_json)

    @property
    def waiting(self) -> Any:
        return loads(self.waiting_json) if self.waiting_json else None

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal


@dataclass(frozen=True)
class EventRecord:
    run_id: str
    seq: int
    ts: int
    kind: str
    from_state: str | None
    to_state: str | None
    step: int
    attempt: int
    state_version: int
    payload_json: str
    schema_version: int

    @property
    def payload(self) -> Any:
        return loads(self.payload_json)
