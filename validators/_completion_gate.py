"""``completion_gate``: a final answer is only a *candidate* for completion.

It passes when the contract's required evidence is in the run facts (``kind``
by any subject, ``kind:subject`` by that one), its claims are supported, it
leaks no secret, and nothing is still in flight: no pending operation,
approval or background work, no side effect with an unknown outcome. "Done"
in the model's words does not replace the runtime's facts. Everything here is
``reject``; the code tells the engine where to go: ``pending_work`` waits
(WAITING_TOOL), the others go back to READY for the missing steps.

A candidate with tool calls is not a final answer, so the gate accepts it.
"""

from __future__ import annotations

from ._model import PENDING_OUTCOMES, DecisionInput, Verdict
from ._output_rules import build_rules, scan_candidate, sensitive_issue
from ._registry import Issue, validator


def pending_work(inp: DecisionInput) -> list[dict[str, str | None]]:
    """Everything in flight, from the explicit pending list and from the
    operations' outcomes (either alone is enough to block)."""
    out: dict[tuple[str, str], dict[str, str | None]] = {}
    for p in inp.facts.pending:
        out[(p.kind, p.id)] = {"kind": p.kind, "id": p.id, "tool": p.tool}
    for op in inp.facts.operations:
        if op.outcome not in PENDING_OUTCOMES:
            continue
        if op.outcome == "background_accepted":
            if op.work_done:
                continue
            key = ("background", op.work_id or op.operation_id)
        else:
            key = ("operation", op.operation_id)
        out.setdefault(key, {"kind": key[0], "id": key[1], "tool": op.tool, "outcome": op.outcome})
    return [out[k] for k in sorted(out)]


# 2: secret_key finds Stripe keys. 3: iban finds IBANs printed in groups of four.
@validator(name="completion_gate", version="3")
def completion_gate(*, patterns: tuple[str, ...] = ("secret_key",)):
    """Codes: pending_work, missing_evidence, unsupported_claim,
    sensitive_output (all reject). Params: patterns (output rules checked on
    the final answer; [] to leave it to output_rules)."""
    rules = build_rules(patterns, {})

    def check(inp: DecisionInput) -> list[Issue]:
        cand = inp.candidate
        if not cand.is_terminal:
            return []
        issues: list[Issue] = []
        pending = pending_work(inp)
        if pending:
            issues.append(
                Issue(
                    Verdict.REJECT,
                    "pending_work",
                    f"final answer while {len(pending)} operation(s), approval(s) or background work are pending",
                    {"pending": pending},
                )
            )
        facts = inp.facts
        required = inp.context.contract.required_evidence
        missing = [r for r in required if not facts.has_evidence(r)]
        if missing:
            issues.append(
                Issue(
                    Verdict.REJECT,
                    "missing_evidence",
                    f"required evidence not in the run: {', '.join(missing)}",
                    {"missing": missing, "required": list(required)},
                )
            )
        unsupported = [
            {"item": i, "missing": [r for r in item.evidence if not facts.has_evidence(r)]}
            for i, item in enumerate(cand.items)
            if item.type == "claim" and (not item.evidence or not all(facts.has_evidence(r) for r in item.evidence))
        ]
        if unsupported:
            issues.append(
                Issue(
                    Verdict.REJECT,
                    "unsupported_claim",
                    f"{len(unsupported)} claim(s) not supported by the run's evidence",
                    {"claims": unsupported},
                )
            )
        if rules:
            matches = scan_candidate(cand, rules, ("text", "claim", "plan"))
            if matches:
                issues.append(sensitive_issue(matches, Verdict.REJECT, 20))
        return issues

    return check
