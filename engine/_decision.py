"""What a decision reads, rebuilt from recorded facts only.

The live controller and the offline replay both call :func:`decision_input`
with the same three things: the run view folded from the run's events up to
the moment the candidate was validated, the candidate artifact and its
context artifact. Whatever the suite decides is therefore a pure function
of the journal (or the traces, which hold the same rows).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from loopledger.validators import Candidate, Context, DecisionInput, ToolSpec, canonical_proposal

from ._view import RunView


def resolve_context(body: Mapping[str, Any], artifact: Callable[[str], Any]) -> dict[str, Any]:
    """A context body with its tool registry in place: contexts name the
    registry snapshot by id (``tools_ref``); older and imported ones embed
    it (``tools``). ``artifact`` reads an artifact's body by id."""
    if "tools" in body or "tools_ref" not in body:
        return dict(body)
    return {**body, "tools": artifact(body["tools_ref"])["tools"]}


#: Parsed registries by artifact id: a registry is shared by every context of
#: every run recorded with it, and parsing its schemas is most of a context's cost.
_REGISTRIES: OrderedDict[str, tuple[ToolSpec, ...]] = OrderedDict()
_REGISTRIES_LOCK = threading.Lock()


def _registry_specs(ref: str, artifact: Callable[[str], Any]) -> tuple[ToolSpec, ...]:
    with _REGISTRIES_LOCK:
        specs = _REGISTRIES.get(ref)
    if specs is None:
        specs = tuple(ToolSpec.model_validate(t) for t in artifact(ref)["tools"])
        with _REGISTRIES_LOCK:
            _REGISTRIES[ref] = specs
            while len(_REGISTRIES) > 64:
                _REGISTRIES.popitem(last=False)
    return specs


def decision_input(view: RunView, candidate_body: Mapping[str, Any], context_body: Mapping[str, Any] | Context,
                   candidate_id: str | None = None, artifact: Callable[[str], Any] | None = None) -> DecisionInput:
    """``context_body`` is the context artifact's body, or the Context
    already parsed from it (the live engine keeps the ones it built).
    ``artifact`` reads an artifact's body by id; it is needed when the
    context names its tool registry (``tools_ref``) rather than embeds it."""
    candidate = Candidate(items=candidate_body["items"], finish_reason=candidate_body["finish_reason"],
                          candidate_id=candidate_id or view.candidate_id)
    if isinstance(context_body, Context):
        context = context_body
    else:
        tools: Any = context_body.get("tools")
        if tools is None and "tools_ref" in context_body:
            if artifact is None:
                raise ValueError("the context names its tool registry; pass artifact= to read it")
            tools = _registry_specs(context_body["tools_ref"], artifact)
        context = Context(
            messages=context_body.get("messages", ()),
            tools=tools or (),
            policy=context_body.get("policy", {}),
            contract=context_body.get("contract", {}),
            tenant=context_body.get("tenant"),
            budget=context_body.get("budget", {}),
        )
    return DecisionInput(
        run_id=view.run_id,
        step=view.step,
        attempt=view.attempt,
        candidate=candidate,
        context=context,
        proposal=canonical_proposal(candidate, context),
        facts=view.facts(),
    )


def validated_candidates(
    run: Mapping[str, Any], events: Iterable[Mapping[str, Any]]
) -> Iterable[tuple[RunView, str, str]]:
    """Fold a run's events (dicts with kind, to_state, step, attempt and
    payload, in seq order) and yield ``(view, candidate_id, context_id)`` at
    each point where a candidate entered VALIDATING: the view then holds
    exactly the facts the live decision read. The view is the same object
    each time, advanced; use it before the next item is taken."""
    view = RunView.blank(run_id=run["run_id"], tenant=run.get("tenant", ""),
                         prompt_version=run.get("prompt_version", ""), model_route=run.get("model_route", ""))
    for event in events:
        if event["kind"] in ("run_created", "late_event"):
            continue
        view.apply(event["kind"], event.get("to_state"), int(event["step"]), int(event["attempt"]),
                   event["payload"])
        view.step, view.attempt = int(event["step"]), int(event["attempt"])
        if event["kind"] == "transition" and event.get("to_state") == "VALIDATING":
            yield view, event["payload"]["candidate_id"], view.context_id or ""
