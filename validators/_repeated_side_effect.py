"""``repeated_side_effect``: a call that would do again what already took
effect in this run waits for a person.

The runtime never sends one operation twice (idempotency keys,
reconciliation), but a model that proposes the same refund again in a later
step makes a new operation: without this check it would be sent, and the
customer refunded twice. Not every repetition is a mistake (two equal
partial refunds may be meant), so the verdict is ``ask``: the engine turns
it into an approval of that call, and a person decides.

A call repeats an earlier one when it names the same tool with the same
canonical arguments (``ProposedCall.call_key``, the loop detectors' call
identity) as an operation of this run whose effect took place or may have
(its outcome ``success``, ``background_accepted`` or ``unknown_outcome``, or
not yet settled), or as an earlier call of the same candidate. Read-only
tools never repeat an effect; ``exempt`` names tools left alone besides
(``ask_user``: a question asked again is the loop detectors' business).
"""

from __future__ import annotations

from ._model import DecisionInput, Operation, Verdict
from ._params import str_list_param
from ._proposal import resolve_spec
from ._registry import Issue, validator

#: Outcomes after which the call's effect took place, or may have.
_TOOK_EFFECT = frozenset({"success", "background_accepted", "unknown_outcome", "pending", "dispatched", "running"})


@validator(name="repeated_side_effect", version="1")
def repeated_side_effect(*, exempt: tuple[str, ...] = ("ask_user",)):
    """Codes: repeated_side_effect (ask).
    Params: exempt (tools never asked about)."""
    skipped = frozenset(str_list_param("exempt", exempt))

    def check(inp: DecisionInput) -> list[Issue]:
        # Unknown tools are tool_exists's to report; reads repeat no effect.
        calls = [call for call in inp.proposed_calls if call.tool not in skipped
                 and (spec := resolve_spec(inp.context, call.tool, call.version)) is not None and not spec.read_only]
        if not calls:
            return []  # most candidates: reads and final answers never scan the run's operations
        tools = {call.tool for call in calls}
        earlier: dict[str, Operation] = {}
        for op in inp.facts.operations:
            if op.tool in tools and op.outcome in _TOOK_EFFECT:
                earlier.setdefault(f"{op.tool}:{op.args_hash}", op)
        issues: list[Issue] = []
        in_candidate: dict[str, str] = {}
        for call in calls:
            key = call.call_key
            base = {"call_id": call.call_id, "tool": call.tool, "args_hash": call.args_hash}
            op = earlier.get(key)
            if op is not None:
                when = f" at step {op.step}" if op.step is not None else ""
                issues.append(Issue(
                    Verdict.ASK, "repeated_side_effect",
                    f"call {call.call_id!r}: {call.tool} with these arguments already took effect in this run "
                    f"(operation {op.operation_id}{when}, {op.outcome}); a person decides whether to do it again",
                    {**base, "operation_id": op.operation_id, "outcome": op.outcome, "step": op.step}))
            elif key in in_candidate:
                issues.append(Issue(
                    Verdict.ASK, "repeated_side_effect",
                    f"call {call.call_id!r}: {call.tool} with the same arguments as call {in_candidate[key]!r} of "
                    "this answer; a person decides whether to do it twice",
                    {**base, "same_as": in_candidate[key]}))
            in_candidate.setdefault(key, call.call_id)
        return issues

    return check
