"""``references``: every claim cites evidence, and every cited entry exists
in the run facts.

Evidence is what the runtime recorded from tool results (kind and subject),
never what the model says it did. A claim that cites nothing is ``repair``:
the model may cite evidence the run already holds, or drop the claim. A
citation the run facts do not hold is ``reject``: the claim is unsupported,
and rewording will not make it true.
"""

from __future__ import annotations

from ._model import DecisionInput, Verdict
from ._registry import Issue, validator


def _available(inp: DecisionInput) -> list[str]:
    return sorted({f"{e.kind}:{e.subject}" if e.subject else e.kind for e in inp.facts.evidence})


@validator(name="references", version="1")
def references():
    """Codes: claim_without_evidence (repair), evidence_not_found (reject)."""

    def check(inp: DecisionInput) -> list[Issue]:
        issues: list[Issue] = []
        for index, item in enumerate(inp.candidate.items):
            if item.type != "claim":
                continue
            if not item.evidence:
                issues.append(
                    Issue(
                        Verdict.REPAIR,
                        "claim_without_evidence",
                        f"claim {index} ({item.text[:60]!r}) cites no evidence",
                        {"item": index, "available": _available(inp)},
                    )
                )
                continue
            missing = [ref for ref in item.evidence if not inp.facts.has_evidence(ref)]
            if missing:
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "evidence_not_found",
                        f"claim {index} cites evidence the run does not hold: {', '.join(missing)}",
                        {"item": index, "missing": missing, "available": _available(inp)},
                    )
                )
        return issues

    return check
