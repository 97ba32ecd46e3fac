"""The terminal result of each tool call the engine does not send.

Every tool request gets exactly one terminal result (CONTRACT, hard rules),
the calls that never run included: those of a candidate the suite did not
accept (sent back for repair, rejected, stopped by a loop detector, or
turned into a question), and those of an attempt whose response is not
trusted (a broken or cut stream, a filtered or failed response). Each such
call is recorded as an operation that was never dispatched, with its
result, in the commit that decides its candidate's fate: a
``calls_refused`` event names the operations, an ``operation_result`` event
gives each its outcome.

The outcome, the first that applies:

- ``validation_failed`` (``UNPARSEABLE_ARGUMENTS``): the arguments did not
  parse;
- ``unknown_or_disabled_tool`` (``UNKNOWN_TOOL``): the step's tool registry
  has no such tool, or not that version;
- what the blocking decision that names the call (its evidence's
  ``call_id``) says: ``permission_denied`` for the permission check's
  refusals, ``approval_required`` for its question, ``unknown_or_disabled_tool``
  for ``tool_exists`` and ``tool_version``, ``validation_failed`` for any
  other validator; the code is the decision's, in capitals;
- ``cancelled``: nothing was found wrong with the call itself; its candidate
  was refused (``CANDIDATE_REFUSED``) or its response not trusted
  (``UNTRUSTED_RESPONSE``).

These records change nothing the loop decides: the run view keeps them out
of the step's calls and errors, the evidence and the model's next messages
(see RunView), so the loop detectors and the completion gate judge what
they judged without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loopledger.canonical import canonical_json, content_id
from loopledger.validators import Context, Decision, Verdict, split_tool_name
from loopledger.validators._proposal import resolve_spec

from ._records import NewEvent

#: What a blocking decision that names a call makes of it, by validator.
_BY_VALIDATOR = {"tool_exists": "unknown_or_disabled_tool", "tool_version": "unknown_or_disabled_tool"}
#: The operation's ``policy_decision``: the permission check's, where it is
#: why the call did not run; else the policy never judged the call.
_POLICY = {"permission_denied": "deny", "approval_required": "approval_required"}


def _named(decision: Decision) -> str | None:
    call_id = decision.evidence.get("call_id") if isinstance(decision.evidence, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def judged(items: Sequence[Mapping[str, Any]], context: Context,
           blocking: Iterable[Decision]) -> list[tuple[Mapping[str, Any], str, str, str]]:
    """(call item, outcome, code, message) for each tool call of a candidate
    the suite did not accept, whose ``blocking`` decisions are given."""
    blocking = tuple(blocking)
    by_call: dict[str, Decision] = {}
    for d in blocking:
        call_id = _named(d)
        if call_id is not None:
            by_call.setdefault(call_id, d)  # the most severe first, as the suite orders them
    why = ", ".join(f"{d.validator}: {d.code}" for d in blocking) or "not accepted"
    out = []
    for item in items:
        tool, version = split_tool_name(str(item.get("name", "")), item.get("version"))
        if item.get("arguments") is None:
            out.append((item, "validation_failed", "UNPARSEABLE_ARGUMENTS",
                        "not run: its arguments are not a JSON object"))
        elif resolve_spec(context, tool, version) is None:
            out.append((item, "unknown_or_disabled_tool", "UNKNOWN_TOOL",
                        f"not run: no tool {tool!r}{f' at version {version!r}' if version else ''} in the registry"))
        elif (d := by_call.get(str(item.get("call_id")))) is not None:
            if d.validator == "permission":
                outcome = "approval_required" if d.verdict is Verdict.ASK else "permission_denied"
            else:
                outcome = _BY_VALIDATOR.get(d.validator, "validation_failed")
            out.append((item, outcome, d.code.upper(), f"not run: {d.validator}: {d.message}"))
        else:
            out.append((item, "cancelled", "CANDIDATE_REFUSED", f"not run: its candidate was refused ({why})"))
    return out


def untrusted(items: Sequence[Mapping[str, Any]], finish_reason: str) -> list[tuple[Mapping[str, Any], str, str, str]]:
    """The same for the tool calls of a response that is not trusted."""
    return [(item, "cancelled", "UNTRUSTED_RESPONSE", f"not run: the response ended '{finish_reason}'")
            for item in items]


def tool_call_items(items: Iterable[Any]) -> list[Mapping[str, Any]]:
    """The tool calls among a candidate's items (as recorded: JSON objects)."""
    return [item for item in items if isinstance(item, Mapping) and item.get("type") == "tool_call"]


def refusal_parts(run_id: str, step: int, attempt: int,
                  refused: Sequence[tuple[Mapping[str, Any], str, str, str]]) -> dict[str, Any]:
    """What a commit records for ``refused`` calls: the operations' rows
    (``new_operations``) and the events that name them and give each its
    result; nothing when there are none."""
    if not refused:
        return {}
    ops, rows, results = [], [], []
    for index, (item, outcome, code, message) in enumerate(refused, start=1):
        tool, version = split_tool_name(str(item.get("name", "")), item.get("version"))
        arguments = item.get("arguments")
        received: Any = arguments if arguments is not None else item.get("raw_arguments")
        call_id = str(item.get("call_id", ""))
        operation_id = f"{run_id}.s{step}.a{attempt}.call{index}"
        key = hashlib.sha256(f"{run_id}|{step}|{attempt}|{index}|{call_id}|not sent".encode()).hexdigest()[:32]
        ops.append({"operation_id": operation_id, "idempotency_key": key, "call_id": call_id, "tool": tool,
                    "version": version, "arguments": dict(arguments) if arguments is not None else {},
                    "args_hash": content_id(received), "step": step})
        rows.append({"operation_id": operation_id, "step": step, "call_id": call_id, "tool": tool,
                     "tool_version": version, "idempotency_key": key,
                     # The arguments as received: an object, or the text that did not parse.
                     "canonical_args_json": canonical_json(received),
                     "policy_decision": _POLICY.get(outcome, "not_evaluated"),
                     "status": "failed", "outcome": outcome, "dispatch_count": 0})
        results.append(NewEvent("operation_result", {
            "operation_id": operation_id, "tool": tool, "outcome": outcome, "status": "failed",
            "error_code": code, "message": message, "evidence": [], "work_id": None, "result_artifact_id": None,
            "summary": None}))
    return {"new_operations": tuple(rows),
            "events": (NewEvent("calls_refused", {"operations": ops}), *results)}


def with_refusals(recorded: Mapping[str, Any], parts: Mapping[str, Any]) -> dict[str, Any]:
    """``recorded`` (a commit's keyword arguments) with ``parts`` added."""
    if not parts:
        return dict(recorded)
    return {**recorded,
            "new_operations": tuple(recorded.get("new_operations", ())) + tuple(parts["new_operations"]),
            "events": tuple(recorded.get("events", ())) + tuple(parts["events"])}
