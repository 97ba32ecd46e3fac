"""The loop detectors as suite members (validator form).

A live stop decision is taken on the candidate: the detector replays the
run's finished steps (``facts.history``) through its streaming form and, for
the patterns made of calls, adds the candidate's own canonical calls as the
step being decided. If the pattern holds there, the candidate is rejected
before anything runs: ``loop_detected`` (or ``no_progress``), with the
finding's evidence. Error and progress patterns read finished steps only:
the candidate has not produced errors or progress yet.
"""

from __future__ import annotations

from typing import Any

from ._detectors import Detector, Finding, NoProgress, Oscillation, RepeatedCall, RepeatedError
from ._model import DecisionInput, Verdict
from ._registry import Issue, validator
from ._steps import StepRecord, call_key


def _candidate_step(inp: DecisionInput) -> StepRecord:
    calls = tuple(call_key(c.tool, c.args_hash) for c in inp.proposed_calls)
    return StepRecord(run_id=inp.run_id, step=inp.step, calls=calls)


def _run(det: Detector, inp: DecisionInput, with_candidate: bool) -> Finding | None:
    last: Finding | None = None
    for rec in inp.facts.history:
        for f in det.observe(rec):
            last = f
    if with_candidate:
        for f in det.observe(_candidate_step(inp)):
            last = f
    return last if det.active else None


def _issue(code: str, finding: Finding | None, detector: str) -> list[Issue]:
    if finding is None:
        return []
    evidence: dict[str, Any] = {"detector": detector, "pattern": finding.pattern, "since_step": finding.step, **finding.evidence}
    return [Issue(Verdict.REJECT, code, f"{detector}: {finding.pattern} holds since step {finding.step}", evidence)]


@validator(name="loop.repeated_call", version="1")
def repeated_call(*, threshold: int = 3):
    """Codes: loop_detected (reject). Params: threshold (consecutive identical steps, >= 2)."""
    RepeatedCall(threshold=threshold)  # validates the params now, not per candidate

    def check(inp: DecisionInput) -> list[Issue]:
        return _issue("loop_detected", _run(RepeatedCall(threshold=threshold), inp, True), "loop.repeated_call")

    return check


@validator(name="loop.repeated_error", version="1")
def repeated_error(*, threshold: int = 3):
    """Codes: loop_detected (reject). Params: threshold (occurrences of one error code, >= 2)."""
    RepeatedError(threshold=threshold)

    def check(inp: DecisionInput) -> list[Issue]:
        return _issue("loop_detected", _run(RepeatedError(threshold=threshold), inp, False), "loop.repeated_error")

    return check


@validator(name="loop.no_progress", version="1")
def no_progress(*, window: int = 5):
    """Codes: no_progress (reject). Params: window (steps without a progress marker, >= 1)."""
    NoProgress(window=window)

    def check(inp: DecisionInput) -> list[Issue]:
        return _issue("no_progress", _run(NoProgress(window=window), inp, False), "loop.no_progress")

    return check


@validator(name="loop.oscillation", version="1")
def oscillation(*, period: int = 2, cycles: int = 3, channels: tuple[str, ...] = ("calls", "states")):
    """Codes: loop_detected (reject). Params: period (>= 2), cycles (>= 2),
    channels (calls, states)."""
    Oscillation(period=period, cycles=cycles, channels=channels)
    with_calls = "calls" in channels
    with_states = "states" in channels

    def check(inp: DecisionInput) -> list[Issue]:
        # Calls include the candidate's; states only the finished steps (the
        # candidate's step has not finished visiting its states).
        found = None
        if with_calls:
            found = _run(Oscillation(period=period, cycles=cycles, channels=("calls",)), inp, True)
        if found is None and with_states:
            found = _run(Oscillation(period=period, cycles=cycles, channels=("states",)), inp, False)
        return _issue("loop_detected", found, "loop.oscillation")

    return check
