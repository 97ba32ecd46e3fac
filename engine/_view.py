"""A run's working view, derived from its journal by folding events.

The controller never keeps state that the journal does not have: the view
is a pure fold of the run's events (plus the run row), so a process that
resumes a run after a crash rebuilds exactly the view the crashed process
had after its last commit. Live, the controller folds each commit's events
as it writes them, so it never re-reads the history (the cost of a step does
not grow with the run's length).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loopledger.validators import Evidence, Operation, Pending, RunFacts, StepRecord

from ._records import Commit, RunRecord
from ._states import State

#: Operation outcomes that are a request's terminal result (CONTRACT).
TERMINAL_OUTCOMES = frozenset(
    {
        "success",
        "validation_failed",
        # Journals written before every failure was validation_failed.
        "failed",
        "permission_denied",
        "approval_required",
        "timeout",
        "cancelled",
        "background_accepted",
        "unknown_or_disabled_tool",
        # Only as the final word of a person on a send nobody could confirm;
        # while reconciling, an operation is ``in_flight`` with no outcome.
        "unknown_outcome",
    }
)


#: States by name, for folding (a dict lookup instead of an enum call).
_STATES: dict[str, State] = {state._value_: state for state in State}


@dataclass
class OpView:
    """An operation as the controller knows it."""

    operation_id: str
    idempotency_key: str
    call_id: str
    tool: str
    version: str | None
    arguments: dict[str, Any]
    args_hash: str
    step: int
    outcome: str = "pending"  # pending until its terminal result (or unknown_outcome)
    error_code: str | None = None
    work_id: str | None = None
    work_done: bool = False
    dispatches: int = 0
    resends: int = 0
    #: Why a person must approve this operation before it is sent (a tool
    #: that always needs approval, or a validator that asked); None: nobody.
    approval: str | None = None
    #: A person approved this operation (only for those that need approval).
    approved: bool = False
    #: The runtime's policy refused it (a tool outside the contract's
    #: allowed tools): never sent, its result is ``permission_denied``.
    denied: bool = False
    #: Sent and no answer recorded: whoever finds it so (a resumed process, or
    #: this one after a timeout) must reconcile before anything is sent again.
    in_flight: bool = False
    #: The last send timed out or the process died: the outcome is unknown.
    unknown: bool = False
    #: Never sent: a call of a candidate that was not accepted or that a
    #: cancel left unjudged, of a response that was not trusted, or whose
    #: arguments did not parse (see _refused.py). Its result is recorded;
    #: it is not one of its step's operations.
    refused: bool = False

    @property
    def settled(self) -> bool:
        return self.outcome in TERMINAL_OUTCOMES

    def model(self) -> Operation:
        """The validators' view of this operation, rebuilt only when it changed
        (a long run's facts must not cost more at every step)."""
        key = (self.outcome, self.error_code, self.work_id, self.work_done)
        cached = self.__dict__.get("_model")
        if cached is None or cached[0] != key:
            model = Operation(operation_id=self.operation_id, tool=self.tool, tool_version=self.version,
                              step=self.step, args_hash=self.args_hash, outcome=self.outcome,
                              error_code=self.error_code, work_id=self.work_id, work_done=self.work_done)
            cached = (key, model)
            self.__dict__["_model"] = cached
        return cached[1]


@dataclass
class RunView:
    run_id: str
    tenant: str
    prompt_version: str
    model_route: str
    spec: dict[str, Any]
    state: State
    state_version: int
    step: int
    attempt: int
    started_at: int
    counters: dict[str, float]
    context_id: str | None = None
    candidate_id: str | None = None
    #: The last candidate's items (as recorded): a cancel that finds it still
    #: in VALIDATING gives its tool calls their results.
    candidate_items: list[Any] = field(default_factory=list, repr=False)
    attempts_in_step: int = 0
    #: Candidates sent back for repair since the last accepted one.
    repairs: int = 0
    ops: dict[str, OpView] = field(default_factory=dict)
    evidence: dict[tuple[str, str | None], Evidence] = field(default_factory=dict)
    error_codes: list[str] = field(default_factory=list)
    history: list[StepRecord] = field(default_factory=list)
    dispatches: Counter[str] = field(default_factory=Counter)
    #: Messages to add to the next context: the last candidate, tool results, feedback.
    pending_messages: list[dict[str, Any]] = field(default_factory=list)
    #: Set on entering FINALIZING: the status and reason the run should end with.
    finalizing: dict[str, Any] | None = None
    waiting: dict[str, Any] | None = None
    #: Hashes of resume tokens already used: a token is consumed once.
    consumed_tokens: set[str] = field(default_factory=set)
    #: The tool backend the run acts on, and the batch that created it, from
    #: its ``run_created`` event.
    backend_id: str | None = None
    batch_id: str | None = None
    replies: int = 0
    cancel_requested: bool = False
    #: Operations whose background work was accepted and has not completed.
    background_open: dict[str, None] = field(default_factory=dict)
    #: The resume token of a wait this process just began; never stored.
    new_token: str | None = None
    # Facts of the step in progress, for its StepRecord.
    step_states: list[str] = field(default_factory=list)
    step_errors: list[str] = field(default_factory=list)
    step_evidence_before: int = 0
    step_completed: int = 0
    #: What background work that ended between two steps (polled in READY,
    #: or while the run waited for it) brought: new evidence, a completed
    #: operation, an error. It counts for the step that comes next, whose
    #: context carries it, not for the step already closed.
    carried_evidence: int = 0
    carried_completed: int = 0
    carried_errors: list[str] = field(default_factory=list)
    #: The validators' model of each operation, in ``ops`` order: an entry is
    #: marked stale when its operation is added or changes and rebuilt by the
    #: next facts(), so that a long run's operations are not all rebuilt at
    #: every candidate (nor built at all by a fold that never asks).
    op_models: list[Operation | None] = field(default_factory=list, repr=False)
    _op_index: dict[str, int] = field(default_factory=dict, repr=False)
    _stale_models: list[str] = field(default_factory=list, repr=False)  # operation ids
    #: Commits folded into this view but not yet written: held moves (see
    #: the controller), written with the next commit of whoever holds this
    #: view. Another caller's view of the same run never sees them.
    unwritten: tuple[Commit, ...] = field(default=(), repr=False)
    #: Read while another process (or thread) held the run: its state may be
    #: one the run is only passing through (see Controller.drive).
    held_elsewhere: bool = field(default=False, repr=False)

    @classmethod
    def blank(cls, run_id: str, tenant: str, prompt_version: str = "", model_route: str = "") -> RunView:
        """A view before any event (the replay folds traces into it)."""
        return cls(
            run_id=run_id, tenant=tenant, prompt_version=prompt_version, model_route=model_route, spec={},
            state=State.READY, state_version=1, step=0, attempt=0, started_at=0,
            counters={"model_attempts": 0, "tool_calls": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0},
        )

    @classmethod
    def from_record(cls, record: RunRecord) -> RunView:
        """A view before any event, for a run of the journal (``load`` folds its events in)."""
        view = cls.blank(record.run_id, record.tenant, record.prompt_version, record.model_route)
        view.spec, view.started_at = record.spec, record.started_at
        return view

    # -- folding --------------------------------------------------------

    def apply(self, kind: str, to_state: str | None, step: int, attempt: int, payload: dict[str, Any]) -> None:
        """Fold one event. The same function serves live commits and resume."""
        if kind == "transition" and to_state is not None:
            self._transition(_STATES.get(to_state) or State(to_state), step, attempt, payload)
        elif kind == "operation_result":
            self._operation_result(payload)
        elif kind == "operation_dispatched":
            op = self.ops[payload["operation_id"]]
            op.dispatches += 1
            op.in_flight = True
            self.dispatches[op.tool] += 1
        elif kind == "dispatch_refused":
            # The backend refused the send (rate limit): nothing was executed.
            # The runtime backs off and sends again: not an error of the step.
            self.ops[payload["operation_id"]].in_flight = False
            self._error(payload.get("error_code"), of_step=False)
        elif kind == "dispatch_unknown":
            # Reconciled by the runtime; the request's result, when it comes,
            # is what the step records (a timeout that stays one included).
            op = self.ops[payload["operation_id"]]
            op.unknown = True
            self._error(payload.get("error_code"), of_step=False)
        elif kind == "work_completed":
            self._work_completed(payload)
        elif kind == "step_closed":
            self.history.append(StepRecord(**{**payload, "states": tuple(payload["states"]),
                                              "calls": tuple(payload["calls"]), "errors": tuple(payload["errors"])}))
        elif kind == "reply_accepted":
            self.consumed_tokens.add(payload["token_hash"])
            self.replies += 1
            if payload.get("decision") == "approve" and payload.get("operation_id"):
                self.ops[payload["operation_id"]].approved = True
            if payload.get("message"):
                self.pending_messages.append({"role": "user", "content": payload["message"]})
        elif kind == "cancel_requested":
            self.cancel_requested = True
        elif kind == "token_reissued":
            self.waiting = payload["waiting"]
        elif kind == "calls_refused":
            # Kept with their results, but out of the validators' operations
            # (see _refused.py): never one of ``op_models``.
            for op in payload["operations"]:
                self.ops[op["operation_id"]] = OpView(**op, refused=True)
        elif kind == "candidate_recorded":
            self.candidate_id = payload["candidate_id"]
            self.candidate_items = payload["items"]
            self.pending_messages.append({"role": "assistant", "items": payload["items"]})
        # Other kinds (decisions, late_event, ...) carry no state the loop needs.

    def _transition(self, target: State, step: int, attempt: int, payload: dict[str, Any]) -> None:
        source = self.state
        self.state = target
        if source is State.READY and target is State.MODEL_RUNNING:
            self.step_states = [State.READY._value_]
            self.step_errors, self.carried_errors = self.carried_errors, []
            self.step_evidence_before = len(self.evidence) - self.carried_evidence
            self.step_completed = self.carried_completed
            self.carried_evidence = self.carried_completed = 0
            self.context_id = payload["context_id"]
            self.attempts_in_step = 0
            self.pending_messages = []
            if "clock_started_at" in payload:
                # The deadline counts from the first time the engine took
                # the run up (see Controller._ready), not from its creation.
                self.started_at = payload["clock_started_at"]
        if target is State.MODEL_RUNNING:
            self.attempts_in_step += 1
        self.step, self.attempt = step, attempt
        self.step_states.append(target._value_)
        # Operations are recorded on the move to TOOL_RUNNING, or with a
        # FINALIZING that ends the run before they are sent (a budget).
        if "operations" in payload:
            for op in payload["operations"]:
                added = self.ops[op["operation_id"]] = OpView(**op)
                self._remodel(added)
            if target is State.TOOL_RUNNING:
                self.repairs = 0  # a candidate was accepted: repairs count those in a row
        if target is State.READY:
            if payload.get("feedback"):
                self.pending_messages.append({"role": "user", "content": payload["feedback"]})
            if payload.get("repair"):
                self.repairs += 1
        if "resend" in payload:
            op = self.ops[payload["resend"]]
            op.in_flight = op.unknown = False
            op.resends += 1
        if target is State.FINALIZING:
            self.finalizing = {"status": payload.get("status"), "reason": payload.get("reason"),
                               "await_work": bool(payload.get("await_work"))}
        if target in (State.WAITING_USER, State.WAITING_TOOL):
            self.waiting = payload.get("waiting")
        elif source in (State.WAITING_USER, State.WAITING_TOOL):
            self.waiting = None

    def _operation_result(self, p: dict[str, Any]) -> None:
        op = self.ops[p["operation_id"]]
        op.outcome = p["outcome"]
        op.error_code = p.get("error_code")
        op.work_id = p.get("work_id") or op.work_id
        if op.refused:
            # The result of a call never sent: no error of the step, no
            # evidence, no message (the validators' feedback, or the
            # retry, is what the model gets), no operation of the facts.
            return
        self._remodel(op)
        op.in_flight = op.unknown = False
        if op.outcome == "background_accepted" and not op.work_done:
            self.background_open[op.operation_id] = None
        self._error(op.error_code)
        if op.outcome == "success":
            self.step_completed += 1
        self._add_evidence(p.get("evidence", ()), op.operation_id)
        if p.get("summary") is not None and op.settled:
            self.pending_messages.append(
                {"role": "tool", "call_id": op.call_id, "tool": op.tool, "outcome": op.outcome, "content": p["summary"]}
            )

    def _work_completed(self, p: dict[str, Any]) -> None:
        between = self.state in (State.READY, State.WAITING_TOOL)  # the step before is closed
        for op in [self.ops[op_id] for op_id in self.background_open]:
            if op.work_id == p["work_id"]:
                op.work_done = True
                self._remodel(op)
                self.background_open.pop(op.operation_id, None)
                known = len(self.evidence)
                self._add_evidence(p.get("evidence", ()), op.operation_id)
                if between:
                    self.carried_evidence += len(self.evidence) - known
                if p.get("error_code"):
                    self._error(p["error_code"], of_step=not between)
                    if between:
                        self.carried_errors.append(p["error_code"])
                elif between:
                    self.carried_completed += 1
                else:
                    self.step_completed += 1
                self.pending_messages.append(
                    {"role": "tool", "call_id": op.call_id, "tool": op.tool, "outcome": p.get("state"),
                     "content": p.get("summary")}
                )

    def _remodel(self, op: OpView) -> None:
        """Mark ``op``'s entry of ``op_models`` stale (the fold is the only
        place an operation is added or a field of its model changes)."""
        if op.operation_id not in self._op_index:
            self._op_index[op.operation_id] = len(self.op_models)
            self.op_models.append(None)
        self._stale_models.append(op.operation_id)

    def _error(self, code: str | None, of_step: bool = True) -> None:
        """``code`` seen by the run; ``of_step``: also an error of the step's
        record (the loop detectors' input), which holds what the agent's
        calls came to, not the sends the runtime retried or reconciled."""
        if code:
            self.error_codes.append(code)
            if of_step:
                self.step_errors.append(code)

    def _add_evidence(self, entries: Any, operation_id: str) -> None:
        for entry in entries:
            key = (entry["kind"], entry.get("subject"))
            if key not in self.evidence:
                self.evidence[key] = Evidence(
                    kind=entry["kind"], subject=entry.get("subject"), operation_id=operation_id, step=self.step
                )

    # -- what the loop asks of it ------------------------------------------

    def step_ops(self) -> list[OpView]:
        """The operations of the step in progress (not the calls it refused)."""
        # Operations are recorded in step order: the current step's are the
        # last ones, so this does not walk the whole run.
        found: list[OpView] = []
        for op in reversed(self.ops.values()):
            if op.step != self.step:
                break
            if not op.refused:
                found.append(op)
        found.reverse()
        return found

    def unsettled_ops(self) -> list[OpView]:
        return [op for op in self.step_ops() if not op.settled]

    def pending_background(self) -> list[OpView]:
        return [self.ops[op_id] for op_id in self.background_open]

    def step_record(self, with_result: dict[str, Any] | None = None) -> StepRecord:
        """The record of the step so far; ``with_result`` counts an
        operation result that is about to be committed with it."""
        calls = tuple(f"{op.tool}:{op.args_hash}" for op in self.step_ops())
        errors = tuple(self.step_errors)
        new_evidence = len(self.evidence) - self.step_evidence_before
        completed = self.step_completed
        if with_result is not None:
            if with_result.get("error_code"):
                errors += (with_result["error_code"],)
            fresh = {(e["kind"], e.get("subject")) for e in with_result.get("evidence", ())}
            new_evidence += len(fresh - self.evidence.keys())
            completed += with_result["outcome"] == "success"
        return StepRecord(
            run_id=self.run_id,
            step=self.step,
            states=tuple(self.step_states),
            calls=calls,
            errors=errors,
            new_evidence=new_evidence,
            completed_operations=completed,
        )

    def facts(self) -> RunFacts:
        # Only the current step can hold an unsettled operation: a step is
        # closed only once each of its requests has its terminal result.
        pending = [Pending(kind="operation", id=op.operation_id, tool=op.tool) for op in self.step_ops()
                   if not op.settled]
        pending += [Pending(kind="background", id=op.work_id or op.operation_id, tool=op.tool)
                    for op in self.pending_background()]
        models = self.op_models
        for operation_id in self._stale_models:
            models[self._op_index[operation_id]] = self.ops[operation_id].model()
        self._stale_models.clear()
        # Every part is a model validated when it was made (or a StepRecord, a
        # str): validating a long run's tuples again at every candidate would
        # cost in proportion to its length.
        return RunFacts.model_construct(
            evidence=tuple(self.evidence.values()),
            operations=tuple(self.op_models),
            pending=tuple(pending),
            error_codes=tuple(self.error_codes),
            history=tuple(self.history),
        )
