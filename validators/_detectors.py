"""Loop detectors, streaming form: fed one :class:`StepRecord` at a time.

Each detector object watches one run and does constant work per step (it
keeps counters and at most ``period`` recent tokens, never the history). It
reports a :class:`Finding` when its pattern *starts* to hold, once per
episode, so a long loop is one diagnosis, not one per step; ``active`` says
whether the pattern holds at the last step seen (what a live stop decision
needs). The batch forms in ``_detectors_batch`` compute the same findings
over a table of many runs; a property test holds them equal.

Patterns (all on runtime facts):

* ``loop.repeated_call`` — the same non-empty set of calls (tool +
  canonical-arguments hash, in order) in ``threshold`` consecutive steps.
* ``loop.repeated_error`` — the same error code seen ``threshold`` times in a run.
* ``loop.no_progress`` — ``window`` consecutive steps without a progress
  marker (new evidence, a completed operation, a smaller candidate set).
  An open step (``StepRecord.open``: the calls a candidate proposes, before
  anything ran) does not count.
* ``loop.oscillation`` — the step tokens (calls, or the states visited)
  repeat with period ``period`` for ``cycles`` cycles, and are not constant
  (a constant sequence is ``repeated_call``'s business). The calls are the
  tool and argument hashes, so their repeating is a loop whatever comes
  back; the states a step visits only say what kind of step it was (a read,
  a call that waited for an approval), and a run doing different work in a
  steady rhythm repeats them too: a step that adds new evidence breaks a
  cycle of states.
"""

from __future__ import annotations

import copy

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopledger.canonical import canonical_json

from ._errors import ParamError
from ._params import int_param, str_list_param
from ._steps import StepRecord

__all__ = [
    "Finding",
    "Detector",
    "RepeatedCall",
    "RepeatedError",
    "NoProgress",
    "Oscillation",
    "DETECTORS",
    "make_detector",
    "detect_stream",
    "DIAGNOSIS_COLUMNS",
]

#: Columns of the ``loop_diagnoses`` table (CONTRACT) that a finding fills.
DIAGNOSIS_COLUMNS = ("run_id", "step", "detector", "detector_version", "pattern", "evidence_json")


@dataclass(frozen=True, slots=True)
class Finding:
    """One detector finding: a ``loop_diagnoses`` row."""

    run_id: str
    step: int
    detector: str
    detector_version: str
    pattern: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence_json(self) -> str:
        return canonical_json(self.evidence)

    def row(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step": self.step,
            "detector": self.detector,
            "detector_version": self.detector_version,
            "pattern": self.pattern,
            "evidence_json": self.evidence_json,
        }

    def key(self) -> tuple[str, int, str, str, str, str]:
        return (self.run_id, self.step, self.detector, self.detector_version, self.pattern, self.evidence_json)


def call_token(rec: StepRecord) -> str | None:
    """A step's call identity; ``None`` (never equal to anything) for a step without calls."""
    return "|".join(rec.calls) if rec.calls else None


def state_token(rec: StepRecord) -> str | None:
    return "|".join(rec.states) if rec.states else None


class Detector:
    """Base of the streaming detectors: one instance per run."""

    name = ""
    version = ""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)
        self.active = False

    def observe(self, rec: StepRecord) -> list[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def copy(self) -> Detector:
        """A copy that goes on independently (the loop validators keep a
        run's detector state between candidates and feed copies of it).
        Deep by default; the built-in detectors, whose state is a few
        scalars or small containers, copy those alone."""
        return copy.deepcopy(self)

    def _shallow(self) -> Any:
        """A copy sharing every attribute: for a detector whose mutable state
        is only scalars (``params`` is never changed after construction)."""
        new = object.__new__(type(self))
        new.__dict__ = self.__dict__.copy()
        return new

    def _finding(self, rec: StepRecord, pattern: str, evidence: dict[str, Any]) -> Finding:
        return Finding(rec.run_id, rec.step, self.name, self.version, pattern, evidence)


class RepeatedCall(Detector):
    name = "loop.repeated_call"
    version = "1"

    def copy(self) -> RepeatedCall:
        return self._shallow()  # type: ignore[no-any-return]

    def __init__(self, *, threshold: int = 3) -> None:
        super().__init__({"threshold": int_param("threshold", threshold, 2)})
        self.threshold = threshold
        self._last: str | None = None
        self._run = 0
        self._first = 0

    def observe(self, rec: StepRecord) -> list[Finding]:
        key = call_token(rec)
        if key is None:
            self._run = 0
        elif key == self._last:
            self._run += 1
        else:
            self._run = 1
            self._first = rec.step
        self._last = key
        self.active = self._run >= self.threshold
        if self._run == self.threshold:
            return [self._finding(rec, "repeated_call", {"call": key, "count": self.threshold, "first_step": self._first})]
        return []


class RepeatedError(Detector):
    name = "loop.repeated_error"
    version = "1"

    def copy(self) -> RepeatedError:
        new: RepeatedError = self._shallow()
        new._counts, new._first = dict(self._counts), dict(self._first)
        return new

    def __init__(self, *, threshold: int = 3) -> None:
        super().__init__({"threshold": int_param("threshold", threshold, 2)})
        self.threshold = threshold
        self._counts: dict[str, int] = {}
        self._first: dict[str, int] = {}

    def observe(self, rec: StepRecord) -> list[Finding]:
        out: list[Finding] = []
        for code in rec.errors:
            n = self._counts.get(code, 0) + 1
            self._counts[code] = n
            if n == 1:
                self._first[code] = rec.step
            if n == self.threshold:
                self.active = True
                out.append(
                    self._finding(rec, "repeated_error", {"code": code, "count": n, "first_step": self._first[code]})
                )
        return out


class NoProgress(Detector):
    name = "loop.no_progress"
    version = "1"

    def copy(self) -> NoProgress:
        return self._shallow()  # type: ignore[no-any-return]

    def __init__(self, *, window: int = 5) -> None:
        super().__init__({"window": int_param("window", window, 1)})
        self.window = window
        self._streak = 0
        self._first = 0
        self._last_candidates: int | None = None

    def observe(self, rec: StepRecord) -> list[Finding]:
        if rec.open:
            return []  # nothing ran in it yet
        narrowed = (
            rec.candidates is not None
            and self._last_candidates is not None
            and rec.candidates < self._last_candidates
        )
        if rec.candidates is not None:
            self._last_candidates = rec.candidates
        if rec.new_evidence > 0 or rec.completed_operations > 0 or narrowed:
            self._streak = 0
            self.active = False
            return []
        if self._streak == 0:
            self._first = rec.step
        self._streak += 1
        self.active = self._streak >= self.window
        if self._streak == self.window:
            return [self._finding(rec, "no_progress", {"window": self.window, "first_step": self._first})]
        return []


_CHANNELS: dict[str, Callable[[StepRecord], str | None]] = {"calls": call_token, "states": state_token}


class _Cycle:
    """Period-k cycle tracking over one token channel, O(k) memory, O(1) per step."""

    __slots__ = ("k", "need", "buf", "matches", "same", "holds")

    def __init__(self, period: int, cycles: int) -> None:
        self.k = period
        self.need = period * (cycles - 1)  # consecutive tok[i] == tok[i-k] matches
        self.buf: deque[str | None] = deque(maxlen=period)
        self.matches = 0
        self.same = 0  # length of the run of identical tokens ending here
        self.holds = False

    def copy(self) -> _Cycle:
        new = _Cycle.__new__(_Cycle)
        new.k, new.need, new.matches, new.same, new.holds = self.k, self.need, self.matches, self.same, self.holds
        new.buf = deque(self.buf, maxlen=self.k)
        return new

    def push(self, tok: str | None, progress: bool = False) -> bool:
        """Feed a token; True when the cycle starts to hold at this step. A
        step that made ``progress`` matches nothing."""
        buf = self.buf
        back = buf[0] if len(buf) == self.k else None
        self.matches = self.matches + 1 if tok is not None and tok == back and not progress else 0
        self.same = self.same + 1 if tok is not None and buf and buf[-1] == tok else 1
        buf.append(tok)
        was = self.holds
        self.holds = self.matches >= self.need and self.same < self.k
        return self.holds and not was


#: The channels whose cycle a step with new evidence breaks (see the module's docstring).
BROKEN_BY_PROGRESS = frozenset({"states"})


class Oscillation(Detector):
    name = "loop.oscillation"
    version = "2"  # 2: new evidence breaks a cycle of states

    def copy(self) -> Oscillation:
        new: Oscillation = self._shallow()
        new._tracks = [(channel, token, track.copy()) for channel, token, track in self._tracks]
        return new

    def __init__(self, *, period: int = 2, cycles: int = 3, channels: Iterable[str] = ("calls", "states")) -> None:
        channels = str_list_param("channels", channels, _CHANNELS)
        if not channels:
            raise ParamError("channels", "at least one of calls, states", channels)
        super().__init__(
            {"period": int_param("period", period, 2), "cycles": int_param("cycles", cycles, 2), "channels": list(channels)}
        )
        self.period = period
        self.cycles = cycles
        self._tracks = [(ch, _CHANNELS[ch], _Cycle(period, cycles)) for ch in channels]

    def observe(self, rec: StepRecord) -> list[Finding]:
        out: list[Finding] = []
        active = False
        for channel, token, track in self._tracks:
            if track.push(token(rec), rec.new_evidence > 0 and channel in BROKEN_BY_PROGRESS):
                out.append(
                    self._finding(
                        rec,
                        f"oscillation_{channel}",
                        {"channel": channel, "period": self.period, "cycles": self.cycles, "cycle": list(track.buf)},
                    )
                )
            active = active or track.holds
        self.active = active
        return out


#: Every detector by name; the class carries its version.
DETECTORS: Mapping[str, type[Detector]] = {
    cls.name: cls for cls in (RepeatedCall, RepeatedError, NoProgress, Oscillation)
}


def make_detector(name: str, params: Mapping[str, Any] | None = None) -> Detector:
    """A fresh streaming detector (for one run)."""
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ParamError("detector", f"one of {', '.join(DETECTORS)}", name) from None
    return cls(**dict(params or {}))


def detect_stream(
    records: Iterable[StepRecord], detectors: Iterable[tuple[str, Mapping[str, Any]]]
) -> list[Finding]:
    """Feed records of many runs (each run's in step order) to one streaming
    detector per run and detector; return every finding, in feed order."""
    specs = list(detectors)
    live: dict[str, list[Detector]] = {}
    out: list[Finding] = []
    for rec in records:
        dets = live.get(rec.run_id)
        if dets is None:
            dets = live[rec.run_id] = [make_detector(name, params) for name, params in specs]
        for det in dets:
            out.extend(det.observe(rec))
    return out
