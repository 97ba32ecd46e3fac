"""``permission``: the canonical operation is within the contract and policy.

Checked on the canonical proposal, never on the model's strings:
``exports/../payments/config.json`` is judged as ``payments/config.json``.
Everything here is ``reject`` (a rule says no; retrying the same call will
not change that) except approval, which is ``ask``: a person may say yes.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from ._model import DecisionInput, ProposedCall, Verdict
from ._paths import glob_matches
from ._proposal import WORKSPACE_PATH, resolve_spec
from ._registry import Issue, validator


def tool_allowed(tool: str, allowed: tuple[str, ...] | list[str]) -> bool:
    """Whether ``tool`` is one of ``allowed`` (names or glob patterns)."""
    return any(tool == pattern or fnmatchcase(tool, pattern) for pattern in allowed)


@validator(name="permission", version="1")
def permission():
    """Codes: tool_not_allowed, path_outside_workspace, forbidden_path,
    tenant_scope (reject); approval_required (ask)."""

    def check(inp: DecisionInput) -> list[Issue]:
        issues: list[Issue] = []
        contract = inp.context.contract
        policy = inp.context.policy
        tenant = inp.context.tenant
        for call in inp.proposed_calls:
            base = {"call_id": call.call_id, "tool": call.tool}
            if contract.allowed_tools is not None and not tool_allowed(call.tool, contract.allowed_tools):
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "tool_not_allowed",
                        f"call {call.call_id!r}: {call.tool} is not in the contract's allowed tools",
                        {**base, "allowed_tools": list(contract.allowed_tools)},
                    )
                )
            issues.extend(_resource_issues(call, base, contract.forbidden_paths, tenant))
            spec = resolve_spec(inp.context, call.tool, call.version)
            if tool_allowed(call.tool, policy.approval_required) or (spec is not None and spec.requires_approval):
                issues.append(
                    Issue(
                        Verdict.ASK,
                        "approval_required",
                        f"call {call.call_id!r}: {call.tool} needs a person's approval",
                        {**base, "args_hash": call.args_hash},
                    )
                )
        return issues

    return check


def _resource_issues(call: ProposedCall, base: dict, forbidden: tuple[str, ...], tenant: str | None) -> list[Issue]:
    issues: list[Issue] = []
    for res in call.resources:
        where = {**base, "argument": res.argument}
        if res.kind == WORKSPACE_PATH:
            if res.value is None:
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "path_outside_workspace",
                        f"call {call.call_id!r}: {res.argument}={res.raw!r} has no place in the workspace ({res.error})",
                        {**where, "raw_path": res.raw, "reason": res.error},
                    )
                )
                continue
            for pattern in forbidden:
                if glob_matches(pattern, res.value):
                    issues.append(
                        Issue(
                            Verdict.REJECT,
                            "forbidden_path",
                            f"call {call.call_id!r}: {res.value} (from {res.raw!r}) matches forbidden path {pattern!r}",
                            {**where, "raw_path": res.raw, "canonical_path": res.value, "pattern": pattern},
                        )
                    )
                    break
        if res.tenant is not None and tenant is not None and res.tenant != tenant:
            issues.append(
                Issue(
                    Verdict.REJECT,
                    "tenant_scope",
                    f"call {call.call_id!r}: {res.kind} {res.value!r} belongs to another tenant",
                    {**where, "resource_kind": res.kind, "resource": res.value, "run_tenant": tenant},
                )
            )
    return issues
