"""``structure``: a trusted finish, no partial items, items that agree with
the provider's stop signal.

Only a trusted finish may move on: a stream that broke, was cut at the
length limit, was filtered or errored is rejected whatever its items look
like, because half-received arguments must never start a tool. A stop signal
that contradicts the items (``stop`` with tool calls, ``tool_calls`` without
any) is a ``protocol_error``: the controller goes by the items it actually
received, and a disagreement is diagnosed rather than guessed past.
"""

from __future__ import annotations

from ._model import DecisionInput, ToolCallItem, Verdict, split_tool_name
from ._registry import Issue, validator

_UNTRUSTED = {
    "incomplete": ("incomplete_stream", "the stream broke before the provider finished"),
    "length": ("truncated", "the output was cut at the length limit"),
    "content_filter": ("content_filtered", "the provider blocked the output"),
    "error": ("provider_error", "the provider reported an error"),
}


@validator(name="structure", version="1")
def structure():
    """Codes: incomplete_stream, truncated, content_filtered, provider_error,
    protocol_error (reject); unparseable_arguments, empty_candidate (repair)."""

    def check(inp: DecisionInput) -> list[Issue]:
        cand = inp.candidate
        issues: list[Issue] = []
        untrusted = _UNTRUSTED.get(cand.finish_reason)
        if untrusted is not None:
            code, why = untrusted
            partial = [c.call_id for c in cand.tool_calls if c.arguments is None]
            issues.append(
                Issue(
                    Verdict.REJECT,
                    code,
                    f"untrusted finish '{cand.finish_reason}': {why}",
                    {"finish_reason": cand.finish_reason, "partial_calls": partial, "items": len(cand.items)},
                )
            )
        calls = cand.tool_calls
        if cand.finish_reason == "stop" and calls:
            issues.append(_protocol("finish_reason 'stop' but the candidate holds tool calls", cand.finish_reason, calls))
        elif cand.finish_reason == "tool_calls" and not calls:
            issues.append(_protocol("finish_reason 'tool_calls' but the candidate holds none", cand.finish_reason, calls))
        seen: set[str] = set()
        for call in calls:
            if not call.call_id or call.call_id in seen:
                issues.append(_protocol(f"missing or duplicate call_id {call.call_id!r}", cand.finish_reason, calls))
            seen.add(call.call_id)
            if not split_tool_name(call.name, call.version)[0]:
                issues.append(_protocol(f"call {call.call_id!r} has no tool name", cand.finish_reason, calls))
            if (call.arguments is None) == (call.raw_arguments is None):
                issues.append(
                    _protocol(f"call {call.call_id!r} must have exactly one of arguments, raw_arguments", cand.finish_reason, calls)
                )
            elif call.arguments is None and untrusted is None:
                # A complete stream with arguments that do not parse: the
                # model wrote bad JSON, which it can write again correctly.
                issues.append(
                    Issue(
                        Verdict.REPAIR,
                        "unparseable_arguments",
                        f"arguments of call {call.call_id!r} ({call.name}) are not a JSON object",
                        {"call_id": call.call_id, "tool": call.name, "raw_length": len(call.raw_arguments or "")},
                    )
                )
        if not cand.items and untrusted is None:
            issues.append(Issue(Verdict.REPAIR, "empty_candidate", "the candidate has no items", {}))
        return issues

    return check


def _protocol(message: str, finish_reason: str, calls: tuple[ToolCallItem, ...]) -> Issue:
    return Issue(
        Verdict.REJECT,
        "protocol_error",
        message,
        {"finish_reason": finish_reason, "tool_calls": [c.call_id for c in calls]},
    )
