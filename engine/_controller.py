"""The controller: drives one run through its states, one commit at a time.

Every handler reads the run's view, does the work of its state, and ends
with exactly one commit that records what happened and moves the run on.
Nothing is acted on before it is committed: the context is frozen before
the model is called, the candidate before it is validated, the operation
before it is dispatched, the outcome before the run ends.

A move into a state whose work is pure (it reads only what the run has
recorded and touches nothing outside the process: VALIDATING, and the
READY that closes a step, after its tools or a repair) is *held*: its
commit is written together with the next one, in the same transaction,
before anything is acted on. A crash in between loses both, which is a
crash just before the held move: the run resumes from the last state
written (MODEL_RUNNING, asking the model again as after a broken stream;
or TOOL_RUNNING with the operation in flight, reconciled by its key). So a
model call and its validation, or a tool's result and the next context,
cost one fsync, and still nothing is sent, called or delivered before it
is durable.

    READY          budgets; freeze the context artifact -> MODEL_RUNNING
    MODEL_RUNNING  collect the stream into a candidate -> VALIDATING, or a
                   new attempt on the same context, or FINALIZING
    VALIDATING     the suite decides -> TOOL_RUNNING | READY (repair) |
                   WAITING_USER | FINALIZING
    TOOL_RUNNING   dispatch committed operations one by one -> READY |
                   RECONCILING | WAITING_TOOL | FINALIZING
    RECONCILING    look the idempotency key up -> record, re-send or ask
    WAITING_TOOL   background work: wake when it completes
    FINALIZING     completion invariants -> the one terminal state
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from itertools import islice
from functools import lru_cache
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loopledger.canonical import canonical_json, loads
from loopledger.validators import Context, Decision, DecisionInput, Suite, SuiteResult, Verdict, tool_allowed
from loopledger.validators._jsonschema import unusable

from . import _faults
from . import _otel as otel
from ._backends import DemoBackend, Fault, Fenced, ToolOutcome, ToolRequest, failure
from ._clock import now_us
from ._conversation import CLAIM_FORMAT, conversation
from ._decision import decision_input, resolve_context
from ._errors import BadInput, ClaimLost, ModelError, NotDrivableHere, StaleStateVersion, TerminalAlreadySet
from ._model import Collected, ModelAdapter, ModelRequest, ScriptExhausted, StreamError, collect
from ._people import PeopleMixin, wait_over
from ._prompts import load_prompt
from ._records import Artifact, Commit, NewEvent, RunRecord
from ._refused import judged, tool_call_items, unparsed, untrusted, with_refusals
from ._results import reduce_result
from ._scenario import Scenario
from ._states import TERMINAL, State
from ._store import SQLRunStore
from ._tools import DEMO_TOOLS, TOOL_TRAITS, tool_registry_snapshot
from ._view import OpView, RunView

#: Attempts of one step (same context) before the model is given up on.
MAX_ATTEMPTS_PER_STEP = 3
#: Candidates sent back for repair in a row (an accepted one starts the count
#: again) before the run ends FAILED / validation_failed.
MAX_REPAIRS = 3
#: Rate-limited dispatches of one operation before it fails.
MAX_RATE_LIMIT_RETRIES = 3
#: Sends of an operation across restarts (the first and the re-sends, each
#: after the backend confirmed it had not executed) before one that every
#: process running it dies on is given up (``cancelled``).
RESTART_SENDS = 3
#: Keys of a loop validator's evidence that a loop_diagnoses row holds in
#: columns of its own (detector, pattern, step).
_ROW_COLUMNS = frozenset({"detector", "pattern", "since_step"})
#: Codes of decisions that stop the run instead of going back to the model.
STOP_CODES = {"protocol_error": "protocol_error", "loop_detected": "loop_detected", "no_progress": "no_progress"}
#: What a person answers about a send nobody could confirm.
CONFIRM_SCHEMA = {
    "type": "object",
    "properties": {"executed": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["executed"],
    "additionalProperties": False,
}
#: Validators whose rejections may be settled by work still running.
EVIDENCE_CHECKS = frozenset({"completion_gate", "references"})
#: The states a run waits in; their ``reason`` says what for.
_WAITS = frozenset({State.WAITING_USER, State.WAITING_TOOL})

#: Context artifacts kept in memory by id (they are immutable).
CONTEXT_CACHE = 1024


@lru_cache(maxsize=1)
def _registry() -> Artifact:
    """The demo tool registry snapshot, an artifact of its own: every context
    names it by id (``tools_ref``), so it is stored once, not in each step."""
    return Artifact("tool_registry", {"tools": tool_registry_snapshot()})


@dataclass
class RunConfig:
    """What a run needs besides its journal: fixed when the run is created,
    rebuilt identically from the run's spec on resume."""

    scenario: Scenario
    suite: Suite
    model: ModelAdapter
    faults: tuple[Fault, ...]
    #: Tools that run only after a person approved the operation.
    approval_required: frozenset[str] = frozenset(t.name for t in DEMO_TOOLS if t.requires_approval)


def _payload_ops(ops: list[OpView]) -> list[dict[str, Any]]:
    """The operations as a transition's payload records them (what the run view reads back)."""
    return [{"operation_id": op.operation_id, "idempotency_key": op.idempotency_key, "call_id": op.call_id,
             "tool": op.tool, "version": op.version, "arguments": op.arguments, "args_hash": op.args_hash,
             "step": op.step, **({"denied": True} if op.denied else {}),
             **({"approval": op.approval} if op.approval else {})} for op in ops]


def _task(contract: Any) -> str:
    """The run's first user message: the goal, and what the completion gate
    and the policy will hold the answer to, so that a model learns the
    acceptance criteria from the task and not from its first rejection."""
    lines = [contract.goal]
    if contract.required_evidence:
        lines.append("Done when the tools have recorded this evidence (kind, or kind:subject): "
                     + ", ".join(contract.required_evidence) + ".")
    if contract.forbidden_paths:
        lines.append("Out of scope, never to be touched: " + ", ".join(contract.forbidden_paths) + ".")
    # The validators check claims stated so (engine/_conversation.py, claims_in).
    lines.append(f"In the final answer, state each claim on its own line as: {CLAIM_FORMAT}.")
    return "\n".join(lines)


def _approvals_asked(inp: DecisionInput, blocking: Any) -> dict[str, str]:
    """The candidate's calls a person must approve before they run, each
    with why: those an ``ask`` decision names (``call_id`` in its evidence,
    or in one of its ``other_issues``), and all of them for an ``ask`` that
    names none of its calls (nothing runs that a person was to see first)."""
    ids = [call.call_id for call in inp.proposed_calls]
    asked: dict[str, list[str]] = {}
    for decision in blocking:
        if decision.verdict is not Verdict.ASK:
            continue
        evidence = decision.evidence if isinstance(decision.evidence, dict) else {}
        issues = [(decision.message, evidence)] + [
            (other.get("message"), other.get("evidence")) for other in evidence.get("other_issues", ())
            if isinstance(other, dict) and other.get("verdict") == Verdict.ASK.value]
        named = [(message, e["call_id"]) for message, e in issues if isinstance(e, dict) and e.get("call_id") in ids]
        for message, call_id in named or [(decision.message, call_id) for call_id in ids]:
            asked.setdefault(call_id, []).append(f"{decision.validator}: {message}")
    return {call_id: "; ".join(whys) for call_id, whys in asked.items()}


def _call_items(inp: DecisionInput) -> list[dict[str, Any]]:
    """A candidate's tool calls as recorded (JSON objects): what _refused.py reads."""
    return [call.model_dump(mode="json") for call in inp.candidate.tool_calls]


def _result_parts(op: OpView, outcome: ToolOutcome) -> tuple[list[Artifact], dict[str, Any], dict[str, Any]]:
    """A request's terminal result as recorded: the result artifact (none
    without a result), the ``operation_result`` event's payload, and the
    operation's row update."""
    artifacts: list[Artifact] = []
    result_id = None
    summary = None
    if outcome.result is not None:
        full = Artifact("tool_result", {"operation_id": op.operation_id, "tool": op.tool, "result": outcome.result})
        artifacts.append(full)
        result_id = full.artifact_id
        summary = reduce_result(op.tool, outcome.result)
        if isinstance(summary, dict) and "full_artifact" in summary:
            summary = {**summary, "full_artifact": result_id}
    event = {
        "operation_id": op.operation_id,
        "tool": op.tool,
        "outcome": outcome.outcome,
        "status": outcome.status,
        "error_code": outcome.error_code,
        "evidence": [dict(e) for e in outcome.evidence],
        "work_id": outcome.work_id,
        "result_artifact_id": result_id,
        "summary": summary,
    }
    update = {"operation_id": op.operation_id, "status": outcome.status, "outcome": outcome.outcome,
              "result_artifact_id": result_id, "work_id": outcome.work_id}
    return artifacts, event, update


class Controller(PeopleMixin):
    @property
    def secret(self) -> bytes:
        with self._secret_lock:
            if callable(self._secret):
                self._secret = self._secret()
            return self._secret

    def __init__(
        self,
        store: SQLRunStore,
        backend: DemoBackend,
        config_for: Callable[[RunRecord], RunConfig],
        secret: bytes | Callable[[], bytes],
        sleep: Callable[[float], None] = time.sleep,
        prompts: Path | None = None,
    ) -> None:
        # The signing secret, or how to read it: read when a token is first
        # signed or checked, so a command that signs nothing (cancel) does not
        # need it (nor is refused over its file's mode).
        self._secret: bytes | Callable[[], bytes] = secret
        self._secret_lock = threading.Lock()
        #: The data directory's own prompt versions (``<home>/prompts``), read before the bundled ones.
        self.prompts = prompts
        self._contexts: OrderedDict[str, tuple[dict[str, Any], Context | None]] = OrderedDict()
        #: Candidates just recorded, read back from their canonical text
        #: (exactly what the journal returns) by the validation that follows.
        self._candidates: OrderedDict[str, Any] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.store = store
        self.backend = backend
        self.config_for = config_for
        self.sleep = sleep
        #: Called with the run's view in FINALIZING, just before the terminal
        #: state is committed (and again if a crash comes between the two):
        #: the last moment at which what belongs with the run can be written
        #: and found again by a resume. The runner writes scenario labels here.
        self.before_terminal: Callable[[RunView], None] | None = None
        self._handlers = {
            State.READY: self._ready,
            State.MODEL_RUNNING: self._model_running,
            State.VALIDATING: self._validating,
            State.TOOL_RUNNING: self._tool_running,
            State.RECONCILING: self._reconciling,
            State.WAITING_TOOL: self._waiting_tool,
            State.FINALIZING: self._finalizing,
        }

    # -- loading and committing ------------------------------------------

    def load(self, run_id: str) -> RunView:
        """Rebuild the view of a run from its journal."""
        return self._load(run_id)[0]

    def _load(self, run_id: str) -> tuple[RunView, RunRecord]:
        record = self.store.get_run(run_id)
        view = RunView.from_record(record)
        for event in self.store.events(run_id):
            if event.kind == "run_created":
                view.backend_id, view.batch_id = event.payload.get("backend"), event.payload.get("batch")
                continue
            view.apply(event.kind, event.to_state, event.step, event.attempt, event.payload)
        view.state, view.state_version = record.state, record.state_version
        view.step, view.attempt = record.step, record.attempt
        view.counters = {
            "model_attempts": record.model_attempts,
            "tool_calls": record.tool_calls,
            "tokens_in": record.tokens_in,
            "tokens_out": record.tokens_out,
            "cost_usd": record.cost_usd,
        }
        return view, record

    def _commit(self, view: RunView, commit: Commit, *, hold: bool = False) -> None:
        """Write ``commit`` (after the view's held ones, in one transaction)
        and fold it into the view; with ``hold``, fold it now and write it
        with the next commit."""
        if (view.state in _WAITS and commit.to_state is not None and commit.to_state not in _WAITS
                and "reason" not in commit.set_fields):
            # A run that stops waiting no longer has the wait's reason.
            commit = replace(commit, set_fields={**commit.set_fields, "reason": None})
        held, view.unwritten = view.unwritten, ()
        if hold:
            view.unwritten = (*held, commit)
            version = view.state_version + 1
        else:
            try:
                version = self.store.commit(*held, commit).state_version
            except StaleStateVersion:
                if held:
                    self._keep_held(view.run_id, held)
                raise
        self._fold(view, commit, version)

    #: What a process other than the driver appends to a run (at its head,
    #: whatever its version): a request, which moves no state.
    _REQUESTS = frozenset({"cancel_requested"})

    def _keep_held(self, run_id: str, held: tuple[Commit, ...]) -> None:
        """The driver's held moves met a version moved on by a request only
        (a cancel, appended at the run's head): they record what already
        happened (a model call's candidate, its tokens and cost, its
        decisions), so they are written after it instead of being lost. The
        commit that met the request is not: what it would have started is
        the driver's to reconsider, with the request in view. Anything else
        that moved the run, or a second race, leaves them unwritten, as
        before."""
        expected = held[0].expected_version
        later = [e for e in self.store.events(run_id) if e.state_version > expected]
        if not later or any(e.kind not in self._REQUESTS or e.to_state is not None for e in later):
            return
        shift = max(e.state_version for e in later) - expected
        try:
            self.store.commit(*(replace(c, expected_version=c.expected_version + shift) for c in held))
        except (StaleStateVersion, TerminalAlreadySet):
            pass

    def _flush(self, view: RunView) -> None:
        """Write the view's held commits, if any."""
        held, view.unwritten = view.unwritten, ()
        if held:
            self.store.commit(*held)

    def _fold(self, view: RunView, commit: Commit, version: int) -> None:
        view.state_version = version
        step = view.step if commit.step is None else commit.step
        attempt = view.attempt if commit.attempt is None else commit.attempt
        if commit.to_state is not None:
            view.apply("transition", commit.to_state._value_, step, attempt, dict(commit.payload))
        for event in commit.events:
            view.apply(event.kind, None, step, attempt, dict(event.payload))
        view.step, view.attempt = step, attempt
        for name, delta in commit.counters.items():
            view.counters[name] += delta

    def _move(self, view: RunView, to: State, *, hold: bool = False, **kwargs: Any) -> None:
        self._commit(view, Commit(view.run_id, view.state_version, to, **kwargs), hold=hold)

    # -- driving ------------------------------------------------------------

    def drive(self, run_id: str, *, wait_s: float = 0.0) -> RunView:
        """Advance the run until it is terminal or waits for something outside.
        One driver at a time: when another process (or thread) drives the run
        and has not let go of it within ``wait_s`` seconds, the run is left to
        it and returned as the journal has it."""
        if not self.store.claim(run_id, wait_s):
            view = self.load(run_id)
            view.held_elsewhere = True
            return view
        try:
            return self._drive(run_id)
        finally:
            self.store.release(run_id)

    def _nothing_due(self, view: RunView) -> bool:
        """A run that waits for a person and has nothing to do until they
        answer: its wait has not run out and no cancel was asked."""
        return view.state is State.WAITING_USER and not view.cancel_requested and not wait_over(view.waiting)

    def _maker_alive(self, view: RunView) -> bool:
        """Whether the ``run`` command that made the run lives in another
        process (holding its batch), and so will drive it."""
        return view.batch_id is not None and self.store.batch_held_elsewhere(view.batch_id)

    def _drive(self, run_id: str) -> RunView:
        view, record = self._load(run_id)
        if view.state_version == 1 and self._maker_alive(view):
            # Not driven yet, and its maker will (delivering its scenario's
            # scripted replies): not for this process.
            return view
        try:
            config = self._config_here(view, record)
        except NotDrivableHere:
            # Another data directory's run whose maker is alive and drives
            # it, or one that waits for a person with nothing due (no reply
            # has come, its wait has not run out, no cancel was asked): not
            # this process's to drive, nor to report as left behind.
            if self._maker_alive(view) or self._nothing_due(view):
                return view
            raise
        spans = otel.spans()  # OpenTelemetry's, when the application set a provider up
        with spans.drive(view, record.task_id):
            # An error leaves the view, and the moves it holds, unwritten: as
            # if the process had died there.
            while view.state not in TERMINAL:
                try:
                    with spans.state(view):
                        if view.cancel_requested and view.state is not State.FINALIZING:
                            self._cancel(view)
                            continue
                        if view.state is State.WAITING_USER:
                            if not self._expire_if_due(view):
                                break
                            continue
                        if self._handlers[view.state](view, config) is False:  # background work still runs
                            break
                except (StaleStateVersion, TerminalAlreadySet):
                    # Someone else moved the run (a reply, a cancel, another
                    # worker), or ended it (this process's move is kept as a
                    # late event): start again from what the journal says now.
                    view = self.load(run_id)
            self._flush(view)
            spans.left(view)
        return view

    def _config_here(self, view: RunView, record: RunRecord) -> RunConfig:
        """The run's configuration, if this process can drive the run;
        else :class:`NotDrivableHere`. A run acts on one tool backend:
        driven from a process whose backend is another (a data directory
        sharing the journal), it would reconcile its calls against a backend
        that never saw them, and send them again. And its model route must
        be usable here (SDK installed, key set)."""
        mine = getattr(self.backend, "identity", None)
        if view.backend_id and mine and view.backend_id != mine:
            raise NotDrivableHere(view.run_id, f"its tools act on the backend {view.backend_id} of another data "
                                               "directory sharing this journal; drive it from that one (its --home)")
        try:
            return self.config_for(record)
        except BadInput as exc:  # its model route or suite cannot be set up here
            raise NotDrivableHere(view.run_id, exc.reason) from None

    # -- READY ----------------------------------------------------------------

    def _ready(self, view: RunView, config: RunConfig) -> None:
        # Background work that has ended since the last step is recorded now,
        # so the step's context carries its results and the gate sees its
        # evidence (not only after a final answer waited for it).
        self._collect_ended_work(view)
        first = view.step == 0
        if first:
            # The deadline's clock starts when the engine first takes the
            # run up: a run created with a batch and queued behind the others
            # has not started, and its outcome must not depend on the batch.
            view.started_at = now_us()
        exhausted = self._exhausted_budget(view, config)
        if exhausted:
            self._finalize(view, "BUDGET_EXHAUSTED", exhausted)
            return
        body = self._context_body(view, config)
        context = Artifact("context", body)
        registry = _registry()
        plain = {**body, "tools": registry.body["tools"]}
        self._remember(context.artifact_id, plain, Context(
            messages=plain["messages"], tools=DEMO_TOOLS, policy=plain["policy"], contract=plain["contract"],
            tenant=plain["tenant"], budget=plain["budget"]))
        payload: dict[str, Any] = {"context_id": context.artifact_id}
        if first:
            payload["clock_started_at"] = view.started_at
        self._move(
            view,
            State.MODEL_RUNNING,
            step=view.step + 1,
            attempt=1,
            payload=payload,
            artifacts=(context, registry),
        )

    @staticmethod
    def _past_deadline(view: RunView, config: RunConfig) -> bool:
        deadline_s = config.scenario.budgets.deadline_s
        return deadline_s is not None and now_us() - view.started_at >= deadline_s * 1_000_000

    def _exhausted_budget(self, view: RunView, config: RunConfig, *, new_step: bool = True) -> str | None:
        """The budget a next model call would go past, if any: before a new
        step (READY), or before a new attempt in this step (``new_step``
        False: the step's own budget is not spent by a retry)."""
        b = config.scenario.budgets
        c = view.counters
        if self._past_deadline(view, config):
            return "deadline"
        if new_step and b.max_steps is not None and view.step >= b.max_steps:
            return "max_steps"
        # max_tool_calls is not checked here: a run that used every call it
        # had may still answer without one. A proposal that would go past it
        # ends the run in VALIDATING, before anything is dispatched.
        if b.max_tokens is not None and c["tokens_in"] + c["tokens_out"] >= b.max_tokens:
            return "max_tokens"
        if b.max_cost is not None and c["cost_usd"] >= b.max_cost:
            return "max_cost"
        if b.max_attempts is not None and c["model_attempts"] >= b.max_attempts:
            return "max_attempts"
        return None

    def _remaining(self, view: RunView, config: RunConfig) -> dict[str, Any]:
        b = config.scenario.budgets
        c = view.counters

        def left(limit: float | None, used: float) -> float | None:
            return None if limit is None else max(limit - used, 0)

        deadline = None
        if b.deadline_s is not None:
            deadline = round(max(b.deadline_s - (now_us() - view.started_at) / 1e6, 0.0), 3)
        return {
            "steps": left(b.max_steps, view.step),
            "tool_calls": left(b.max_tool_calls, c["tool_calls"]),
            "tokens": left(b.max_tokens, c["tokens_in"] + c["tokens_out"]),
            "cost_usd": left(b.max_cost, c["cost_usd"]),
            "model_attempts": left(b.max_attempts, c["model_attempts"]),
            "deadline_s": deadline,
        }

    def _context_body(self, view: RunView, config: RunConfig) -> dict[str, Any]:
        """The frozen input of the step. Messages are the ones added since the
        previous step's context, which the body links to: the chain holds the
        whole conversation, and a step's cost does not grow with it."""
        scenario = config.scenario
        if view.context_id is None:
            prompt = load_prompt(view.prompt_version, self.prompts)
            prompt_hash = prompt.sha256
            messages = [
                {"role": "system", "content": prompt.text},
                {"role": "user", "content": _task(scenario.contract)},
            ]
        else:
            # The prompt was read once, at step 1: an edited file never changes a run midway.
            prompt_hash = self._context(view.context_id)[0].get("prompt_hash")
            messages = view.pending_messages
        contract = scenario.contract.model_dump(mode="json")
        return {
            "previous_context": view.context_id,
            "messages": messages,
            "memory": {},
            # Evidence recorded since the previous context (which this one
            # links to), like the messages: the chain holds all of it.
            "retrieval": [
                {"kind": e.kind, "subject": e.subject}
                for e in islice(view.evidence.values(), view.step_evidence_before, None)
            ],
            "tools_ref": _registry().artifact_id,
            "policy": {"approval_required": [t.name for t in DEMO_TOOLS if t.requires_approval]},
            "contract": contract,
            "tenant": view.tenant,
            "model_route": view.model_route,
            "prompt_version": view.prompt_version,
            "prompt_hash": prompt_hash,
            "budget": self._remaining(view, config),
        }

    # -- MODEL_RUNNING ----------------------------------------------------------

    def _model_running(self, view: RunView, config: RunConfig) -> None:
        context = self._context(view.context_id)[0]
        request = ModelRequest(
            run_id=view.run_id,
            step=view.step,
            attempt=view.attempt,
            attempt_index=int(view.counters["model_attempts"]),
            prompt_version=view.prompt_version,
            context=context,
            conversation=lambda: conversation(view.context_id, lambda cid: self._context(cid)[0]),
            time_left_s=self._deadline_left(view, config) if config.scenario.budgets.deadline_s is not None else None,
            tokens_left=self._tokens_left(view, config),
        )
        try:
            collected = collect(config.model.stream(request))
        except ScriptExhausted as exc:
            self._finalize(view, "FAILED", "model_error", detail=str(exc))
            return
        except ModelError as exc:  # an adapter that raises instead of yielding StreamError
            collected = Collected([], "error", error=StreamError(str(exc), exc.code, exc.retryable,
                                                                  exc.retry_after_s))
        candidate, common = self._recorded_candidate(view, context, collected)
        if collected.trusted:
            with self._cache_lock:
                self._candidates[candidate.artifact_id] = loads(candidate.canonical)
                while len(self._candidates) > CONTEXT_CACHE:
                    self._candidates.popitem(last=False)
            # Held: validation is pure, and its commit carries this one.
            self._move(view, State.VALIDATING, hold=True, payload={"candidate_id": candidate.artifact_id},
                       **common)
            return
        # Not trusted: its tool calls are never sent, and each gets its result now.
        common = with_refusals(common, view, untrusted(tool_call_items(collected.items), collected.finish_reason))
        self._after_untrusted(view, config, collected, candidate, common)

    @staticmethod
    def _recorded_candidate(view: RunView, context: dict[str, Any],
                            collected: Collected) -> tuple[Artifact, dict[str, Any]]:
        """The attempt's candidate artifact, and what its commit writes
        whatever comes next: the artifact, its ``candidates`` row, the
        usage counters and the ``candidate_recorded`` event."""
        body = {
            "items": collected.items,
            "finish_reason": collected.finish_reason,
            "context_id": view.context_id,
            "step": view.step,
            "attempt": view.attempt,
            "prompt_version": view.prompt_version,
            "prompt_hash": context.get("prompt_hash"),
            "model_route": view.model_route,
        }
        if collected.error is not None:
            body["error"] = {"code": collected.error.code, "message": collected.error.message,
                             "retryable": collected.error.retryable}
        candidate = Artifact("candidate", body)
        usage = collected.usage
        row = {
            "step": view.step,
            "attempt": view.attempt,
            "candidate_id": candidate.artifact_id,
            "context_artifact_id": view.context_id,
            "finish_reason": collected.finish_reason,
            "items_json": collected.items,
            "prompt_version": view.prompt_version,
            "prompt_hash": context.get("prompt_hash"),
            "model_route": view.model_route,
            "tokens_in": usage.tokens_in,
            "tokens_out": usage.tokens_out,
            "cost_usd": usage.cost_usd,
        }
        return candidate, {
            "artifacts": (candidate,),
            "facts": {"candidates": (row,)},
            "counters": {"model_attempts": 1, "tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out,
                         "cost_usd": usage.cost_usd},
            "events": (NewEvent("candidate_recorded", {"candidate_id": candidate.artifact_id,
                                                       "items": collected.items}),),
        }

    def _after_untrusted(self, view: RunView, config: RunConfig, collected: Collected, candidate: Artifact,
                         common: dict[str, Any]) -> None:
        """A candidate whose stream was not trusted to its end (cut, broken,
        filtered, failed): stop on a filter or a fatal error, else a new
        attempt on the same context, unless the step's attempts or a budget
        are used up."""
        if collected.finish_reason == "content_filter":
            self._move(view, State.FINALIZING, payload={"status": "POLICY_STOPPED", "reason": "policy",
                                                         "detail": "the provider filtered the output"}, **common)
        elif collected.error is not None and not collected.error.retryable:
            # Bad credentials, a malformed request: the same context fails the same way.
            self._move(view, State.FINALIZING, payload={
                "status": "FAILED", "reason": "model_error",
                "detail": f"{collected.error.code}: {collected.error.message}"}, **common)
        elif view.attempts_in_step < MAX_ATTEMPTS_PER_STEP:
            # A broken, cut or failed stream: a new attempt on the same context.
            # Its output is never merged with this one's. The candidate is
            # recorded under its own attempt, in the retry's transaction.
            self._commit(view, Commit(view.run_id, view.state_version, None, **common), hold=True)
            exhausted = self._exhausted_budget(view, config, new_step=False)
            if exhausted:
                # A retry is a model call like any other: no last try past a budget.
                self._move(view, State.FINALIZING, payload={
                    "status": "BUDGET_EXHAUSTED", "reason": exhausted,
                    "detail": f"attempt {view.attempt} ended '{collected.finish_reason}'; no retry past {exhausted}"})
                return
            wait = self._backoff(view, collected.error)
            if wait is not None and wait >= self._deadline_left(view, config):
                # The next attempt would begin with no time left: the deadline
                # ends the run now rather than after a pause and a call that
                # cannot finish.
                asked = collected.error is not None and collected.error.code == "rate_limited"
                self._move(view, State.FINALIZING, payload={
                    "status": "BUDGET_EXHAUSTED", "reason": "deadline",
                    "detail": (f"the provider asked to wait {wait:.1f}s" if asked
                               else f"a retry would begin after a {wait:.1f}s pause") + ", past the run's deadline"})
                return
            payload: dict[str, Any] = {"retry_of": candidate.artifact_id, "finish_reason": collected.finish_reason}
            if collected.error is not None:
                # Said where a reader of the events looks, not only in the artifact.
                payload["error"] = {"code": collected.error.code, "message": collected.error.message}
            if wait:
                payload["backoff_s"] = round(wait, 3)
            self._move(view, State.MODEL_RUNNING, attempt=view.attempt + 1, payload=payload)
            if wait:
                # After the commit: a crash while waiting resumes into the new attempt.
                self.sleep(wait)
        else:
            detail = f"{view.attempts_in_step} attempts ended '{collected.finish_reason}'"
            if collected.error is not None:
                detail += f"; the last: {collected.error.code}: {collected.error.message}"
            self._commit(view, Commit(view.run_id, view.state_version, None, **common), hold=True)
            # A budget this attempt used up is the reason, as it would be had
            # the step allowed another attempt: the user's limit comes first.
            exhausted = self._exhausted_budget(view, config, new_step=False)
            status, reason = ("BUDGET_EXHAUSTED", exhausted) if exhausted else ("FAILED", "model_error")
            self._move(view, State.FINALIZING, payload={"status": status, "reason": reason, "detail": detail})

    #: A provider's codes for "struggling": the next attempt waits a little
    #: instead of going out at once, as the SDKs' own retries would.
    _STRUGGLING = frozenset({"server_error", "overloaded", "unavailable"})

    @classmethod
    def _backoff(cls, view: RunView, error: StreamError | None) -> float | None:
        """Seconds to wait before the next attempt: what a rate-limited
        provider asked for, else 1, 2, 4 s by attempt; after a server error
        or an overloaded provider, 0.5, 1 s by attempt."""
        if error is None:
            return None
        if error.code == "rate_limited":
            if error.retry_after_s is not None:
                return error.retry_after_s
            return float(2 ** (view.attempts_in_step - 1))
        if error.code in cls._STRUGGLING:
            return 0.5 * 2 ** (view.attempts_in_step - 1)
        return None

    @staticmethod
    def _tokens_left(view: RunView, config: RunConfig) -> int | None:
        limit = config.scenario.budgets.max_tokens
        if limit is None:
            return None
        return max(int(limit - view.counters["tokens_in"] - view.counters["tokens_out"]), 0)

    def _deadline_left(self, view: RunView, config: RunConfig) -> float:
        deadline = config.scenario.budgets.deadline_s
        if deadline is None:
            return float("inf")
        return deadline - (now_us() - view.started_at) / 1e6

    # -- VALIDATING -------------------------------------------------------------

    def decision_input(self, view: RunView) -> DecisionInput:
        body, parsed = self._context(view.context_id)
        with self._cache_lock:
            candidate = self._candidates.pop(view.candidate_id, None)
        if candidate is None:
            candidate = self._artifact(view, view.candidate_id)
        return decision_input(view, candidate, parsed or body)

    def _artifact(self, view: RunView, artifact_id: str) -> Any:
        """An artifact of the run, held (not yet written) or stored."""
        for commit in view.unwritten:
            for artifact in commit.artifacts:
                if artifact.artifact_id == artifact_id:
                    return loads(artifact.canonical)
        return self.store.get_artifact(artifact_id)

    # Context artifacts are immutable, so what this process built (or read)
    # once can be reused by id: a step's model call and its validation do
    # not re-read and re-parse the context it froze.

    def _remember(self, context_id: str, body: dict[str, Any], parsed: Context | None) -> None:
        with self._cache_lock:
            self._contexts[context_id] = (body, parsed)
            self._contexts.move_to_end(context_id)
            while len(self._contexts) > CONTEXT_CACHE:
                self._contexts.popitem(last=False)

    def _context(self, context_id: str) -> tuple[dict[str, Any], Context | None]:
        with self._cache_lock:
            cached = self._contexts.get(context_id)
        if cached is None:
            cached = (resolve_context(self.store.get_artifact(context_id), self.store.get_artifact), None)
            self._remember(context_id, *cached)
        return cached

    def _validating(self, view: RunView, config: RunConfig) -> None:
        """Judge the candidate with the suite, record every decision, and act
        on the most severe: stop, wait for background work, repair, ask,
        finish, or start the accepted calls."""
        inp = self.decision_input(view)
        result = config.suite.evaluate(inp)
        recorded = self._recorded_decisions(view, result)
        blocking = result.blocking

        stops = [d for d in blocking if d.code in STOP_CODES]
        if stops:
            self._stop_on_decisions(view, stops, self._refuse_calls(view, inp, blocking, recorded))
            return
        gate = next((d for d in blocking if d.validator == "completion_gate"), None)
        if (gate is not None and gate.code == "pending_work" and view.pending_background()
                and all(d.validator in EVIDENCE_CHECKS for d in blocking)):
            # The model is done but work is still running: wait for it, then
            # judge again in a new step. Never a success while a tool runs.
            # (FINALIZING names no outcome: none is decided yet.)
            self._close_step(view, State.FINALIZING, extra=recorded, payload={
                "await_work": True, "pending_work": [op.work_id for op in view.pending_background()]})
            return
        verdict = result.verdict
        approvals: dict[str, str] = {}
        if verdict is Verdict.ASK and inp.proposed_calls:
            # Only a person stands in the way of calls: an approval, whichever
            # validator asks for it. The operations are committed now and each
            # one asked about waits for a person in TOOL_RUNNING, bound to that
            # operation and state version; the others run.
            approvals = _approvals_asked(inp, blocking)
            verdict = Verdict.ACCEPT
        if verdict in (Verdict.REPAIR, Verdict.REJECT):
            self._repair(view, config, blocking, self._refuse_calls(view, inp, blocking, recorded))
            return
        if verdict is Verdict.ASK:
            self._wait_user(view, config, "user", {"question": blocking[0].message, "schema": {}},
                            self._refuse_calls(view, inp, blocking, recorded))
            return
        if inp.candidate.is_terminal:
            final = Artifact("final", {"items": inp.candidate.model_dump(mode="json")["items"],
                                       "candidate_id": view.candidate_id})
            recorded["artifacts"] = (final,)
            self._finalize(view, "SUCCEEDED", "completed", extra=recorded,
                           payload_extra={"final_id": final.artifact_id})
            return
        self._start_calls(view, config, inp, recorded, approvals)

    @staticmethod
    def _recorded_decisions(view: RunView, result: SuiteResult) -> dict[str, Any]:
        """What VALIDATING commits whatever it decides: one ``validations``
        row per decision and the ``decisions`` event that sums them up."""
        rows = tuple(
            {
                "step": view.step,
                "attempt": view.attempt,
                "candidate_id": view.candidate_id,
                "validator": d.validator,
                "validator_version": d.validator_version,
                "suite_version": result.suite_version,
                "verdict": d.verdict.value,
                "code": d.code,
                "message": d.message,
                "evidence_json": d.evidence,
            }
            for d in result.decisions
        )
        summary = NewEvent("decisions", {
            "suite_version": result.suite_version,
            "verdict": result.verdict.value,
            "count": len(result.decisions),
            "blocking": [{"validator": d.validator, "code": d.code, "verdict": d.verdict.value}
                         for d in result.blocking],
        })
        return {"facts": {"validations": rows}, "events": (summary,)}

    def _start_calls(self, view: RunView, config: RunConfig, inp: DecisionInput, recorded: dict[str, Any],
                     approvals: dict[str, str]) -> None:
        """The candidate's calls were accepted: record an operation for each
        and move to TOOL_RUNNING, sending the first that needs no approval
        (``approvals``: call id → why a person must approve it, as the suite
        asked; tools that always need one are the runtime's own list).
        Calls that cannot be told apart or contradict the finish end the run;
        calls over ``max_tool_calls`` exhaust its budget; when none of them
        can be sent (arguments that did not parse), the model is told."""
        items = _call_items(inp)
        ids = [item.get("call_id") for item in items]
        contradiction = None
        if len(set(ids)) < len(ids) or not all(ids):
            # Calls the runtime cannot tell apart: no result could say
            # which request it answers.
            contradiction = ("DUPLICATE_CALL_ID", "tool call ids missing or not unique")
        elif inp.candidate.finish_reason == "stop":
            # The provider said the answer is final, and it holds calls: the
            # signal and the items disagree (never guessed past).
            contradiction = ("PROTOCOL_ERROR", "finish_reason 'stop' but the candidate holds tool calls")
        if contradiction is not None:
            # Accepted by a suite without `structure`, which finds these: a
            # protocol error all the same, and nothing is sent.
            code, detail = contradiction
            refused = [(item, "cancelled", code, f"not run: {detail}") for item in items]
            self._finalize(view, "FAILED", "protocol_error", detail=detail,
                           extra=with_refusals(recorded, view, refused))
            return
        # Calls whose arguments did not parse, accepted by a suite without
        # `structure`: the runtime cannot send them. Each gets its result;
        # with none left to send, the model is told, as after a repair.
        bad = unparsed(items)
        recorded = with_refusals(recorded, view, bad)
        calls = inp.proposed_calls
        if not calls:
            self._repair(view, config, [Decision.model_construct(
                validator="runtime", validator_version="", verdict=Verdict.REPAIR, code="unparseable_arguments",
                message=f"the arguments of {len(bad)} call(s) are not a JSON object; nothing was sent",
                evidence={"calls": [item.get("call_id") for item, *_ in bad]})], recorded)
            return
        allowed = config.scenario.contract.allowed_tools
        ops = [self._operation(view, index, call, denied=allowed is not None and not tool_allowed(call.tool, allowed),
                               approval=approvals.get(call.call_id) or (
                                   f"{call.tool} needs a person's approval" if call.tool in config.approval_required
                                   else None))
               for index, call in enumerate(calls, start=1)]
        new_operations = tuple(
            {
                "operation_id": op.operation_id,
                "step": op.step,
                "call_id": op.call_id,
                "tool": op.tool,
                "tool_version": op.version,
                "idempotency_key": op.idempotency_key,
                "canonical_args_json": op.arguments,
                "policy_decision": "deny" if op.denied else "approval_required" if op.approval else "allow",
                "status": "accepted",
                "outcome": None,
                "dispatch_count": 0,
            }
            for op in ops
        )
        budget = config.scenario.budgets.max_tool_calls
        if budget is not None and view.counters["tool_calls"] + len(calls) > budget:
            self._over_tool_calls(view, ops, new_operations, budget, recorded)
            return
        # The first operation that needs nobody's approval is marked as sent in
        # the same commit that records it, and sent right after: a crash in
        # between leaves it in flight, and the resumed run reconciles it.
        first = ops[0] if self._sendable(ops[0], config) else None
        if first is not None:
            new_operations = (
                {**new_operations[0], "status": "running", "dispatch_count": 1},
            ) + new_operations[1:]
            recorded["events"] = tuple(recorded["events"]) + (
                NewEvent("operation_dispatched", {"operation_id": first.operation_id}),)
        refused = tuple(recorded.pop("new_operations", ()))  # calls not sent (their arguments did not parse)
        self._move(
            view,
            State.TOOL_RUNNING,
            payload={"operations": _payload_ops(ops)},
            new_operations=new_operations + refused,
            counters={"tool_calls": len(ops)},
            **recorded,
        )
        if first is not None:
            self._send(view, config, view.ops[first.operation_id])

    @staticmethod
    def _refuse_calls(view: RunView, inp: DecisionInput, blocking: Any, recorded: dict[str, Any]) -> dict[str, Any]:
        """``recorded`` with the terminal result of each call of a candidate
        that was not accepted (see _refused.py)."""
        return with_refusals(recorded, view, judged(_call_items(inp), inp.context, blocking))

    def _over_tool_calls(self, view: RunView, ops: list[OpView], rows: tuple[dict[str, Any], ...], budget: int,
                         recorded: dict[str, Any]) -> None:
        """The accepted calls would exceed ``max_tool_calls``: the run ends
        BUDGET_EXHAUSTED, and each call, recorded, gets its one terminal
        result in the same commit: ``cancelled`` (MAX_TOOL_CALLS), not sent."""
        left = max(budget - view.counters["tool_calls"], 0)
        outcome = failure("cancelled", "MAX_TOOL_CALLS", f"max_tool_calls: {len(ops)} call(s) proposed, {left} left "
                                                         f"of {budget}; not sent")
        artifacts, events, done = list(recorded.get("artifacts", ())), list(recorded.get("events", ())), []
        for op, row in zip(ops, rows):
            parts, event, update = _result_parts(op, outcome)
            artifacts += parts
            events.append(NewEvent("operation_result", event))
            done.append({**row, **update})
        extra = {**recorded, "artifacts": tuple(artifacts), "events": tuple(events),
                 "new_operations": tuple(done) + tuple(recorded.get("new_operations", ()))}
        self._finalize(view, "BUDGET_EXHAUSTED", "max_tool_calls", extra=extra,
                       payload_extra={"operations": _payload_ops(ops)})

    def _operation(self, view: RunView, index: int, call: Any, *, denied: bool = False,
                   approval: str | None = None) -> OpView:
        operation_id = f"{view.run_id}.s{view.step}.op{index}"
        # The key names the side effect, not the attempt to send it: a re-send
        # after reconciliation reuses it, so the backend can tell them apart.
        key = hashlib.sha256(f"{view.run_id}|{view.step}|{call.call_id}|{call.call_key}".encode()).hexdigest()[:32]
        return OpView(
            operation_id=operation_id,
            idempotency_key=key,
            call_id=call.call_id,
            tool=call.tool,
            version=call.version,
            arguments=dict(call.arguments),
            args_hash=call.args_hash,
            step=view.step,
            denied=denied,
            approval=approval,
        )

    def _repair(self, view: RunView, config: RunConfig, blocking: Any, recorded: dict[str, Any]) -> None:
        if view.repairs >= MAX_REPAIRS:
            self._finalize(view, "FAILED", "validation_failed", extra=recorded,
                           detail=f"{view.repairs} repairs in a row did not produce an acceptable candidate")
            return
        feedback = [
            {"validator": d.validator, "code": d.code, "verdict": d.verdict.value, "message": d.message}
            for d in blocking
        ]
        self._close_step(view, State.READY, payload={"feedback": feedback, "repair": True}, extra=recorded,
                         hold=True)

    def _stop_on_decisions(self, view: RunView, stops: list[Any], recorded: dict[str, Any]) -> None:
        """End the run on the first stopping decision (most severe first);
        every loop detector's finding is a diagnosis of its own."""
        first = stops[0]
        extra = dict(recorded)
        findings = [d for d in stops if d.validator.startswith("loop.")]
        if findings:
            artifacts, rows = [], []
            for d in findings:
                evidence = dict(d.evidence)
                artifacts.append(Artifact("diagnosis", {"detector": d.validator, "code": d.code,
                                                        "message": d.message, "evidence": evidence,
                                                        "step": view.step}))
                # The row is the finding (the step its pattern began to
                # hold at, as the batch detectors report it); the artifact
                # keeps the step the run stopped at.
                since = evidence.get("since_step")
                rows.append({"step": since if isinstance(since, int) and 0 < since <= view.step else view.step,
                             "detector": d.validator, "detector_version": d.validator_version,
                             "pattern": str(evidence.get("pattern", d.code)),
                             # What the detector found (its own columns aside), as the batch form writes it.
                             "evidence_json": {k: v for k, v in evidence.items() if k not in _ROW_COLUMNS}})
            extra["artifacts"] = tuple(artifacts)
            extra["facts"] = {**recorded["facts"], "loop_diagnoses": tuple(rows)}
        self._finalize(view, "FAILED", STOP_CODES[first.code], extra=extra, detail=first.message)

    # -- TOOL_RUNNING and RECONCILING ------------------------------------------

    def _tool_running(self, view: RunView, config: RunConfig) -> None:
        pending = view.unsettled_ops()
        if not pending:
            self._after_tools(view, config)
            return
        if any(not o.in_flight for o in pending) and any(
                o.settled and o.outcome not in ("success", "background_accepted") for o in view.step_ops()):
            # A call before these failed and the process stopped before it
            # cancelled the rest (a crash): cancel them now, never send them.
            self._cancel_rest(view)
            return
        op = pending[0]
        if op.denied:
            # The runtime's own check, whatever the suite judged: a tool
            # outside the contract is never sent.
            self._record_result(view, op, failure(
                "permission_denied", "TOOL_NOT_ALLOWED", f"{op.tool} is not in the contract's allowed tools"))
            self._cancel_rest(view)
            return
        if not op.in_flight and self._past_deadline(view, config):
            # A budget bounds the calls the engine makes: past the deadline
            # (an approval or an answer that came late: a wait uses it up)
            # nothing new is sent, and nobody is asked to approve or answer
            # what would not be sent. The call's result says so, the rest are
            # cancelled, and READY's budget check ends the run
            # BUDGET_EXHAUSTED / deadline. A call already in flight is still
            # reconciled below: what it did must be known.
            self._record_result(view, op, failure(
                "cancelled", "DEADLINE", f"{op.tool}: not sent, the run's deadline has passed"))
            self._cancel_rest(view)
            return
        if op.tool == "ask_user" and not op.in_flight:
            args = op.arguments
            schema = args.get("schema", {})  # `false` is a schema too: one that takes no answer
            why = unusable(schema)
            if why is not None:
                # No answer could ever be taken (a pattern that is not a
                # regular expression, a $ref to nothing): nobody is asked;
                # the model learns why from the call's result.
                self._record_result(view, op, failure(
                    "validation_failed", "UNANSWERABLE_SCHEMA",
                    f"ask_user: no answer could fit the schema given ({why}); the question was not asked"))
                self._cancel_rest(view)
                return
            self._wait_user(view, config, "user", {"question": args.get("question", ""), "schema": schema},
                            {}, operation=op)
            return
        if not self._sendable(op, config):
            self._wait_user(view, config, "approval", {
                "question": f"Approve {op.tool} with {canonical_json(op.arguments)}?",
                "operation_id": op.operation_id,
                "tool": op.tool,
                "tool_version": op.version,
                "canonical_arguments": op.arguments,
                "actor": view.tenant,
                "scope": {"tenant": view.tenant, "allowed_tools": config.scenario.contract.allowed_tools},
                "reason": op.approval or f"{op.tool} needs a person's approval",
                "goal": config.scenario.contract.goal,
                "policy_version": config.scenario.contract.version,
            }, {}, operation=op)
            return
        if op.in_flight:
            # Sent before and no answer recorded (a crash, a timeout): never
            # send again before the backend has been asked.
            self._move(view, State.RECONCILING, payload={
                "operation_id": op.operation_id, "why": "unknown_outcome" if op.unknown else "in_flight_at_restart"})
            return
        self._dispatch(view, config, op)

    def _dispatch(self, view: RunView, config: RunConfig, op: OpView) -> None:
        # Record the send before making it: a crash after this commit leaves
        # the mark that the side effect may have happened.
        self._commit(view, Commit(
            view.run_id, view.state_version, None,
            events=(NewEvent("operation_dispatched", {"operation_id": op.operation_id}),),
            operation_updates=({"operation_id": op.operation_id, "status": "running",
                                "dispatch_count": op.dispatches + 1},),
        ))
        self._send(view, config, op)

    def _lookup(self, view: RunView, op: OpView) -> ToolOutcome | None:
        """What the backend recorded under the operation's key, asked under
        this process's claim (which fences off the driver that lost the run)."""
        try:
            return self.backend.lookup(op.idempotency_key, run_id=view.run_id,
                                       fence=self.store.claim_number(view.run_id))
        except Fenced:
            raise ClaimLost(view.run_id) from None

    def _sendable(self, op: OpView, config: RunConfig) -> bool:
        """Can go to its backend without a person first."""
        # A journal of an earlier version names no approval on its operations:
        # the runtime's list of tools that need one still holds for them.
        needs = op.approval is not None or op.tool in config.approval_required
        return not op.denied and op.tool != "ask_user" and (not needs or op.approved)

    def _send(self, view: RunView, config: RunConfig, op: OpView) -> None:
        """Send an operation already marked as dispatched, and record its result."""
        if not self.store.still_holds(view.run_id):
            # Another process may drive the run now: a send from here could
            # meet its own (it reconciles this dispatch and sends it again).
            raise ClaimLost(view.run_id)
        current = self.store.get_run(view.run_id).state_version
        if current != view.state_version:
            # A request came in since the dispatch was written (a cancel,
            # appended at the head): nothing goes out after it. The run is
            # read again; a cancel finds this call in flight, never sent.
            raise StaleStateVersion(view.run_id, view.state_version, current)
        request = ToolRequest(
            operation_id=op.operation_id,
            idempotency_key=op.idempotency_key,
            run_id=view.run_id,
            tenant=view.tenant,
            tool=op.tool,
            version=op.version,
            arguments=op.arguments,
            call_number=view.dispatches[op.tool],
            faults=config.faults,
            forbidden_paths=tuple(config.scenario.contract.forbidden_paths),
            fence=self.store.claim_number(view.run_id),
        )
        try:
            outcome = self.backend.execute(request)
        except Fenced:
            raise ClaimLost(view.run_id) from None  # the run's new driver came first: nothing was done
        except Exception as exc:  # noqa: BLE001 - whatever broke, the send may have happened
            self._note(view, "dispatch_unknown", op, "BACKEND_ERROR", detail=f"{type(exc).__name__}: {exc}")
            return
        _faults.crash_point("after_dispatch")
        if outcome.outcome == "unknown_outcome":
            self._note(view, "dispatch_unknown", op, outcome.error_code or "TIMEOUT")
            return
        if outcome.error_code == "RATE_LIMIT" and not outcome.executed:
            wait = outcome.retry_after_s or 0.05
            if op.dispatches <= MAX_RATE_LIMIT_RETRIES and self._deadline_left(view, config) > wait:
                # The runtime backs off within the deadline; the model is not asked.
                self._note(view, "dispatch_refused", op, "RATE_LIMIT", retry_after_s=wait)
                self.sleep(wait)
                return
        if outcome.outcome in ("success", "background_accepted"):
            # The step's last result closes the step in the same commit.
            last = all(o.settled or o is op for o in view.step_ops())
            # Closing the step is held: the next context is pure work, and
            # its commit carries this result before the model is called.
            self._record_result(view, op, outcome, close_step=last, hold=last)
        else:
            self._record_result(view, op, outcome)
            self._cancel_rest(view)

    def _note(self, view: RunView, kind: str, op: OpView, code: str, **extra: Any) -> None:
        """An event about a send that is not the request's result."""
        payload = {"operation_id": op.operation_id, "error_code": code, **extra}
        self._commit(view, Commit(view.run_id, view.state_version, None, events=(NewEvent(kind, payload),)))

    def _record_result(
        self, view: RunView, op: OpView, outcome: ToolOutcome, to: State | None = None,
        payload: dict[str, Any] | None = None, set_fields: dict[str, Any] | None = None,
        close_step: bool = False, before: tuple[NewEvent, ...] = (), hold: bool = False,
    ) -> None:
        """Commit the request's one terminal result (with ``close_step``, also
        the move to READY that ends the step; ``before``: events committed
        with it, ahead of it)."""
        artifacts, event, update = _result_parts(op, outcome)
        events = [*before, NewEvent("operation_result", event)]
        if close_step:
            to = State.READY
            events.append(NewEvent("step_closed", view.step_record(with_result=event).to_dict()))
        self._commit(view, Commit(
            view.run_id, view.state_version, to,
            payload=payload or {},
            events=tuple(events),
            artifacts=tuple(artifacts),
            operation_updates=(update,),
            set_fields=set_fields or {},
        ), hold=hold)

    def _cancel_rest(self, view: RunView, code: str = "PRECEDING_CALL_FAILED") -> None:
        """Sequential policy: after a failed call, the calls after it in the
        same candidate are not sent; each still gets its terminal result
        (``code``: why, when it is not the failed call, e.g. ``DEADLINE``)."""
        for op in view.unsettled_ops():
            if not op.in_flight:
                self._record_result(view, op, ToolOutcome(
                    outcome="cancelled", status="failed", result=None, evidence=(),
                    error_code=code, retry_after_s=None, work_id=None, executed=False,
                ))

    def _after_tools(self, view: RunView, config: RunConfig) -> None:
        ambiguous = next((op for op in view.step_ops() if op.error_code == "OBJECT_AMBIGUOUS"), None)
        if ambiguous is not None:
            # The call named more than one object: the runtime asks a person
            # which one was meant (the model would guess); the step ends, and
            # their answer goes to the model, which plans the next one.
            self._wait_user(view, config, "user", self._which_one(view, ambiguous),
                            {"events": (NewEvent("step_closed", view.step_record().to_dict()),)})
            return
        # Background work accepted in this step does not hold the run: the
        # model goes on, and a final answer while it runs will wait for it.
        self._close_step(view, State.READY, hold=True)

    def _which_one(self, view: RunView, op: OpView) -> dict[str, Any]:
        """The question an ambiguous call's result asks: which of its
        candidates (an answer must be one of them) was meant."""
        row = next(r for r in self.store.operations(view.run_id) if r["operation_id"] == op.operation_id)
        body = self.store.get_artifact(row["result_artifact_id"]) if row.get("result_artifact_id") else None
        result = body.get("result") if isinstance(body, dict) else None
        result = result if isinstance(result, dict) else {}
        candidates = [c for c in result.get("candidates") or () if isinstance(c, str) and c]
        subject = result.get("subject") or op.operation_id
        schema: dict[str, Any] = ({"type": "string", "enum": list(dict.fromkeys(candidates))} if len(candidates) > 1
                                  else {"type": "string", "minLength": 1})
        choices = f" ({', '.join(candidates)})" if len(candidates) > 1 else ""
        return {"question": f"{op.tool}: {subject!r} matches more than one object{choices}. Which one is meant?",
                "schema": schema, "reason": "OBJECT_AMBIGUOUS"}

    def _reconciling(self, view: RunView, config: RunConfig) -> None:
        op = next(o for o in view.step_ops() if o.in_flight)
        found = self._lookup(view, op)
        if found is not None and found.outcome == "unknown_outcome":
            # The backend cannot say either way: a person decides, and
            # nothing is sent again meanwhile.
            self._wait_user(view, config, "user", {
                "question": f"{op.tool} ({op.operation_id}) timed out and its backend cannot confirm whether it "
                            f"ran. Did it take effect?",
                "operation_id": op.operation_id,
                "schema": CONFIRM_SCHEMA,
            }, {}, operation=op)
            return
        if found is not None:
            # It did run: its result is the request's one result. Back to
            # TOOL_RUNNING, which sends what is left or closes the step.
            self._record_result(view, op, found, to=State.TOOL_RUNNING,
                                payload={"reconciled": op.operation_id, "executed": True})
            return
        # Confirmed not executed.
        if not op.unknown:
            # The process that sent it ended: nothing timed out, and the
            # backend says it did not run, so it is sent again after each
            # restart (two crashes around a send do not change how the run
            # ends), up to RESTART_SENDS sends; one that every process running
            # it died on is given up, as not executed.
            if op.resends + 1 < RESTART_SENDS:
                self._move(view, State.TOOL_RUNNING, payload={"resend": op.operation_id, "executed": False})
                return
            self._record_result(view, op, failure("cancelled", "PROCESS_ENDED", f"{op.tool}: the process running "
                                                  f"it ended {op.resends + 1} times; not sent again"),
                                to=State.TOOL_RUNNING, payload={"reconciled": op.operation_id, "executed": False})
            return
        if op.resends == 0:
            # It timed out: one safe re-send under the same key.
            self._move(view, State.TOOL_RUNNING, payload={"resend": op.operation_id, "executed": False})
            return
        # The re-send timed out too, in a live process.
        if not TOOL_TRAITS[op.tool].side_effect:
            # A read changes nothing: a timeout, and the model may ask again.
            self._record_result(view, op, failure("timeout", "TIMEOUT", f"{op.tool}: no answer after a re-send"),
                                to=State.TOOL_RUNNING, payload={"reconciled": op.operation_id, "executed": False})
            return
        # A write: a late answer could still land; a person decides.
        self._wait_user(view, config, "user", {
            "question": f"Cannot confirm whether {op.tool} ({op.operation_id}) ran. Did it take effect?",
            "operation_id": op.operation_id,
            "schema": CONFIRM_SCHEMA,
        }, {}, operation=op)

    # -- WAITING_TOOL -------------------------------------------------------------

    def _waiting_tool(self, view: RunView, config: RunConfig) -> bool:
        """The model is done and background work still runs: poll it. The run
        holds no worker meanwhile (``drive`` returns and is called again).
        The deadline holds while it waits: past it, the run ends
        BUDGET_EXHAUSTED / deadline, naming in its FINALIZING event the work
        still running (which FINALIZING then stops)."""
        # Polled first: work that ended is recorded as ended (its outcome
        # is part of the trace), even when the deadline has passed.
        running = self._collect_ended_work(view)
        if self._past_deadline(view, config):
            self._move(view, State.FINALIZING,
                       payload={"status": "BUDGET_EXHAUSTED", "reason": "deadline", "pending_work": running})
            return True
        if running:
            return False
        # A new step: the model sees the results and the gate judges again.
        self._move(view, State.READY, payload={"work_completed": True})
        return True

    def _collect_ended_work(self, view: RunView) -> list[str]:
        """Poll the run's pending background work; record each that ended.
        The work ids still running."""
        running = []
        for op in view.pending_background():
            status = self.backend.poll_work(op.work_id)
            if status.state == "running":
                running.append(op.work_id)
            else:
                self._work_completed(view, op, status.state, status.outcome)
        return running

    def _stop_background(self, view: RunView, *, hold: bool = False) -> list[str]:
        """Stop the run's pending background work, recording how each ended
        (cancelled; or how it had ended already; or cancel_unconfirmed when
        its backend cannot confirm the stop); with ``hold``, the records are
        written with the next commit. The operation ids whose stop is
        unconfirmed."""
        unconfirmed = []
        for op in view.pending_background():
            stopped = self.backend.cancel_work(op.work_id)
            if stopped is False:
                # It had already ended: nothing left to stop; record how it
                # ended, as a poll would have.
                status = self.backend.poll_work(op.work_id)
                self._work_completed(view, op, status.state, status.outcome, hold=hold)
            elif stopped:
                self._work_completed(view, op, "cancelled", None, "CANCELLED", hold=hold)
            else:  # None: the backend cannot confirm that it stopped
                unconfirmed.append(op.operation_id)
                self._work_completed(view, op, "cancel_unconfirmed", None, "CANCEL_UNCONFIRMED", hold=hold)
        return unconfirmed

    def _work_completed(self, view: RunView, op: OpView, state: str, outcome: ToolOutcome | None,
                        error_code: str | None = None, *, hold: bool = False) -> None:
        """Background work has ended (``state``: succeeded, failed,
        cancelled, or cancel_unconfirmed when a cancel could not be
        confirmed). Its own event, linked by work_id: not a second result of
        the request (whose outcome stays background_accepted); the
        operation's tool status follows the work."""
        summary = None
        if outcome is not None and outcome.result is not None:
            summary = reduce_result(op.tool, outcome.result)
        event = {
            "work_id": op.work_id,
            "operation_id": op.operation_id,
            "state": state,
            "evidence": [dict(e) for e in (outcome.evidence if outcome else ())],
            "error_code": outcome.error_code if outcome else error_code,
            "summary": summary,
        }
        self._commit(view, Commit(view.run_id, view.state_version, None,
                                  events=(NewEvent("work_completed", event),),
                                  operation_updates=({"operation_id": op.operation_id, "status": state},)),
                     hold=hold)

    # -- FINALIZING ------------------------------------------------------------------

    def _close_step(self, view: RunView, to: State, payload: dict[str, Any] | None = None,
                    extra: dict[str, Any] | None = None, hold: bool = False) -> None:
        extra = dict(extra or {})
        record = view.step_record()
        events = tuple(extra.pop("events", ()))
        # A step is closed once: a run that stops in READY (a budget spent,
        # a deadline) closed its last step when it got there.
        if not (view.history and view.history[-1].step == record.step):
            events += (NewEvent("step_closed", record.to_dict()),)
        self._move(view, to, hold=hold, payload=payload or {}, events=events, **extra)

    def _finalize(self, view: RunView, status: str, reason: str, *, extra: dict[str, Any] | None = None,
                  detail: str | None = None, payload_extra: dict[str, Any] | None = None) -> None:
        payload = {"status": status, "reason": reason, **(payload_extra or {})}
        if detail:
            payload["detail"] = detail
        self._close_step(view, State.FINALIZING, payload=payload, extra=extra)

    def _finalizing(self, view: RunView, config: RunConfig) -> None:
        _faults.crash_point("before_terminal")
        outcome = view.finalizing or {"status": "FAILED", "reason": "model_error"}
        if outcome.get("await_work"):
            if view.pending_background():
                work = [op.work_id for op in view.pending_background()]
                self._move(view, State.WAITING_TOOL, payload={"waiting": {"kind": "tool", "work_ids": work}},
                           set_fields={"reason": "waiting_for_tool"})
            else:
                self._move(view, State.READY, payload={"work_completed": True})
            return
        status, reason = outcome["status"], outcome["reason"]
        if status == "SUCCEEDED" and (view.pending_background() or any(not op.settled for op in view.ops.values())):
            # Completion invariant: every side effect settled. The gate
            # should have caught this; the terminal state never lies.
            status, reason = "FAILED", "tool_failed"
        # Work still running when its run ends (a deadline, a budget, a stop)
        # is stopped: nobody would ever poll it, and what it did after the
        # run's end would be in no trace. How it ended is written with the
        # terminal move, in one transaction: a crash between the two would
        # leave nothing pending, and the outcome worked out again would
        # forget that work was cut short.
        self._stop_background(view, hold=True)
        if self.before_terminal is not None:
            self.before_terminal(view)
        self._move(view, State(status), payload={"reason": reason}, set_fields={"reason": reason})
