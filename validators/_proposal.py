"""Resolving and canonicalising a candidate's tool calls (the proposal).

The engine builds the proposal before authorisation and records it; replay
of imported traces, which have none, derives it here with the same rules, so
the permission check and the loop detectors always see the canonical call.
"""

from __future__ import annotations

from typing import Any

from loopledger.canonical import content_id

from ._errors import PathRejected
from ._model import Candidate, Context, ProposedCall, Resource, ToolSpec, split_tool_name
from ._paths import canonical_workspace_path

__all__ = ["canonical_proposal", "resolve_spec", "WORKSPACE_PATH"]

#: Resource kind of an argument that names a file in the tenant's workspace.
WORKSPACE_PATH = "workspace_path"


def resolve_spec(context: Context, tool: str, version: str | None) -> ToolSpec | None:
    """The registry entry a call names: the exact version when one is given,
    else the single entry of that name (or the last listed, which the
    registry snapshot keeps as the current one). Never a different version."""
    specs = context.tool_index.get(tool)
    if not specs:
        return None
    if version is None:
        return specs[-1]
    for spec in specs:
        if spec.version == version:
            return spec
    return None


def canonical_proposal(candidate: Candidate, context: Context) -> tuple[ProposedCall, ...]:
    """One :class:`ProposedCall` per tool call whose arguments parsed."""
    calls: list[ProposedCall] = []
    for item in candidate.tool_calls:
        if item.arguments is None:
            continue
        tool, version = split_tool_name(item.name, item.version)
        spec = resolve_spec(context, tool, version)
        if version is None and spec is not None:
            version = spec.version
        arguments: dict[str, Any] = dict(item.arguments)
        resources: list[Resource] = []
        for argument, kind in sorted((spec.resources if spec else {}).items()):
            if argument not in arguments:
                continue
            raw = arguments[argument]
            if kind == WORKSPACE_PATH:
                try:
                    value = canonical_workspace_path(raw)
                except PathRejected as exc:
                    resources.append(Resource(kind=kind, argument=argument, raw=raw, error=exc.reason))
                    continue
                arguments[argument] = value
                resources.append(Resource(kind=kind, argument=argument, raw=raw, value=value))
            else:
                value = raw if isinstance(raw, str) else None
                resources.append(Resource(kind=kind, argument=argument, raw=raw, value=value))
        calls.append(
            ProposedCall(
                call_id=item.call_id,
                tool=tool,
                version=version,
                arguments=arguments,
                resources=tuple(resources),
                args_hash=content_id(arguments),
            )
        )
    return tuple(calls)
