"""``tool_exists``: every tool call names a tool in the frozen registry
snapshot, and that tool is enabled.

An unknown name is ``repair`` (the model may have mistyped a name it was
shown; the message lists what exists). A disabled tool is ``reject``: it is
in the registry on purpose and calling it again will not help.
"""

from __future__ import annotations

from ._model import DecisionInput, Verdict, split_tool_name
from ._params import int_param
from ._registry import Issue, validator


@validator(name="tool_exists", version="1")
def tool_exists(*, max_known: int = 20):
    """Codes: unknown_tool (repair), tool_disabled (reject).
    Params: max_known (how many known names the evidence lists)."""
    max_known = int_param("max_known", max_known, 0)

    def check(inp: DecisionInput) -> list[Issue]:
        issues: list[Issue] = []
        index = inp.context.tool_index
        for call in inp.candidate.tool_calls:
            tool, _ = split_tool_name(call.name, call.version)
            specs = index.get(tool)
            if not specs:
                known = sorted(index)[:max_known]
                issues.append(
                    Issue(
                        Verdict.REPAIR,
                        "unknown_tool",
                        f"call {call.call_id!r}: no tool named {tool!r}",
                        {"call_id": call.call_id, "tool": tool, "known": known},
                    )
                )
            elif not any(s.enabled for s in specs):
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "tool_disabled",
                        f"call {call.call_id!r}: tool {tool!r} is disabled",
                        {"call_id": call.call_id, "tool": tool},
                    )
                )
        return issues

    return check
