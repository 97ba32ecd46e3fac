"""Replaying one partition: every validated candidate of its runs, re-decided.

A worker (its own process, or the caller's for small trace sets) reads its
partition's rows, folds each run's events with the engine's own
:func:`~loopledger.engine.validated_candidates`, rebuilds each decision
input with :func:`~loopledger.engine.decision_input` (the function the
live controller calls, so the recording suite gives back the recorded
decisions), evaluates each suite, compares with the baseline and the
labels, and runs the loop detectors' batch form over the partition's step
table. Decision, diff and diagnosis rows go to the replay's own Parquet
files; only per-run results go back to the caller.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections import defaultdict
from itertools import groupby, takewhile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loopledger._parquet import one_line
from loopledger.canonical import canonical_json

from ._errors import RunTraceError
from ._labels import Label, classify, effective, scenario_labels
from ._result import Diagnosis, Diff, Divergence, RunReplay

_SEVERITY = {"accept": 0, "repair": 1, "ask": 2, "reject": 3}


def _loads(text: str) -> Any:
    """Parse a recorded JSON text: orjson (about twice as fast as json), and
    json for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


#: Verdict -> its string (a dict lookup is several times cheaper than the
#: enum's ``.value`` on the per-decision path); filled by :func:`run_job`.
_VALUE: dict[Any, str] = {}


@dataclass(frozen=True)
class SuiteRef:
    """A suite as a worker process can rebuild it: a reference that
    :func:`load_suite` reads, or a suite's pinned mapping plus the modules
    that register its validators (a :class:`Suite` object itself holds
    closures, which do not cross a process boundary)."""

    ref: str | None
    mapping: Mapping[str, Any] | None = None
    modules: tuple[str, ...] = ()

    def load(self) -> Any:
        from loopledger.validators import load_suite, parse_suite

        if self.ref is not None:
            return load_suite(self.ref)
        for module in self.modules:
            importlib.import_module(module)
        return parse_suite(self.mapping, "suite")


@dataclass(frozen=True)
class Job:
    """One partition to replay under one or more suites."""

    work: Path
    part: int
    suites: tuple[SuiteRef, ...]
    replay_ids: tuple[str, ...]
    #: ``replays/<id>.partial`` per suite, or None: write no tables.
    outputs: tuple[Path | None, ...]
    has_baseline: bool
    #: The baseline is the traces' own ``validations`` (not an earlier
    #: replay, which may cover runs these traces no longer hold).
    recorded_baseline: bool = True


DECISION_COLUMNS = ("replay_id", "run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                    "suite_version", "verdict", "code", "message", "evidence_json")
DIFF_COLUMNS = ("replay_id", "run_id", "step", "attempt", "candidate_id", "validator", "baseline_verdict",
                "replay_verdict", "baseline_code", "replay_code", "kind", "expected_verdict", "label_source",
                "baseline_validator_version", "replay_validator_version", "baseline_suite_version",
                "across_versions", "after_divergence")
DIAGNOSIS_COLUMNS = ("replay_id", "run_id", "step", "detector", "detector_version", "pattern", "evidence_json")
_INT_COLUMNS = frozenset({"step", "attempt"})
_BOOL_COLUMNS = frozenset({"across_versions", "after_divergence"})


def _frame(work: Path, relation: str, part: int, columns: Sequence[str] | None = None) -> Any:
    """One relation of one partition as a polars frame (None when empty).

    polars rather than pyarrow's ``to_pylist``: its column-to-list
    conversion is several times faster, and pyarrow's conversion of Python
    lists imports pandas (a second per worker for nothing)."""
    import polars as pl

    folder = work / relation / f"part={part}"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return None
    return pl.concat([pl.read_parquet(f, columns=columns, hive_partitioning=False) for f in files],
                     how="vertical_relaxed")


def _broken_sequences(events: Any) -> dict[str, str]:
    """Runs whose event seqs are not 1, 2, 3, ... without a gap or a repeat."""
    import polars as pl

    seq = pl.col("seq")
    bad = (events.group_by("run_id")
           .agg(pl.len().alias("n"), seq.min().alias("lo"), seq.max().alias("hi"), seq.n_unique().alias("distinct"))
           .filter((pl.col("lo") != 1) | (pl.col("hi") != pl.col("n")) | (pl.col("distinct") != pl.col("n"))))
    out = {}
    for run_id, n, lo, hi, distinct in bad.iter_rows():
        what = (f"{n - distinct} seq(s) repeated" if distinct != n
                else f"seqs {lo}..{hi} in {n} event(s): some are missing")
        out[run_id] = f"events: {what} (expected 1, 2, 3, ... once each)"
    return out


def _spans(keys: Sequence[Any]) -> dict[Any, tuple[int, int]]:
    """key -> (start, end) of each run of equal keys in a sorted column."""
    spans: dict[Any, tuple[int, int]] = {}
    start = 0
    for key, group in groupby(keys):
        end = start + sum(1 for _ in group)
        spans[key] = (start, end)
        start = end
    return spans


#: Event kinds whose payload the run view does not read (see RunView.apply):
#: parsed (to know it is JSON), not folded.
_UNREAD_PAYLOADS = frozenset({"decisions", "run_created", "late_event"})


#: JSON's names of the values a payload may hold.
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null", dict: "an object"}


#: A ``step_closed`` payload's fields (the StepRecord the engine wrote) and
#: what each holds: they become the step table's typed columns.
_STEP_TYPES = {"run_id": "text", "step": "whole", "states": "texts", "calls": "texts", "errors": "texts",
               "new_evidence": "whole", "completed_operations": "whole"}


def _check_step(run_id: str, seq: int, p: dict[str, Any]) -> None:
    """A ``step_closed`` payload holds a step record: every field, each of
    its type (``candidates`` a whole number or null)."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    checks = {"text": lambda v: isinstance(v, str), "whole": whole,
              "texts": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
    wanted = {"text": "text", "whole": "a whole number", "texts": "a list of texts"}
    for field, kind in _STEP_TYPES.items():
        if field not in p or not checks[kind](p[field]):
            got = "missing" if field not in p else f"got {_JSON_KINDS.get(type(p[field]), 'a value')}"
            raise RunTraceError(run_id, f"events: seq {seq} (step_closed): {field} {got}; expected {wanted[kind]}")
    if p.get("candidates") is not None and not whole(p["candidates"]):
        raise RunTraceError(run_id, f"events: seq {seq} (step_closed): candidates is not a whole number or null")


def _object(run_id: str, seq: int, kind: str, payload: str | None) -> dict[str, Any]:
    """An event's payload, a JSON object (none is an empty one)."""
    if not payload:
        return {}
    try:
        value = _loads(payload)
    except ValueError as exc:  # orjson's and json's decode errors are ValueErrors
        raise RunTraceError(run_id, f"events: seq {seq} ({kind}): its payload_json is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise RunTraceError(run_id, f"events: seq {seq} ({kind}): its payload_json is {_JSON_KINDS[type(value)]}; "
                                    "expected a JSON object")
    return value


class _Partition:
    """A partition's rows, column by column, sorted and indexed by run."""

    def __init__(self, work: Path, part: int, has_baseline: bool, recorded_baseline: bool = True) -> None:
        runs = _frame(work, "runs", part)
        #: run -> why it cannot be replayed (a seq missing or repeated, a
        #: run row or a recorded decision twice: part of the trace was lost
        #: or written twice).
        self.broken: dict[str, str] = {}
        self.runs: list[dict[str, Any]] = []
        for run in runs.sort("run_id", maintain_order=True).to_dicts() if runs is not None else []:
            if self.runs and self.runs[-1]["run_id"] == run["run_id"]:
                self.broken[run["run_id"]] = "runs: more than one row for this run; expected one"
                continue
            self.runs.append(run)
        events = _frame(work, "events", part)
        if events is not None:
            # A run's events in seq order (stable: equal seqs keep file order).
            events = events.sort(["run_id", "seq"], maintain_order=True)
            self.broken.update(_broken_sequences(events))
            self.event_columns = [events[c].to_list() for c in ("kind", "to_state", "step", "attempt",
                                                               "payload_json", "seq")]
            self.event_spans = _spans(events["run_id"].to_list())
        else:
            self.event_columns, self.event_spans = [[] for _ in range(6)], {}
        # Every recorded candidate counts, including those the engine never
        # validated (an untrusted finish is a new attempt, not a decision).
        candidates = _frame(work, "candidates", part, ["run_id"])
        self.recorded_candidates: dict[str, int] = (
            dict(candidates.group_by("run_id").len().iter_rows()) if candidates is not None else {})
        # run -> candidate -> validator -> (verdict, code, validator_version, suite_version)
        self.baseline: dict[str, dict[str, dict[str, tuple[Any, ...]]]] | None = None
        if has_baseline:
            self.baseline = defaultdict(lambda: defaultdict(dict))
            rows = _frame(work, "baseline", part)
            if rows is not None:
                cols = [rows[c].to_list() for c in ("run_id", "candidate_id", "validator", "verdict", "code",
                                                     "validator_version", "suite_version")]
                base = self.baseline
                for run_id, cid, validator, *rest in zip(*cols):
                    row, known = tuple(rest), base[run_id][cid].get(validator)
                    if known is not None and known != row:
                        self.broken.setdefault(run_id, f"validations: two recorded decisions of {validator} on "
                                                       f"candidate {cid} disagree ({known[0]} {known[1]}, "
                                                       f"{row[0]} {row[1]}); expected one")
                    base[run_id][cid][validator] = row
        #: The baseline is the traces' own decisions; an earlier replay's
        #: leaves out what it never decided on (see ``_compare_run``).
        self.recorded_baseline = recorded_baseline
        self.labels: dict[str, list[dict[str, Any]]] = defaultdict(list)
        labels = _frame(work, "labels", part)
        if labels is not None:
            for row in labels.to_dicts():
                self.labels[row["run_id"]].append(row)
        self._name_orphans(recorded_baseline)
        bodies = _frame(work, "bodies", part)
        self.bodies: dict[str, str] = (
            dict(zip(bodies["artifact_id"].to_list(), bodies["body"].to_list())) if bodies is not None else {}
        )

    def _name_orphans(self, recorded_baseline: bool) -> None:
        """A run with events, candidates or recorded decisions but no row in
        ``runs`` is replayed as a run that could not be: passed over, its
        decisions would drop out of the comparison unseen."""
        known = {run["run_id"] for run in self.runs}
        decided = self.baseline if recorded_baseline and self.baseline is not None else {}
        orphans = (set(self.event_spans) | set(self.recorded_candidates) | set(decided)) - known
        for run_id in sorted(orphans):
            span = self.event_spans.get(run_id)
            held = [f"{span[1] - span[0]} event(s)" if span else "",
                    f"{self.recorded_candidates[run_id]} candidate(s)" if run_id in self.recorded_candidates else "",
                    f"decisions on {len(decided[run_id])} candidate(s)" if run_id in decided else ""]
            self.runs.append({"run_id": run_id, "task_id": "", "status": "", "reason": None, "spec_json": None})
            self.broken[run_id] = f"runs: no row for this run, which has {', '.join(h for h in held if h)}"
        if orphans:
            self.runs.sort(key=lambda run: run["run_id"])

    def events(self, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[Any, ...]]]:
        """The run's events in seq order up to its last validated candidate,
        payloads parsed (empty for the kinds the run view does not read); the
        payloads of all its ``step_closed`` events; and (step, attempt, seq,
        payload) of its ``decisions`` events (see :func:`_decision_briefs`).
        Events after the last candidate entered VALIDATING cannot change a
        decision: they are not folded. Every payload must be a JSON object."""
        span = self.event_spans.get(run_id)
        if span is None:
            return [], [], []
        start, end = span
        kinds, states, steps, attempts, payloads, seqs = (c[start:end] for c in self.event_columns)
        last = -1
        for i in range(len(kinds) - 1, -1, -1):
            if kinds[i] == "transition" and states[i] == "VALIDATING":
                last = i
                break
        # Every payload is read (a broken one after the last candidate is
        # still a trace that was changed); those the run view does not read
        # are not kept.
        parsed = [_object(run_id, seq, kind, payload) for kind, payload, seq in zip(kinds, payloads, seqs)]
        for kind, p, seq in zip(kinds, parsed, seqs):
            if kind == "step_closed":
                _check_step(run_id, seq, p)
        unread = _UNREAD_PAYLOADS
        folded = [{"kind": kind, "to_state": to_state, "step": step, "attempt": attempt,
                   "payload": payload if kind not in unread else {}}
                  for kind, to_state, step, attempt, payload in zip(kinds[:last + 1], states[:last + 1],
                                                                    steps[:last + 1], attempts[:last + 1],
                                                                    parsed[:last + 1])]
        closed = [p for kind, p in zip(kinds, parsed) if kind == "step_closed"]
        decided = [(step, attempt, seq, p) for kind, step, attempt, seq, p in zip(kinds, steps, attempts, seqs, parsed)
                   if kind == "decisions"]
        return folded, closed, decided


def _decision_briefs(run_id: str, decided: Sequence[tuple[Any, ...]]) -> list[tuple[int, int, dict[str, Any]]]:
    """(step, attempt, payload) of the run's ``decisions`` events (from
    :meth:`_Partition.events`): what its recorded decisions were, in brief
    (the overall verdict and the blocking ones)."""
    for _, _, seq, brief in decided:
        if not isinstance(brief.get("verdict"), str) or not isinstance(brief.get("blocking", []), list):
            raise RunTraceError(run_id, f"events: seq {seq} (decisions): no verdict or blocking decisions in its "
                                        "payload; expected what the engine records (verdict, count, blocking)")
    return [(step, attempt, brief) for step, attempt, _, brief in decided]


#: Suites this process loaded for the replay under way: a process replays
#: several partitions of one replay, and its suite files are read once. Keyed
#: by the replay ids too, so a later replay reads a changed file afresh.
_SUITES: dict[tuple[str, tuple[str, ...]], Any] = {}


def _loaded(ref: SuiteRef, replay_ids: tuple[str, ...]) -> Any:
    if ref.ref is None:
        return ref.load()
    key = (ref.ref, replay_ids)
    suite = _SUITES.get(key)
    if suite is None:
        suite = _keep(key, ref.load())
    return suite


def _keep(key: tuple[str, tuple[str, ...]], suite: Any) -> Any:
    """``suite`` kept under ``key`` (a few at most: one replay's suites)."""
    if len(_SUITES) >= 8:
        _SUITES.clear()
    _SUITES[key] = suite
    return suite


def remember(ref: SuiteRef, replay_ids: tuple[str, ...], suite: Any) -> None:
    """The suite the caller already loaded for ``ref``: its own process
    replays with that object, and does not load the reference again (a
    ``module:attr`` factory that registers validators would run twice)."""
    if ref.ref is not None:
        _keep((ref.ref, replay_ids), suite)


def warm(suites: Sequence[SuiteRef], replay_ids: tuple[str, ...]) -> None:
    """Import what a job needs and load its suites (a pool process's first
    task, so that the imports overlap the partitioning)."""
    import polars  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import loopledger.engine  # noqa: F401

    for ref in suites:
        _loaded(ref, replay_ids)


def run_job(job: Job) -> list[list[RunReplay]]:
    """Replay one partition; return, per suite, the partition's run results."""
    from loopledger.validators import Verdict

    _VALUE.update((v, v.value) for v in Verdict)
    suites = [_loaded(ref, job.replay_ids) for ref in job.suites]
    data = _Partition(job.work, job.part, job.has_baseline, job.recorded_baseline)
    decisions: list[list[tuple[Any, ...]]] = [[] for _ in suites]
    diffs: list[list[tuple[Any, ...]]] = [[] for _ in suites]
    results: list[list[RunReplay]] = [[] for _ in suites]
    steps: dict[str, list[Any]] = {name: [] for name in _STEP_FIELDS}
    for run in data.runs:
        run_id = run["run_id"]
        try:
            if run_id in data.broken:
                raise RunTraceError(run_id, data.broken[run_id])
            events, closed, decided = data.events(run_id)
            if run_id not in data.event_spans and data.recorded_candidates.get(run_id):
                raise RunTraceError(run_id, f"events: none in the traces, for "
                                            f"{data.recorded_candidates[run_id]} recorded candidate(s)")
            evaluated, open_calls = _evaluate_run(run, events, data.bodies, suites)
            _check_baseline_covered(run_id, evaluated, data.baseline)
            if data.baseline is not None and data.recorded_baseline:
                _check_recorded_decisions(run_id, evaluated, data.baseline.get(run_id, {}),
                                          _decision_briefs(run_id, decided))
            error = None
        except RunTraceError as exc:
            evaluated, open_calls, closed, error = [], (), [], exc.reason
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            # JSON of the wrong shape in a payload or a body (a field
            # missing, a list where an object was recorded, a state no
            # build has): the run cannot be read back.
            evaluated, open_calls, closed = [], (), []
            error = f"its events or artifacts could not be read back ({one_line(exc)})"
        if evaluated:
            _step_columns(run_id, closed, evaluated[-1][0][0], open_calls, steps)
        for i, suite in enumerate(suites):
            rid = job.replay_ids[i]
            mine = [(c, res[i]) for c, res in evaluated] if len(suites) > 1 else [(c, res[0]) for c, res in evaluated]
            results[i].append(_compare_run(run, mine, data, suite, rid, error, decisions[i], diffs[i],
                                           write=job.outputs[i] is not None))
    for i, suite in enumerate(suites):
        found = _diagnose(steps, suite)
        by_run: dict[str, list[Diagnosis]] = defaultdict(list)
        for d in found:
            by_run[d.run_id].append(d)
        if by_run:
            results[i] = [_with_diagnoses(r, by_run.get(r.run_id, ())) for r in results[i]]
        out = job.outputs[i]
        if out is not None:
            rid = job.replay_ids[i]
            part = f"part-{job.part:05d}.parquet"
            _write(out / "decisions" / part, DECISION_COLUMNS, decisions[i])
            _also(out / "decisions" / part, out / VALIDATIONS / part)
            _write(out / "diffs" / part, DIFF_COLUMNS, diffs[i])
            _write(out / "loop_diagnoses" / part, DIAGNOSIS_COLUMNS,
                   [(rid, d.run_id, d.step, d.detector, d.detector_version, d.pattern, d.evidence_json)
                    for d in found])
    return results


def _with_diagnoses(result: RunReplay, found: Iterable[Diagnosis]) -> RunReplay:
    from dataclasses import replace

    return replace(result, diagnoses=tuple(found))


# --- evaluation -------------------------------------------------------------------


def _evaluate_run(run: Mapping[str, Any], events: Sequence[Mapping[str, Any]], bodies: Mapping[str, str],
                  suites: Sequence[Any]) -> tuple[list[tuple[tuple[int, int, str], list[Any]]], tuple[str, ...]]:
    """Every validated candidate of the run: ((step, attempt, candidate_id),
    [SuiteResult per suite]); and the call keys the last one proposes."""
    from loopledger.engine import decision_input, validated_candidates

    contexts: dict[str, Any] = {}
    out = []
    inp = None
    artifact = _reader(bodies)
    for view, candidate_id, context_id in validated_candidates(run, events):
        candidate_text = _body(bodies, candidate_id, run["run_id"], "candidate")
        context = contexts.get(context_id)
        if context is None:
            # Attempts of one step share their context: read it once.
            context = contexts[context_id] = _loads(_body(bodies, context_id, run["run_id"], "context"))
        inp = decision_input(view, _loads(candidate_text), context, candidate_id, artifact=artifact)
        out.append(((view.step, view.attempt, candidate_id), [s.evaluate(inp) for s in suites]))
    return out, tuple(c.call_key for c in inp.proposed_calls) if inp is not None else ()


def _check_baseline_covered(run_id: str, evaluated: Sequence[tuple[tuple[int, int, str], Any]],
                            baseline: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Every candidate the baseline decided on is one the events brought to
    VALIDATING; otherwise part of the run's trace is missing, and comparing
    the rest would pass over decisions silently."""
    decided = baseline.get(run_id) if baseline is not None else None
    if not decided:
        return
    seen = {cid for (_, _, cid), _ in evaluated}
    missing = [cid for cid in decided if cid not in seen]
    if missing:
        raise RunTraceError(run_id, f"the baseline has decisions on {len(missing)} candidate(s) the events never "
                                    f"bring to VALIDATING (first: {missing[0]}): events are missing")


def _check_recorded_decisions(run_id: str, evaluated: Sequence[tuple[tuple[int, int, str], Any]],
                              decided: Mapping[str, Mapping[str, tuple[Any, ...]]],
                              briefs: Sequence[tuple[int, int, Mapping[str, Any]]]) -> None:
    """The recorded decisions (``validations``) hold what the run's
    ``decisions`` events say was decided: a decision on every candidate the
    events name, as many as the event counts, each blocking decision as the
    event gives it, the same overall verdict. A row lost (or changed) would
    otherwise read as the replay's own change, a flip or a fix, and a gate
    would pass on less than was recorded."""
    at = {(step, attempt): cid for (step, attempt, cid), _ in evaluated}
    for step, attempt, brief in briefs:
        cid = at.get((step, attempt))
        if cid is None:
            continue
        rows = decided.get(cid)
        where = f"the candidate at step {step} attempt {attempt} ({cid})"
        if not rows:
            raise RunTraceError(run_id, f"validations: no recorded decision on {where}, which the events say was "
                                        "decided: recorded decisions are missing")
        for blocking in brief.get("blocking", ()):
            row = rows.get(blocking["validator"])
            if row is None or (row[0], row[1]) != (blocking["verdict"], blocking["code"]):
                found = f"{row[0]} {row[1]}" if row is not None else "no row"
                raise RunTraceError(run_id, f"validations: the events say {blocking['validator']} decided "
                                            f"{blocking['verdict']} {blocking['code']} on {where}, the recorded "
                                            f"decisions hold {found}: recorded decisions are missing or changed")
        if "count" in brief and len(rows) != brief["count"]:
            # (Events written before the count was recorded say nothing of it.)
            raise RunTraceError(run_id, f"validations: the events say {brief['count']} validator(s) decided on "
                                        f"{where}, the recorded decisions hold {len(rows)}: recorded decisions are "
                                        "missing")
        worst = _worst((row[0], row[1]) for row in rows.values())[0]
        if "verdict" in brief and worst != brief["verdict"]:
            raise RunTraceError(run_id, f"validations: the events say {where} was decided {brief['verdict']}, the "
                                        f"recorded decisions make it {worst}: recorded decisions are changed")


def _body(bodies: Mapping[str, str], artifact_id: str, run_id: str, what: str) -> str:
    """An artifact's body, refused when the traces lack it or when it no
    longer hashes to its id (it was changed after it was recorded: the
    decisions it fed would be judged on something else)."""
    text = bodies.get(artifact_id)
    if text is None:
        raise RunTraceError(run_id, f"{what} artifact {artifact_id or '(none)'} is not in the traces")
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != artifact_id:
        raise RunTraceError(run_id, f"{what} artifact {artifact_id}: its body does not hash to its id "
                                    "(changed after it was recorded)")
    return text


def _reader(bodies: Mapping[str, str]) -> Any:
    """Reads an artifact's body by id from the partition's bodies (a context's
    tool registry snapshot), refusing one the traces lack or that was changed."""

    def read(artifact_id: str) -> Any:
        return _loads(_body(bodies, artifact_id, "", "referenced"))

    return read


#: The step table's columns (validators.STEP_COLUMNS).
_STEP_FIELDS = ("run_id", "step", "states", "calls", "errors", "new_evidence", "completed_operations", "candidates",
                "open")


def _step_columns(run_id: str, closed: Sequence[Mapping[str, Any]], last: int, calls: Sequence[str],
                  columns: dict[str, list[Any]]) -> None:
    """Append a run's rows of the step table: what its live loop validators
    saw. Each candidate was decided on the steps finished before it (the
    recorded ``step_closed`` payloads, checked by :func:`_check_step`) and
    its own proposed calls as the step being decided; the last candidate's
    (at step ``last``) is the open step that ends the table (``open``: only
    its calls, nothing ran yet, so the error and progress patterns do not
    read it). What the run did after its last decision no decision saw,
    and a finding there would be one no recording could hold."""
    from loopledger.validators import StepRecord

    rows = list(takewhile(lambda p: p["step"] < last, closed))
    rows.append(StepRecord(run_id, last, calls=tuple(calls), open=True).to_dict())
    for row in rows:
        for name in _STEP_FIELDS:
            columns[name].append(row.get(name, False) if name == "open" else row.get(name))


def _diagnose(steps: Mapping[str, list[Any]], suite: Any) -> list[Diagnosis]:
    import polars as pl

    from loopledger.validators import detect_batch
    from loopledger.validators._steps import step_schema

    detectors = suite.loop_detectors()
    if not steps["run_id"] or not detectors:
        return []
    schema = step_schema()
    frame = pl.DataFrame([_list_column(name, values) if isinstance(schema[name], pl.List)
                          else pl.Series(name, values, schema[name]) for name, values in steps.items()])
    frame = detect_batch(frame, detectors)
    return [Diagnosis(*row) for row in frame.iter_rows()]


def _list_column(name: str, values: Sequence[Sequence[str]]) -> Any:
    """A list-of-strings column from flat values and offsets: polars builds
    a list column from Python lists one Series per row, ten times slower."""
    import polars as pl
    import pyarrow as pa

    flat = [x for v in values for x in v]
    offsets = [0]
    total = 0
    for v in values:
        total += len(v)
        offsets.append(total)
    lists = pa.LargeListArray.from_arrays(pl.Series(offsets, dtype=pl.Int64).to_arrow(),
                                          pl.Series(flat, dtype=pl.Utf8).to_arrow())
    return pl.Series(name, pl.from_arrow(lists))


# --- comparison -------------------------------------------------------------------


def _worst(rows: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """(verdict, code) of the most severe decision; member order breaks ties."""
    worst = ("accept", "ok")
    for verdict, code in rows:
        if _SEVERITY.get(verdict, 0) > _SEVERITY.get(worst[0], 0):
            worst = (verdict, code)
    return worst


def _labels_for(run: Mapping[str, Any], data: _Partition,
                candidates: Mapping[tuple[int, int], str]) -> dict[tuple[str, str], Label]:
    pairs: list[tuple[int, Label]] = [(-1, lab) for lab in scenario_labels(run["run_id"], run.get("spec_json"),
                                                                           candidates)]
    for row in data.labels.get(run["run_id"], ()):
        candidate_id = row["candidate_id"] or candidates.get((int(row["step"]), int(row["attempt"])), "")
        pairs.append((int(row.get("label_order") or 0), Label(
            row["run_id"], int(row["step"]), int(row["attempt"]), candidate_id, row["validator"] or "",
            row["expected_verdict"], row["source"], row.get("note") or "")))
    return effective(pairs)


def _compare_run(run: Mapping[str, Any], evaluated: list[tuple[tuple[int, int, str], Any]], data: _Partition,
                 suite: Any, replay_id: str, error: str | None, decision_rows: list[tuple[Any, ...]],
                 diff_rows: list[tuple[Any, ...]], *, write: bool) -> RunReplay:
    run_id = run["run_id"]
    candidates = {(step, attempt): cid for (step, attempt, cid), _ in evaluated}
    labels = _labels_for(run, data, candidates)
    # candidate -> validator -> (verdict, code, validator_version, suite_version)
    baseline = data.baseline.get(run_id, {}) if data.baseline is not None else None
    by_candidate: dict[str, list[tuple[str, Label]]] = defaultdict(list)
    for (label_cid, validator), label in labels.items():
        by_candidate[label_cid].append((validator, label))
    diffs: list[Diff] = []
    n_decisions = agreeing = labelled = not_in_baseline = not_recorded = 0
    evidence_json = _evidence_json
    for (step, attempt, cid), result in evaluated:
        decisions = result.decisions
        n_decisions += len(decisions)
        if write:
            suite_version = result.suite_version
            decision_rows.extend(
                (replay_id, run_id, step, attempt, cid, d.validator, d.validator_version, suite_version,
                 _VALUE[d.verdict], d.code, d.message, evidence_json(d.evidence))
                for d in decisions)
        replayed = None
        # Labels are scored against the replay whether or not there is a baseline.
        for validator, label in by_candidate.get(cid, ()):
            if replayed is None:
                replayed = {d.validator: d for d in decisions}
            # A label on a validator the suite does not run is counted, and
            # not agreed with: the replay makes no such decision.
            got = (_worst((_VALUE[d.verdict], d.code) for d in decisions)[0] if validator == ""
                   else _VALUE[replayed[validator].verdict] if validator in replayed else None)
            labelled += 1
            agreeing += got == label.expected_verdict
        if baseline is None:
            continue
        recorded = baseline.get(cid, _NONE)
        if not recorded and not data.recorded_baseline:
            # An earlier replay that made no decision on this candidate (its
            # run was recorded since, was outside its traces, or could not be
            # replayed then) has nothing to compare with: not a flip.
            not_in_baseline += 1
            continue
        not_recorded += not recorded
        if len(recorded) == len(decisions) and all(
                (old := recorded.get(d.validator)) is not None and old[0] == _VALUE[d.verdict] and old[1] == d.code
                for d in decisions):
            continue  # every decision as recorded (the common case): no diff, no candidate flip
        if replayed is None:
            replayed = {d.validator: d for d in decisions}
        for name in list(replayed) + [v for v in recorded if v not in replayed]:
            new, old = replayed.get(name), recorded.get(name)
            new_vc = (_VALUE[new.verdict], new.code) if new is not None else (None, None)
            old_vc = (old[0], old[1]) if old is not None else (None, None)
            if new_vc == old_vc or _absent_accepts(new_vc, old_vc):
                continue
            diffs.append(_diff(run_id, step, attempt, cid, name, old_vc, new_vc, labels.get((cid, name)),
                               old[2] if old is not None else None,
                               new.validator_version if new is not None else None,
                               old[3] if old is not None else None))
        if recorded:
            old_worst = _worst((row[0], row[1]) for row in recorded.values())
            new_worst = _worst((_VALUE[d.verdict], d.code) for d in decisions)
            if old_worst[0] != new_worst[0]:
                diffs.append(_diff(run_id, step, attempt, cid, "", old_worst, new_worst, labels.get((cid, "")),
                                   None, None, next(iter(recorded.values()))[3]))
    divergence = None
    flips = [d for d in diffs if d.validator]
    if flips:
        first = min(flips, key=lambda d: (d.step, d.attempt))
        at = (first.step, first.attempt)
        divergence = Divergence(run_id, first.step, first.attempt, first.candidate_id,
                                tuple(dict.fromkeys(d.validator for d in flips if (d.step, d.attempt) == at)))
        diffs = [_after(d, at) for d in diffs]
    if write:
        diff_rows.extend(
            (replay_id, d.run_id, d.step, d.attempt, d.candidate_id, d.validator, d.baseline_verdict,
             d.replay_verdict, d.baseline_code, d.replay_code, d.kind, d.expected_verdict, d.label_source,
             d.baseline_validator_version, d.replay_validator_version, d.baseline_suite_version,
             d.across_versions, d.after_divergence)
            for d in diffs)
    # Every decision on a candidate came from one evaluation: its first row names the suite.
    suites = (tuple(sorted({next(iter(rows.values()))[3] or "" for rows in baseline.values() if rows}))
              if baseline and data.recorded_baseline else ())
    return RunReplay(run_id=run_id, task_id=run.get("task_id") or "", status=run.get("status") or "",
                     reason=run.get("reason"), candidates=data.recorded_candidates.get(run_id, 0),
                     candidates_rerun=len(evaluated), decisions=n_decisions,
                     diffs=tuple(diffs), divergence=divergence, labels=labelled, labels_agreeing=agreeing,
                     not_in_baseline=not_in_baseline, not_recorded=not_recorded, error=error,
                     baseline_suites=suites)


_NONE: Mapping[str, Any] = {}


def _evidence_json(evidence: Mapping[str, Any]) -> str:
    # Most decisions accept with no evidence: "{}" without the writer.
    return canonical_json(evidence) if evidence else "{}"


def _absent_accepts(new: tuple[str | None, str | None], old: tuple[str | None, str | None]) -> bool:
    """A validator on one side only that accepts changes nothing: a member
    added or removed is a flip only where it would have objected."""
    return (new[0] is None and old[0] == "accept") or (old[0] is None and new[0] == "accept")


def _diff(run_id: str, step: int, attempt: int, cid: str, validator: str, old: tuple[Any, Any],
          new: tuple[Any, Any], label: Label | None, old_version: str | None, new_version: str | None,
          suite_version: str | None) -> Diff:
    return Diff(run_id=run_id, step=step, attempt=attempt, candidate_id=cid, validator=validator,
                baseline_verdict=old[0], replay_verdict=new[0], baseline_code=old[1], replay_code=new[1],
                kind=classify(label.expected_verdict if label else None, old[0], new[0]),
                expected_verdict=label.expected_verdict if label else None,
                label_source=label.source if label else None,
                baseline_validator_version=old_version, replay_validator_version=new_version,
                baseline_suite_version=suite_version)


def _after(d: Diff, at: tuple[int, int]) -> Diff:
    from dataclasses import replace

    return replace(d, after_divergence=(d.step, d.attempt) > at) if (d.step, d.attempt) > at else d


# --- output -------------------------------------------------------------------------

#: The replay's decisions are also its ``validations`` table: the CONTRACT
#: keeps what a replay computes under ``replays/<id>/<table>/``, named as the
#: trace tables are. The same files, hard-linked (copied where the file
#: system has no hard links), so nothing is written twice.
VALIDATIONS = "validations"


def _also(path: Path, alias: Path) -> None:
    import os
    import shutil

    alias.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(path, alias)
    except OSError:
        shutil.copyfile(path, alias)


def _write(path: Path, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    """One part file (written even when empty, so the schema is always there)."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [pa.field(c, pa.int64() if c in _INT_COLUMNS else pa.bool_() if c in _BOOL_COLUMNS else pa.string())
              for c in columns]
    kinds = {c: pl.Int64 if c in _INT_COLUMNS else pl.Boolean if c in _BOOL_COLUMNS else pl.Utf8 for c in columns}
    # Columns built by polars (pyarrow's conversion of Python lists imports
    # pandas), then cast to the tables' Arrow schema.
    frame = pl.DataFrame([pl.Series(c, [r[i] for r in rows], kinds[c]) for i, c in enumerate(columns)])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(frame.to_arrow().cast(pa.schema(fields)), path, compression="zstd")
