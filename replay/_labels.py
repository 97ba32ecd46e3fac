"""Labels: judgements of what a decision should have been.

Three sources (CONTRACT ``labels.source``): ``human`` (``loopledger
label``), ``import`` (an importer's ground truth) and ``scenario``. A
scenario's ``expect.decisions`` are its scenario labels: the runner writes
them as label rows once the run has reached their step, and they are also
derived here, at replay time, from the scenario frozen in the run's
``runs.spec_json``, so traces recorded before the rows existed get them
too. Both say the same thing about the same candidate; :func:`effective`
keeps one.

When several labels speak on one decision, a person's word wins over an
importer's, an importer's over a scenario's; within a source the latest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

VERDICTS = ("accept", "repair", "ask", "reject")
SOURCES = ("human", "import", "scenario")
_PRECEDENCE = {"scenario": 0, "import": 1, "human": 2}


@dataclass(frozen=True, slots=True)
class Label:
    """The verdict one decision should have had. ``validator`` empty: the
    candidate as a whole (its most severe verdict)."""

    run_id: str
    step: int
    attempt: int
    candidate_id: str
    validator: str
    expected_verdict: str
    source: str
    note: str = ""


def scenario_labels(run_id: str, spec: Mapping[str, Any] | str | None,
                    candidates: Mapping[tuple[int, int], str]) -> list[Label]:
    """The ``scenario`` labels of one run: its spec's ``expect.decisions``,
    each tied to the candidate validated at that step and attempt
    (``candidates``: (step, attempt) → candidate_id). An expectation for a
    step the run never validated names no candidate and is skipped."""
    if spec is None or spec == "":
        return []
    if isinstance(spec, str):
        if "decisions" not in spec and "\\" not in spec:
            return []  # no expect.decisions (not even escaped): nothing to parse
        try:
            spec = json.loads(spec)
        except ValueError:
            return []
    expect = (spec or {}).get("expect") or {}
    labels = []
    for d in expect.get("decisions") or ():
        step, attempt = int(d["step"]), int(d.get("attempt") or 1)
        candidate_id = candidates.get((step, attempt))
        if candidate_id is None or d.get("verdict") not in VERDICTS:
            continue
        labels.append(Label(run_id, step, attempt, candidate_id, d.get("validator") or "", d["verdict"],
                            "scenario", "expect.decisions"))
    return labels


def effective(labels: Iterable[tuple[int, Label]]) -> dict[tuple[str, str], Label]:
    """(candidate_id, validator) → the label that decides, from
    ``(order, label)`` pairs (``order``: later is newer)."""
    best: dict[tuple[str, str], tuple[int, int, Label]] = {}
    for order, label in labels:
        key = (label.candidate_id, label.validator)
        rank = (_PRECEDENCE.get(label.source, 0), order)
        if key not in best or rank >= best[key][:2]:
            best[key] = (*rank, label)
    return {key: entry[2] for key, entry in best.items()}


def classify(label: str | None, baseline: str | None, replay: str | None) -> str:
    """CONTRACT ``diffs.kind``: ``regression`` when the label agreed with the
    baseline and disagrees with the replay, ``fix`` the reverse, ``change``
    otherwise (no label, or one that agrees with neither, or a code-only
    difference the label cannot tell apart). A side that made no decision
    (a validator one suite does not run) did not object: it reads as
    ``accept``, as it does for flips."""
    baseline, replay = baseline or "accept", replay or "accept"
    if label is None or baseline == replay:
        return "change"
    if label == baseline:
        return "regression"
    if label == replay:
        return "fix"
    return "change"
