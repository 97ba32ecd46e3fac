"""What a replay returns: frozen results keyed by run.

The shape follows Temporal's replayer (``WorkflowReplayResult(s)``): a
result per run, and "the run failed" kept apart from "the replay
diverged". A recorded run that ended ``FAILED`` with ``loop_detected`` is
data about the run (:attr:`RunReplay.status`, :attr:`RunReplay.reason`);
a run whose decisions came out differently under the replayed suite
*diverged* (:attr:`RunReplay.divergence`); a run whose trace could not be
replayed at all carries :attr:`RunReplay.error`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

FAIL_ON = ("flips", "regressions", "never")
#: A replay id: the name of its folder under ``replays/``, so a plain name:
#: letters, digits, ``_ . - :``, not starting with a dot, at most 128
#: characters (``new_replay_id`` makes ``r20250101-120000-1a2b3c``). The one
#: definition: whatever reads replay folders by id matches with this.
REPLAY_ID = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,127}")


@dataclass(frozen=True, slots=True)
class Diff:
    """One decision whose verdict or code differs from the baseline (a
    ``diffs`` row). ``validator`` empty: the candidate's overall verdict."""

    run_id: str
    step: int
    attempt: int
    candidate_id: str
    validator: str
    baseline_verdict: str | None
    replay_verdict: str | None
    baseline_code: str | None
    replay_code: str | None
    #: ``regression``, ``fix`` or ``change`` (CONTRACT).
    kind: str
    #: The label that classified it, if one spoke.
    expected_verdict: str | None = None
    label_source: str | None = None
    baseline_validator_version: str | None = None
    replay_validator_version: str | None = None
    baseline_suite_version: str | None = None
    #: Later than the run's divergence point: judged on the recorded path,
    #: which the replayed suite would not have produced.
    after_divergence: bool = False

    @property
    def across_versions(self) -> bool:
        """Baseline and replay ran different versions of this validator: the
        difference may be the new version's, not the data's."""
        return (self.baseline_validator_version is not None and self.replay_validator_version is not None
                and self.baseline_validator_version != self.replay_validator_version)

    @property
    def candidate_level(self) -> bool:
        return self.validator == ""


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first candidate of a run where a decision differs."""

    run_id: str
    step: int
    attempt: int
    candidate_id: str
    #: The validators whose decisions differ there.
    validators: tuple[str, ...]

    def describe(self, suite: str) -> str:
        who = ", ".join(self.validators)
        return (f"diverges at step {self.step} (attempt {self.attempt}) on {who}: past this point the recorded "
                f"path is no longer what suite {suite} would have produced; later decisions are judged on the "
                f"recorded path, not on the one the new suite would have taken")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A loop detector's finding over the run's recorded steps (batch form)."""

    run_id: str
    step: int
    detector: str
    detector_version: str
    pattern: str
    evidence_json: str


@dataclass(frozen=True, slots=True)
class RunReplay:
    """One run's replay."""

    run_id: str
    task_id: str
    #: The recorded outcome: data about the run, not about the replay.
    status: str
    reason: str | None
    #: Candidates recorded for the run; those that entered VALIDATING (a
    #: trusted finish) were re-run, and decisions made on them.
    candidates: int = 0
    candidates_rerun: int = 0
    decisions: int = 0
    diffs: tuple[Diff, ...] = ()
    divergence: Divergence | None = None
    diagnoses: tuple[Diagnosis, ...] = ()
    labels: int = 0
    #: Labelled decisions the replay agrees with.
    labels_agreeing: int = 0
    #: Candidates re-run that the baseline (an earlier replay) made no
    #: decision on: not compared, so never a diff.
    not_in_baseline: int = 0
    #: Candidates re-run that have no recorded decisions to compare with (an
    #: imported run without ``--decide``): each objecting decision is a
    #: ``change``, and a label on the candidate as a whole classifies nothing.
    not_recorded: int = 0
    #: Set when the trace of this run could not be replayed (a missing artifact).
    error: str | None = None
    #: The suite versions of the run's recorded decisions (against
    #: ``recorded``; empty against an earlier replay, which ran one suite).
    baseline_suites: tuple[str, ...] = ()

    @property
    def diverged(self) -> bool:
        return self.divergence is not None

    @property
    def run_failed(self) -> bool:
        """The recorded run ended other than SUCCEEDED (data, not a replay failure)."""
        return self.status != "SUCCEEDED"

    @property
    def flips(self) -> tuple[Diff, ...]:
        return tuple(d for d in self.diffs if not d.candidate_level)

    @property
    def not_compared(self) -> bool:
        """The baseline made no decision on any of the run's re-run candidates."""
        return 0 < self.not_in_baseline == self.candidates_rerun

    @property
    def regressions(self) -> tuple[Diff, ...]:
        return tuple(d for d in self.diffs if d.kind == "regression")

    @property
    def fixes(self) -> tuple[Diff, ...]:
        return tuple(d for d in self.diffs if d.kind == "fix")


@dataclass(frozen=True, slots=True)
class Summary:
    """The ``summary`` row."""

    replay_id: str
    suite_name: str
    suite_version: str
    #: ``recorded`` or the replay id compared with.
    baseline: str
    runs: int
    #: Every recorded candidate of the replayed runs.
    candidates: int
    #: Those the suite was re-run on: every candidate that entered VALIDATING
    #: (a truncated, cut or failed stream never does; the engine made a new
    #: attempt instead, and there is no decision to replay).
    candidates_rerun: int
    decisions: int
    #: Validator decisions whose verdict or code differs from the baseline.
    flips: int
    #: Candidates whose overall verdict differs.
    candidate_flips: int
    regressions: int
    fixes: int
    changes: int
    #: Flips that compare two versions of one validator (shown apart).
    flips_across_versions: int
    runs_diverged: int
    #: Candidates re-run that the baseline replay made no decision on (runs
    #: recorded since, outside its traces, or that it could not replay):
    #: not compared. Always 0 against the recorded decisions.
    not_in_baseline: int
    #: Candidates re-run that have no recorded decisions (imported without
    #: ``--decide``): compared with nothing, so no candidate flip, and their
    #: labels on the candidate as a whole classify no diff. Always 0 against
    #: an earlier replay.
    not_recorded: int
    #: Suite versions the recorded decisions were made under (0 against an
    #: earlier replay). Above 1, runs recorded under different suites are
    #: compared alike: a flip on one can be its suite's difference.
    baseline_suites: int
    #: Recorded runs that did not succeed (data about the runs).
    runs_failed: int
    #: Runs whose trace could not be replayed.
    run_errors: int
    diagnoses: int
    labels: int
    labels_agreeing: int
    seconds: float


@dataclass(frozen=True)
class ReplayResult:
    """A replay of a trace set under one suite. ``runs`` is read-only."""

    summary: Summary
    runs: Mapping[str, RunReplay] = field(default_factory=lambda: MappingProxyType({}))
    #: Where the replay tables were written (``replays/<id>``), if anywhere.
    path: Path | None = None

    @property
    def replay_id(self) -> str:
        return self.summary.replay_id

    @property
    def diffs(self) -> tuple[Diff, ...]:
        return tuple(d for r in self.runs.values() for d in r.diffs)

    @property
    def diverged(self) -> tuple[RunReplay, ...]:
        return tuple(r for r in self.runs.values() if r.diverged)

    @property
    def errors(self) -> tuple[RunReplay, ...]:
        return tuple(r for r in self.runs.values() if r.error is not None)

    def failures(self, fail_on: str = "regressions") -> tuple[Diff, ...]:
        """The diffs that fail a CI gate: every validator flip (``flips``),
        regressions only (``regressions``), or none (``never``)."""
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on: expected one of {', '.join(FAIL_ON)}, got {fail_on!r}")
        if fail_on == "flips":
            return tuple(d for d in self.diffs if not d.candidate_level)
        if fail_on == "regressions":
            return tuple(d for d in self.diffs if d.kind == "regression")
        return ()

    def ok(self, fail_on: str = "regressions") -> bool:
        """The CI gate: no failure under ``fail_on``, and every run replayed.
        A run that could not be replayed (:attr:`errors`) fails it whatever
        ``fail_on`` says: passing on less than was recorded is no pass."""
        return not self.failures(fail_on) and not self.errors
