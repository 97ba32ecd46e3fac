"""``tool_version``: a call that names a version must name one the registry
snapshot holds.

If the model saw ``deploy.service@v1`` and the registry now has ``v2``, the
proposal is stale: ``reject``, never silently upgraded, because v2 may mean
something else. A call without a version resolves to the snapshot's entry,
which is the one the model was shown in this very context.
"""

from __future__ import annotations

from ._model import DecisionInput, Verdict, split_tool_name
from ._registry import Issue, validator


@validator(name="tool_version", version="1")
def tool_version():
    """Codes: stale_tool_version (reject)."""

    def check(inp: DecisionInput) -> list[Issue]:
        issues: list[Issue] = []
        index = inp.context.tool_index
        for call in inp.candidate.tool_calls:
            tool, version = split_tool_name(call.name, call.version)
            specs = index.get(tool)
            if not specs or version is None:
                continue  # unknown tools are tool_exists's to report
            current = [s.version for s in specs]
            if version not in current:
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "stale_tool_version",
                        f"call {call.call_id!r}: {tool}@{version} is not in the registry (has {', '.join(str(v) for v in current)})",
                        {"call_id": call.call_id, "tool": tool, "proposed": version, "registry": current},
                    )
                )
        return issues

    return check
