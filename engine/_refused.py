"""The terminal result of each tool call the engine does not send.

Every tool request gets exactly one terminal result (CONTRACT, hard rules),
the calls that never run included: those of a candidate the suite did not
accept (sent back for repair, rejected, stopped by a loop detector, or
turned into a question), those whose arguments did not parse in a candidate
a suite without ``structure`` accepted, those of an attempt whose response
is not trusted (a broken or cut stream, a filtered or failed response), and
those of a candidate a cancel left unjudged. Each such call is recorded as
an operation that was never dispatched, with its result, in the commit
that decides its candidate's fate: a ``calls_refused`` event names the
operations, an ``operation_result`` event gives each its result.

For a candidate the suite judged, the outcome is the first that applies:

- ``validation_failed`` (``UNPARSEABLE_ARGUMENTS``): the arguments did not
  parse;
- what the decisions that name the call say (a decision's own evidence, or
  one of its ``other_issues``, whose ``call_id`` is the call's), most
  telling first: ``unknown_or_disabled_tool`` for ``tool_exists`` and
  ``tool_version``, ``validation_failed`` for any other validator but the
  permission check, then ``permission_denied`` for the permission check's
  refusals; the code is the issue's, in capitals. A question (``ask``, an
  approval nobody was asked for here) is not a refusal of the call;
- ``unknown_or_disabled_tool`` (``UNKNOWN_TOOL``): the step's tool registry
  has no such tool, or not that version (a suite without ``tool_exists``);
- ``cancelled`` (``CANDIDATE_REFUSED``): nothing was found wrong with the
  call itself; its candidate was refused.

The calls of an untrusted response are ``cancelled`` (``UNTRUSTED_RESPONSE``)
and those of a candidate a cancel left unjudged ``cancelled``
(``CANCELLED``), whatever they hold: nothing judged them.

These records change nothing the loop decides: the run view keeps them out
of the step's calls and errors, the evidence, the validators' operations
(``RunFacts.operations``) and the model's next messages (the validators'
feedback tells the model why), so the loop detectors, the completion gate
and a user's validators judge what they judged without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loopledger.canonical import canonical_json, content_id
from loopledger.validators import Context, Decision, Verdict, split_tool_name
from loopledger.validators._proposal import resolve_spec

from ._records import NewEvent

#: A refused call's outcome by the validator whose issue names it, and how
#: telling that is: the tool itself before its arguments, its arguments
#: before the permission to run it.
_BY_VALIDATOR = {"tool_exists": ("unknown_or_disabled_tool", 0), "tool_version": ("unknown_or_disabled_tool", 0),
                 "permission": ("permission_denied", 2)}
_OTHER = ("validation_failed", 1)
#: The operation's ``policy_decision``: ``deny`` where the permission check
#: is why the call did not run; else the policy never judged the call.
_POLICY = {"permission_denied": "deny"}
#: Arguments that did not parse: the first thing that stops a call, in any candidate judged.
_UNPARSED = ("validation_failed", "UNPARSEABLE_ARGUMENTS", "not run: its arguments are not a JSON object")


def _issues(d: Decision) -> Iterable[tuple[str, str, str, str]]:
    """(call id, verdict, code, message) of each issue of ``d`` that names a call."""
    evidence = d.evidence if isinstance(d.evidence, Mapping) else {}
    found = [(evidence.get("call_id"), d.verdict.value, d.code, d.message)]
    for other in evidence.get("other_issues") or ():
        if isinstance(other, Mapping) and isinstance(other.get("evidence"), Mapping):
            found.append((other["evidence"].get("call_id"), other.get("verdict"), other.get("code"),
                          other.get("message")))
    return [(c, v, str(code), str(m)) for c, v, code, m in found if isinstance(c, str)]


def judged(items: Sequence[Mapping[str, Any]], context: Context,
           blocking: Iterable[Decision]) -> list[tuple[Mapping[str, Any], str, str, str]]:
    """(call item, outcome, code, message) for each tool call of a candidate
    the suite did not accept, whose ``blocking`` decisions are given."""
    blocking = tuple(blocking)
    by_call: dict[str, tuple[int, str, str, str]] = {}
    for d in blocking:
        for call_id, verdict, code, message in _issues(d):
            if verdict not in (Verdict.REPAIR.value, Verdict.REJECT.value):
                continue  # a question (an approval) is no refusal of the call
            outcome, rank = _BY_VALIDATOR.get(d.validator, _OTHER)
            if call_id not in by_call or rank < by_call[call_id][0]:
                by_call[call_id] = (rank, outcome, code.upper(), f"not run: {d.validator}: {message}")
    why = ", ".join(f"{d.validator}: {d.code}" for d in blocking) or "not accepted"
    out = []
    for item in items:
        tool, version = split_tool_name(str(item.get("name", "")), item.get("version"))
        if item.get("arguments") is None:
            out.append((item, *_UNPARSED))
        elif (named := by_call.get(str(item.get("call_id")))) is not None:
            out.append((item, *named[1:]))
        elif resolve_spec(context, tool, version) is None:
            out.append((item, "unknown_or_disabled_tool", "UNKNOWN_TOOL",
                        f"not run: no tool {tool!r}{f' at version {version!r}' if version else ''} in the registry"))
        else:
            out.append((item, "cancelled", "CANDIDATE_REFUSED", f"not run: its candidate was refused ({why})"))
    return out


def unparsed(items: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str, str, str]]:
    """The same for the calls whose arguments did not parse in a candidate
    a suite accepted (one without ``structure``): the runtime cannot send them."""
    return [(item, *_UNPARSED) for item in items if item.get("arguments") is None]


def untrusted(items: Sequence[Mapping[str, Any]], finish_reason: str) -> list[tuple[Mapping[str, Any], str, str, str]]:
    """The same for the tool calls of a response that is not trusted."""
    return [(item, "cancelled", "UNTRUSTED_RESPONSE", f"not run: the response ended '{finish_reason}'")
            for item in items]


def tool_call_items(items: Iterable[Any]) -> list[Mapping[str, Any]]:
    """The tool calls among a candidate's items (as recorded: JSON objects)."""
    return [item for item in items if isinstance(item, Mapping) and item.get("type") == "tool_call"]


def with_refusals(recorded: Mapping[str, Any], view: Any,
                  refused: Sequence[tuple[Mapping[str, Any], str, str, str]]) -> dict[str, Any]:
    """``recorded`` (a commit's keyword arguments) with what it records for
    the ``refused`` calls of ``view``'s step and attempt: the operations'
    rows (``new_operations``) and the events that name them and give each
    its result."""
    if not refused:
        return dict(recorded)
    run_id, step, attempt = view.run_id, view.step, view.attempt
    ops, rows, results = [], [], []
    for index, (item, outcome, code, message) in enumerate(refused, start=1):
        tool, version = split_tool_name(str(item.get("name", "")), item.get("version"))
        arguments = item.get("arguments")
        # Arguments that did not parse as the importer keeps them: the text, in an object.
        received: Any = arguments if arguments is not None else {"raw_arguments": item.get("raw_arguments")}
        call_id = str(item.get("call_id", ""))
        operation_id = f"{run_id}.s{step}.a{attempt}.call{index}"
        key = hashlib.sha256(f"{run_id}|{step}|{attempt}|{index}|{call_id}|not sent".encode()).hexdigest()[:32]
        ops.append({"operation_id": operation_id, "idempotency_key": key, "call_id": call_id, "tool": tool,
                    "version": version, "arguments": dict(received),
                    "args_hash": content_id(received), "step": step})
        rows.append({"operation_id": operation_id, "step": step, "call_id": call_id, "tool": tool,
                     "tool_version": version, "idempotency_key": key,
                     "canonical_args_json": canonical_json(received),
                     "policy_decision": _POLICY.get(outcome, "not_evaluated"),
                     "status": "failed", "outcome": outcome, "dispatch_count": 0})
        results.append(NewEvent("operation_result", {
            "operation_id": operation_id, "tool": tool, "outcome": outcome, "status": "failed",
            "error_code": code, "message": message, "evidence": [], "work_id": None, "result_artifact_id": None,
            "summary": None}))
    return {**recorded,
            "new_operations": (*recorded.get("new_operations", ()), *rows),
            "events": (*recorded.get("events", ()), NewEvent("calls_refused", {"operations": ops}), *results)}
