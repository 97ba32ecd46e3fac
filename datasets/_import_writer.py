"""A conversation → the same commits the controller makes.

Imported runs are written as the engine would have recorded them, so they
land in the same tables and the replay folds them with the engine's own
:func:`~loopledger.engine.validated_candidates`. The commits go to a store:
:class:`~._import_tables.TraceRows` (rows of the trace tables, what an
import uses) or the journal itself (what the tests compare it with). Each
assistant message is one step (attempt 1):

    READY -> MODEL_RUNNING         the context artifact (messages since the
                                   previous context, the tool registry's id,
                                   policy, contract)
    MODEL_RUNNING -> VALIDATING    the candidate, its ``candidates`` row,
                                   ``candidate_recorded``
    then, by what followed it in the transcript:
    tool calls   VALIDATING -> TOOL_RUNNING (the operations), one commit per
                 result (``operation_dispatched`` + ``operation_result``); the
                 last closes the step (``step_closed``) -> READY
    text, then the user spoke
                 VALIDATING -> WAITING_USER; the user's messages (and tau2's
                 user-side tool calls, as ``user_tool_call`` events) are the
                 reply: WAITING_USER -> READY with ``reply_accepted``. Like the
                 engine's own waits, this step has no ``step_closed``.
    text, then the agent again
                 VALIDATING -> READY, step closed
    tool calls, then the user spoke (unasked)
                 the step closes as above; the user's messages (and
                 user-side tool calls) are ``reply_accepted`` (no wait) and
                 ``user_tool_call`` events in a commit of their own, the
                 run staying READY
    the last message
                 ... -> FINALIZING (step closed) -> the terminal state, with
                 the reward set and an ``import`` label on this candidate

A run view is folded along, exactly as the controller folds its commits,
so step records are computed by the engine's code, and ``decide`` (a suite)
judges each candidate on the same ``decision_input`` a replay rebuilds.

Times (trace rows only; the journal keeps its own clock): a run whose source
has times is written on the source's clock. The run starts at its start time
(else its first message's time, else its end time); each commit is at the
latest source time the writer has reached by then (the candidate's, its
last result's, the user's reply's, the tail's), the terminal commit at the
end time, never going back. A source without times is written on the
import's clock.

"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loopledger.canonical import canonical_json, content_id
from loopledger.engine import Artifact, Commit, NewEvent, NewRun, RunView, State, decision_input
from loopledger.engine._results import reduce_result

from ._import_model import NO_RESULT, Conversation, Message, Outcome, ToolResult, outcome_of
from ._import_tables import TraceRows
from ._import_tau import pair_results

#: How a source's termination maps onto the engine's terminal states.
TERMINATIONS: dict[str, tuple[str, str]] = {
    "user_stop": ("SUCCEEDED", "completed"),
    "agent_stop": ("SUCCEEDED", "completed"),
    "completed": ("SUCCEEDED", "completed"),
    "max_steps": ("BUDGET_EXHAUSTED", "max_steps"),
    "too_many_errors": ("FAILED", "tool_failed"),
    "gave_up": ("FAILED", "model_error"),
}
UNKNOWN_TERMINATION = ("FAILED", "model_error")
#: Characters of a user-side tool result kept in its event (the full text is in the context).
EVENT_TEXT = 300


@dataclass(frozen=True)
class Step:
    """One assistant message and what the transcript says followed it."""

    before: tuple[Message, ...]  # messages since the previous step's candidate (its results included)
    candidate: Message
    results: tuple[ToolResult | None, ...]  # one per tool call, paired
    after: tuple[Message, ...]  # user turn (and the user's tool calls) before the next candidate
    answered_at: int | None  # the source's time of the candidate's last result (or of the candidate)
    #: The agent's tool results past the candidate's calls (more answers than
    #: calls, or one after a text answer): kept in the next context as
    #: messages, no operation's result. (Within the calls' count every
    #: result is paired, by id or else by position: see pair_results.)
    unmatched: int = 0


def steps_of(conv: Conversation) -> list[Step]:
    """The transcript cut into steps, one per assistant message; the first
    step's ``before`` holds the messages before it (the first context)."""
    msgs = conv.messages
    positions = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    steps: list[Step] = []
    for k, at in enumerate(positions):
        end = positions[k + 1] if k + 1 < len(positions) else len(msgs)
        calls = msgs[at].tool_calls
        # The agent's results directly follow its message; the user's own
        # tool calls and results (tau2) come later, in the user's turn.
        j = at + 1
        results: list[ToolResult] = []
        while j < end and len(results) < len(calls) and msgs[j].role == "tool" and msgs[j].requestor != "user":
            results.append(msgs[j].result)  # type: ignore[arg-type]
            j += 1
        paired = tuple(pair_results(calls, results)) if calls else ()
        before = msgs[: at] if k == 0 else ()
        after = msgs[j:end]
        unmatched = sum(m.role == "tool" and m.requestor != "user" for m in after)
        steps.append(Step(before, msgs[at], paired, after, msgs[j - 1].time, unmatched))
    return steps


def _goal(conv: Conversation) -> str:
    return next((m.content for m in conv.messages if m.role == "user" and m.content), "") or ""


class RunWriter:
    """Writes one conversation to ``store`` (``create_run``, ``commit``, ``add_label``)."""

    def __init__(self, store: Any, conv: Conversation, suite: Any = None) -> None:
        self.store, self.conv, self.suite = store, conv, suite
        # Trace rows take the commits' fields as they are; a journal takes Commits.
        self.rows = store if isinstance(store, TraceRows) else None
        self.run_id = conv.run_id
        self.prompt_version = conv.prompt_version  # a hash of the system prompt: computed once
        self.version = 1
        self.view = RunView.blank(self.run_id, conv.source, self.prompt_version, conv.model)
        self.contract = {"goal": _goal(conv), "required_evidence": [], "allowed_tools": None,
                         "forbidden_paths": [], "wait_ttl_s": None, "version": 1}
        self.previous_context: str | None = None
        # The tool catalogue is stored once (content-addressed: once for every
        # run that shares it) and each context names it by id, as the engine's do.
        self.registry = Artifact("tool_registry", {"tools": conv.tools})
        self.last_candidate: tuple[int, str] | None = None
        # The run's clock: the source's time of what is being written (see the
        # module doc); None when the source has no times (the import's clock).
        self.time = next((t for t in (conv.started_at, *(m.time for m in conv.messages), conv.ended_at)
                          if t is not None), None)
        self.stats = {"candidates": 0, "operations": 0, "user_tool_calls": 0, "failed": 0, "unanswered": 0,
                      "unmatched": 0}

    # -- journal primitives ---------------------------------------------------------

    def _create(self) -> None:
        conv = self.conv
        spec = {"imported": {"format": conv.format or conv.source, "file": conv.file, "record": conv.record,
                             "source_id": conv.source_id, "termination": conv.termination,
                             "reward": conv.reward, "metadata": dict(conv.metadata)},
                "contract": self.contract}
        new = NewRun(run_id=self.run_id, task_id=conv.task_id, tenant=conv.source,
                     prompt_version=self.prompt_version, model_route=conv.model, thread_id=self.run_id, spec=spec)
        if self.rows is not None:
            self.rows.create_run(new, at=self.time)
        else:
            self.store.create_run(new)

    def _advance(self, *times: int | None) -> None:
        """Move the run's clock on to the latest of ``times`` (None: the source
        does not say), never back."""
        for t in times:
            if t is not None and (self.time is None or t > self.time):
                self.time = t

    def _commit(self, to: State | None, *, step: int | None = None, attempt: int | None = None,
                payload: dict[str, Any] | None = None, events: Sequence[NewEvent] = (), **fields: Any) -> None:
        if payload is None:
            payload = {}
        if self.rows is not None:
            self.version = self.rows.append(self.run_id, self.version, to, step, attempt, payload, events,
                                            at=self.time, **fields)
        else:
            commit = Commit(self.run_id, self.version, to, step, attempt, payload, tuple(events), **fields)
            self.version = self.store.commit(commit).state_version
        # The controller's fold of a commit (Controller._commit). Nothing here
        # or in the view changes a payload, so the view is handed the writer's own.
        view = self.view
        step = view.step if step is None else step
        attempt = view.attempt if attempt is None else attempt
        if to is not None:
            view.apply("transition", to._value_, step, attempt, payload)
        for event in events:
            view.apply(event.kind, None, step, attempt, event.payload)
        view.step, view.attempt = step, attempt

    def _label(self, step: int, candidate_id: str, expected: str, note: str) -> None:
        label = {"run_id": self.run_id, "step": step, "attempt": 1, "candidate_id": candidate_id,
                 "validator": "", "expected_verdict": expected, "source": "import", "note": note}
        if self.rows is not None:
            # At the run's end (docs/importers.md), which a source without
            # times leaves to the import's clock: the terminal commit's.
            at = self.time if self.time is not None else self.rows.runs[self.run_id]["ended_at"]
            self.rows.add_label(label, at=at)
        else:
            self.store.add_label(label)

    # -- the run ------------------------------------------------------------------------

    def write(self) -> dict[str, int]:
        steps = steps_of(self.conv)
        self._create()
        pending: list[dict[str, Any]] = []
        for index, step in enumerate(steps, start=1):
            last = index == len(steps)
            self.stats["unmatched"] += step.unmatched
            pending = self._step(index, step, pending + [m.context_form() for m in step.before], last)
        self._finish()
        return self.stats

    def _context(self, messages: list[dict[str, Any]]) -> Artifact:
        view = self.view
        return Artifact("context", {
            "previous_context": self.previous_context,
            "messages": messages,
            "memory": {},
            "retrieval": [{"kind": e.kind, "subject": e.subject} for e in view.evidence.values()],
            "tools_ref": self.registry.artifact_id,
            "policy": {"approval_required": []},
            "contract": self.contract,
            "tenant": self.conv.source,
            "model_route": self.conv.model,
            "prompt_version": self.prompt_version,
            "budget": {},
        })

    def _step(self, number: int, step: Step, messages: list[dict[str, Any]], last: bool) -> list[dict[str, Any]]:
        """Write one step; return the messages the next context starts with."""
        conv, msg = self.conv, step.candidate
        self._advance(*(m.time for m in step.before))
        context = self._context(messages)
        artifacts = (self.registry, context) if number == 1 else (context,)
        self._commit(State.MODEL_RUNNING, step=number, attempt=1, payload={"context_id": context.artifact_id},
                     artifacts=artifacts)
        self.previous_context = context.artifact_id
        items: list[dict[str, Any]] = []
        if msg.content and msg.content.strip():
            items.append({"type": "text", "text": msg.content})
        if msg.answer is not None:  # ToolBench's Finish: the final answer
            items.append({"type": "text", "text": msg.answer})
        for call in msg.tool_calls:
            item: dict[str, Any] = {"type": "tool_call", "call_id": call.call_id, "name": call.name, "version": None}
            if call.arguments is not None:
                item["arguments"] = call.arguments
            else:
                item["raw_arguments"] = call.raw_arguments
            items.append(item)
        finish = "tool_calls" if msg.tool_calls else "stop"
        body = {"items": items, "finish_reason": finish, "context_id": context.artifact_id, "step": number,
                "attempt": 1, "prompt_version": self.prompt_version, "model_route": conv.model}
        candidate = Artifact("candidate", body)
        cid = candidate.artifact_id
        self._advance(msg.time)
        row = {"step": number, "attempt": 1, "candidate_id": cid, "context_artifact_id": context.artifact_id,
               "finish_reason": finish, "items_json": canonical_json(items), "prompt_version": self.prompt_version,
               "model_route": conv.model}
        # Usage the source does not give is left out: the trace tables hold
        # null for it (unknown), not a 0 that would read as "free".
        usage = {name: value for name, value in (("tokens_in", msg.tokens_in), ("tokens_out", msg.tokens_out),
                                                 ("cost_usd", msg.cost_usd)) if value is not None}
        row.update(usage)
        self._commit(State.VALIDATING, payload={"candidate_id": cid}, artifacts=(candidate,),
                     facts={"candidates": (row,)},
                     counters={"model_attempts": 1, **usage},
                     events=(NewEvent("candidate_recorded", {"candidate_id": cid, "items": items}),))
        self.stats["candidates"] += 1
        self.last_candidate = (number, cid)
        recorded = self._decide(body, context.body, cid)
        if msg.tool_calls:
            self._tools(number, step, recorded, last)
        elif last:
            final = Artifact("final", {"items": items, "candidate_id": cid})
            self._finalize(recorded, artifacts=(final,), extra={"final_id": final.artifact_id},
                           tail=step.after)
        elif any(m.role == "user" for m in step.after):
            self._wait_and_reply(msg, step.after, recorded)
        else:
            # The agent spoke and then went on without the user: a new step.
            self._close(State.READY, {"continued": True}, recorded)
        next_messages = [msg.context_form()]
        next_messages += [Message("tool", r.content, result=r).context_form() for r in step.results if r]
        return next_messages + [m.context_form() for m in step.after]

    def _decide(self, body: dict[str, Any], context: dict[str, Any], cid: str) -> dict[str, Any]:
        """With a suite: its decisions, recorded as the controller records
        them (``validations`` rows and a ``decisions`` event), marked as
        computed at import. Without one: nothing (see docs/importers.md)."""
        if self.suite is None:
            return {}
        plain = {**context, "tools": self.conv.tools.value}
        result = self.suite.evaluate(decision_input(self.view, body, plain, cid))
        rows = tuple({"step": self.view.step, "attempt": self.view.attempt, "candidate_id": cid,
                      "validator": d.validator, "validator_version": d.validator_version,
                      "suite_version": result.suite_version, "verdict": d.verdict.value, "code": d.code,
                      "message": d.message, "evidence_json": d.evidence} for d in result.decisions)
        summary = NewEvent("decisions", {
            "suite_version": result.suite_version, "verdict": result.verdict.value, "computed_at": "import",
            "count": len(result.decisions),
            "blocking": [{"validator": d.validator, "code": d.code, "verdict": d.verdict.value}
                         for d in result.blocking]})
        return {"facts": {"validations": rows}, "events": (summary,)}

    def _tools(self, number: int, step: Step, recorded: dict[str, Any], last: bool) -> None:
        view, run_id = self.view, self.run_id
        ops = []
        for index, call in enumerate(step.candidate.tool_calls, start=1):
            arguments = call.arguments if call.arguments is not None else {"raw_arguments": call.raw_arguments}
            args_hash = content_id(arguments)
            key = hashlib.sha256(f"{run_id}|{number}|{call.call_id}|{call.name}:{args_hash}|{index}".encode()
                                 ).hexdigest()[:32]
            ops.append({"operation_id": f"{run_id}.s{number}.op{index}", "idempotency_key": key,
                        "call_id": call.call_id, "tool": call.name, "version": None, "arguments": arguments,
                        "args_hash": args_hash, "step": number})
        new_operations = tuple({"operation_id": op["operation_id"], "step": number, "call_id": op["call_id"],
                                "tool": op["tool"], "tool_version": None, "idempotency_key": op["idempotency_key"],
                                "canonical_args_json": op["arguments"], "policy_decision": "allow",
                                "status": "accepted", "outcome": None, "dispatch_count": 0} for op in ops)
        self._commit(State.TOOL_RUNNING, payload={"operations": ops}, new_operations=new_operations,
                     counters={"tool_calls": len(ops)}, facts=recorded.get("facts", {}),
                     events=tuple(recorded.get("events", ())))
        self.stats["operations"] += len(ops)
        for i, (op, call, result) in enumerate(zip(ops, step.candidate.tool_calls, step.results)):
            outcome: Outcome = NO_RESULT if result is None else outcome_of(call, result)
            # A call the source shows no result for did not fail: its outcome is unknown.
            self.stats["unanswered"] += result is None
            self.stats["failed"] += result is not None and outcome.outcome != "success"
            artifacts: tuple[Artifact, ...] = ()
            result_id = summary = None
            if result is not None:
                full = Artifact("tool_result", {"operation_id": op["operation_id"], "tool": op["tool"],
                                                "result": result.content})
                artifacts, result_id = (full,), full.artifact_id
                summary = {**reduce_result(op["tool"], result.content), "full_artifact": result_id}
            event = {"operation_id": op["operation_id"], "tool": op["tool"], "outcome": outcome.outcome,
                     "status": outcome.status, "error_code": outcome.error_code,
                     "evidence": list(outcome.evidence), "work_id": None, "result_artifact_id": result_id,
                     "summary": summary}
            events = [NewEvent("operation_dispatched", {"operation_id": op["operation_id"]}),
                      NewEvent("operation_result", event)]
            update = {"operation_id": op["operation_id"], "status": outcome.status, "outcome": outcome.outcome,
                      "dispatch_count": 1, "result_artifact_id": result_id}
            if i + 1 < len(ops):
                self._commit(None, events=events, artifacts=artifacts, operation_updates=(update,))
                continue
            # The last result closes the step, as the controller's does.
            # (A dispatch changes nothing a step record counts.)
            self._advance(step.answered_at)
            record = view.step_record(with_result=event).to_dict()
            events.append(NewEvent("step_closed", record))
            if last:
                status, reason = self._terminal()
                self._commit(State.FINALIZING, payload={"status": status, "reason": reason}, events=events,
                             artifacts=artifacts, operation_updates=(update,))
            else:
                self._commit(State.READY, events=events, artifacts=artifacts, operation_updates=(update,))
        if last:
            self._tail(step.after)
        elif any(m.role == "user" for m in step.after):
            self._user_turn(step.after)

    def _user_turn(self, after: tuple[Message, ...]) -> None:
        """The user spoke after a tool step, unasked (the run did not wait
        for them): the same ``reply_accepted`` (with no wait) and
        ``user_tool_call`` events as a reply to a wait, in a commit of its
        own, the run staying ``READY``."""
        turn = f"{self.run_id}.u{self.version + 1}"
        said = "\n".join(m.content for m in after if m.role == "user" and m.content)
        events = [NewEvent("reply_accepted", {"wait_id": None, "kind": "user", "token_hash": f"import:{turn}",
                                              "operation_id": None, "actor": "user", "message": said,
                                              "imported": True, "unprompted": True})]
        events += self._user_tool_events(after)
        self._advance(*(m.time for m in after))
        self._commit(None, events=events)

    def _wait_and_reply(self, msg: Message, after: tuple[Message, ...], recorded: dict[str, Any]) -> None:
        wait_id = f"{self.run_id}.w{self.version + 1}"
        waiting = {"kind": "user", "wait_id": wait_id, "approval_id": None, "operation_id": None,
                   "question": (msg.content or "")[:500], "schema": {}, "imported": True}
        self._commit(State.WAITING_USER, payload={"waiting": waiting},
                     set_fields={"reason": "waiting_for_user", "waiting_json": waiting},
                     facts=recorded.get("facts", {}), events=tuple(recorded.get("events", ())))
        said = "\n".join(m.content for m in after if m.role == "user" and m.content)
        events = [NewEvent("reply_accepted", {"wait_id": wait_id, "kind": "user", "token_hash": f"import:{wait_id}",
                                              "operation_id": None, "actor": "user", "message": said,
                                              "imported": True})]
        events += self._user_tool_events(after)
        self._advance(*(m.time for m in after))
        self._commit(State.READY, payload={"replied": wait_id}, events=events, set_fields={"waiting_json": None})

    def _user_tool_events(self, messages: Sequence[Message]) -> list[NewEvent]:
        """tau2's simulated user calls tools on its own device: kept as
        events marked ``requestor: user``, never as the agent's operations."""
        events = []
        for k, m in enumerate(messages):
            if m.role != "user" or not m.tool_calls:
                continue
            results = [r.result for r in messages[k + 1:] if r.role == "tool" and r.result is not None]
            for call, result in zip(m.tool_calls, pair_results(m.tool_calls, results[: len(m.tool_calls)])):
                outcome = NO_RESULT if result is None else outcome_of(call, result)
                events.append(NewEvent("user_tool_call", {
                    "requestor": "user", "call_id": call.call_id, "tool": call.name, "arguments": call.arguments,
                    "outcome": outcome.outcome, "error_code": outcome.error_code,
                    "result": None if result is None else result.content[:EVENT_TEXT]}))
                self.stats["user_tool_calls"] += 1
        return events

    def _close(self, to: State, payload: dict[str, Any], recorded: dict[str, Any],
               artifacts: tuple[Artifact, ...] = ()) -> None:
        events = tuple(recorded.get("events", ())) + (NewEvent("step_closed", self.view.step_record().to_dict()),)
        self._commit(to, payload=payload, events=events, facts=recorded.get("facts", {}), artifacts=artifacts)

    def _terminal(self) -> tuple[str, str]:
        return TERMINATIONS.get(self.conv.termination, UNKNOWN_TERMINATION)

    def _finalize(self, recorded: dict[str, Any], artifacts: tuple[Artifact, ...] = (),
                  extra: dict[str, Any] | None = None, tail: tuple[Message, ...] = ()) -> None:
        status, reason = self._terminal()
        self._close(State.FINALIZING, {"status": status, "reason": reason, **(extra or {})}, recorded, artifacts)
        self._tail(tail)

    def _tail(self, tail: tuple[Message, ...]) -> None:
        """What the transcript holds after the last candidate (the user's
        ``###STOP###``, the user's last tool calls): kept as an event."""
        if not tail:
            return
        events = [NewEvent("transcript_tail", {"messages": [m.context_form() for m in tail]})]
        events += self._user_tool_events(tail)
        self._advance(*(m.time for m in tail))
        self._commit(None, events=events)

    def _finish(self) -> None:
        status, reason = self._terminal()
        reward = self.conv.reward
        self._advance(self.conv.ended_at)
        self._commit(State(status), payload={"reason": reason},
                     set_fields={"reason": reason, "reward": reward, "waiting_json": None})
        if reward is not None and self.last_candidate is not None and reward in (0.0, 1.0):
            step, cid = self.last_candidate
            expected = "accept" if reward == 1.0 else "reject"
            self._label(step, cid, expected, f"{self.conv.source} reward {reward:g}: the final answer "
                                             f"{'met' if reward == 1.0 else 'did not meet'} the task")
