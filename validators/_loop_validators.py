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

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ._detectors import Detector, Finding, NoProgress, Oscillation, RepeatedCall, RepeatedError
from ._model import DecisionInput, Verdict
from ._registry import Issue, validator
from ._steps import StepRecord, call_key


def _candidate_step(inp: DecisionInput) -> StepRecord:
    calls = tuple(call_key(c.tool, c.args_hash) for c in inp.proposed_calls)
    return StepRecord(run_id=inp.run_id, step=inp.step, calls=calls, open=True)


class _Prefixes:
    """Detector states after a run's finished steps, kept between candidates.

    Each candidate of a run sees the same history as the one before plus the
    steps since, so feeding only those steps into a copy of the remembered
    state gives exactly what feeding the whole history would, at constant
    cost per step instead of a cost that grows with the run. The remembered
    prefix is compared with the candidate's history before it is used (a
    cheap identity check when the caller reuses the records), so a different
    history under the same run id never borrows another's state. Only a
    cache: the decision is a function of the input alone.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], tuple[tuple[StepRecord, ...], Detector, Finding | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        #: The last (history, prefix) pair found to match: the loop validators
        #: of one candidate all ask about the same two tuples.
        self._matched: tuple[tuple[StepRecord, ...], tuple[StepRecord, ...]] | None = None

    def _extends(self, history: tuple[StepRecord, ...], prefix: tuple[StepRecord, ...]) -> bool:
        matched = self._matched
        if matched is not None and matched[0] is history and matched[1] is prefix:
            return True
        if _same_prefix(history, prefix):
            self._matched = (history, prefix)
            return True
        return False

    def fed(self, key: str, inp: DecisionInput, make: Callable[[], Detector]) -> tuple[Detector, Finding | None]:
        """A detector fed the whole history, and the last finding it made."""
        history = inp.facts.history
        if len(history) <= SHORT_HISTORY:
            # Replaying a few steps costs less than copying a remembered state.
            det, last = make(), None
            for rec in history:
                for f in det.observe(rec):
                    last = f
            return det, last
        slot = (key, inp.run_id)
        with self._lock:
            # The remembered detector is extended in place (only this cache
            # holds it, and only under the lock); the caller gets a copy, which
            # it goes on feeding with the candidate's own step.
            entry = self._entries.get(slot)
            det, last, start = None, None, 0
            if entry is not None:
                prefix, state, found = entry
                if len(prefix) <= len(history) and self._extends(history, prefix):
                    det, last, start = state, found, len(prefix)
            if det is None:
                det = make()
            for rec in history[start:]:
                for f in det.observe(rec):
                    last = f
            self._entries[slot] = (history, det, last)
            self._entries.move_to_end(slot)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return det.copy(), last


def _same_prefix(history: tuple[StepRecord, ...], prefix: tuple[StepRecord, ...]) -> bool:
    """Whether ``history`` starts with ``prefix``. The engine's view and the
    replay's fold extend one list of records, so a remembered prefix is
    normally made of the very same objects: compared by identity first (a
    C loop), by value only when that fails."""
    head = history[: len(prefix)]
    return all(map(operator.is_, head, prefix)) or head == prefix


#: Histories up to this long are replayed from scratch, not remembered.
SHORT_HISTORY = 32

_PREFIXES = _Prefixes()


def _run(make: Callable[[], Detector], key: str, inp: DecisionInput, with_candidate: bool) -> Finding | None:
    det, last = _PREFIXES.fed(key, inp, make)
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
        found = _run(lambda: RepeatedCall(threshold=threshold), f"repeated_call:{threshold}", inp, True)
        return _issue("loop_detected", found, "loop.repeated_call")

    return check


@validator(name="loop.repeated_error", version="1")
def repeated_error(*, threshold: int = 3):
    """Codes: loop_detected (reject). Params: threshold (occurrences of one error code, >= 2)."""
    RepeatedError(threshold=threshold)

    def check(inp: DecisionInput) -> list[Issue]:
        found = _run(lambda: RepeatedError(threshold=threshold), f"repeated_error:{threshold}", inp, False)
        return _issue("loop_detected", found, "loop.repeated_error")

    return check


@validator(name="loop.no_progress", version="1")
def no_progress(*, window: int = 5):
    """Codes: no_progress (reject). Params: window (steps without a progress marker, >= 1)."""
    NoProgress(window=window)

    def check(inp: DecisionInput) -> list[Issue]:
        found = _run(lambda: NoProgress(window=window), f"no_progress:{window}", inp, False)
        return _issue("no_progress", found, "loop.no_progress")

    return check


@validator(name="loop.oscillation", version="2")  # 2: new evidence breaks a cycle of states
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
            found = _run(lambda: Oscillation(period=period, cycles=cycles, channels=("calls",)),
                         f"oscillation:calls:{period}:{cycles}", inp, True)
        if found is None and with_states:
            found = _run(lambda: Oscillation(period=period, cycles=cycles, channels=("states",)),
                         f"oscillation:states:{period}:{cycles}", inp, False)
        return _issue("loop_detected", found, "loop.oscillation")

    return check
