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

import importlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopledger.canonical import canonical_json

from ._errors import RunTraceError
from ._labels import Label, classify, effective, scenario_labels
from ._result import Diagnosis, Diff, Divergence, RunReplay
from ._traces import read_partition

_SEVERITY = {"accept": 0, "repair": 1, "ask": 2, "reject": 3}


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


DECISION_COLUMNS = ("replay_id", "run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                    "suite_version", "verdict", "code", "message", "evidence_json")
DIFF_COLUMNS = ("replay_id", "run_id", "step", "attempt", "candidate_id", "validator", "baseline_verdict",
                "replay_verdict", "baseline_code", "replay_code", "kind", "expected_verdict", "label_source",
                "baseline_validator_version", "replay_validator_version", "baseline_suite_version",
                "across_versions", "after_divergence")
DIAGNOSIS_COLUMNS = ("replay_id", "run_id", "step", "detector", "detector_version", "pattern", "evidence_json")
_INT_COLUMNS = frozenset({"step", "attempt"})
_BOOL_COLUMNS = frozenset({"across_versions", "after_divergence"})


def _rows_by_run(table: Any) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if table is None:
        return grouped
    # Column by column: several times faster than Table.to_pylist().
    names = table.column_names
    columns = [table.column(n).to_pylist() for n in names]
    for values in zip(*columns):
        row = dict(zip(names, values))
        grouped[row["run_id"]].append(row)
    return grouped


#: Event kinds whose payload the run view does not read (see RunView.apply):
#: their JSON is not parsed.
_UNREAD_PAYLOADS = frozenset({"decisions", "run_created", "late_event"})


class _Partition:
    """A partition's rows, grouped by run."""

    def __init__(self, work: Path, part: int, has_baseline: bool) -> None:
        runs = read_partition(work, "runs", part)
        self.runs = runs.to_pylist() if runs is not None else []
        self.runs.sort(key=lambda r: r["run_id"])
        self.events = _rows_by_run(read_partition(work, "events", part))
        self.candidates = _rows_by_run(read_partition(work, "candidates", part))
        self.baseline = _rows_by_run(read_partition(work, "baseline", part)) if has_baseline else None
        self.labels = _rows_by_run(read_partition(work, "labels", part))
        bodies = read_partition(work, "bodies", part)
        self.bodies: dict[str, str] = (
            dict(zip(bodies.column("artifact_id").to_pylist(), bodies.column("body").to_pylist()))
            if bodies is not None else {}
        )


def run_job(job: Job) -> list[list[RunReplay]]:
    """Replay one partition; return, per suite, the partition's run results."""
    from loopledger.validators import StepRecord

    suites = [ref.load() for ref in job.suites]
    data = _Partition(job.work, job.part, job.has_baseline)
    decisions: list[list[tuple[Any, ...]]] = [[] for _ in suites]
    diffs: list[list[tuple[Any, ...]]] = [[] for _ in suites]
    results: list[list[RunReplay]] = [[] for _ in suites]
    steps: list[StepRecord] = []
    for run in data.runs:
        run_id = run["run_id"]
        events = sorted(data.events.get(run_id, ()), key=lambda e: e["seq"])
        steps.extend(_step_records(events))
        try:
            evaluated = _evaluate_run(run, events, data.bodies, suites)
            error = None
        except RunTraceError as exc:
            evaluated, error = [], exc.reason
        for i, suite in enumerate(suites):
            rid = job.replay_ids[i]
            mine = [(c, res[i]) for c, res in evaluated]
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
            _write(out / "decisions" / f"part-{job.part:05d}.parquet", DECISION_COLUMNS, decisions[i])
            _write(out / "diffs" / f"part-{job.part:05d}.parquet", DIFF_COLUMNS, diffs[i])
            _write(out / "loop_diagnoses" / f"part-{job.part:05d}.parquet", DIAGNOSIS_COLUMNS,
                   [(rid, d.run_id, d.step, d.detector, d.detector_version, d.pattern, d.evidence_json)
                    for d in found])
    return results


def _with_diagnoses(result: RunReplay, found: Iterable[Diagnosis]) -> RunReplay:
    from dataclasses import replace

    return replace(result, diagnoses=tuple(found))


# --- evaluation -------------------------------------------------------------------


def _evaluate_run(run: Mapping[str, Any], events: Sequence[Mapping[str, Any]], bodies: Mapping[str, str],
                  suites: Sequence[Any]) -> list[tuple[tuple[int, int, str], list[Any]]]:
    """Every validated candidate of the run: ((step, attempt, candidate_id), [SuiteResult per suite])."""
    from loopledger.engine import decision_input, validated_candidates

    folded = ({"kind": e["kind"], "to_state": e["to_state"], "step": e["step"], "attempt": e["attempt"],
               "payload": json.loads(e["payload_json"]) if e["payload_json"] and e["kind"] not in _UNREAD_PAYLOADS
               else {}} for e in events)
    contexts: dict[str, Any] = {}
    out = []
    for view, candidate_id, context_id in validated_candidates(run, folded):
        candidate_text = bodies.get(candidate_id)
        if candidate_text is None:
            raise RunTraceError(run["run_id"], f"candidate artifact {candidate_id} is not in the traces")
        context = contexts.get(context_id)
        if context is None:
            context_text = bodies.get(context_id)
            if context_text is None:
                raise RunTraceError(run["run_id"], f"context artifact {context_id or '(none)'} is not in the traces")
            # Attempts of one step share their context: parse it once.
            context = contexts[context_id] = json.loads(context_text)
        inp = decision_input(view, json.loads(candidate_text), context, candidate_id, artifact=_reader(bodies))
        out.append(((view.step, view.attempt, candidate_id), [s.evaluate(inp) for s in suites]))
    return out


def _reader(bodies: Mapping[str, str]) -> Any:
    """Reads an artifact's body by id from the partition's bodies (a context's
    tool registry snapshot), refusing one the traces do not have."""

    def read(artifact_id: str) -> Any:
        text = bodies.get(artifact_id)
        if text is None:
            raise RunTraceError("", f"artifact {artifact_id} is not in the traces")
        return json.loads(text)

    return read


def _step_records(events: Sequence[Mapping[str, Any]]) -> list[Any]:
    from loopledger.validators import StepRecord

    records = []
    for e in events:
        if e["kind"] == "step_closed":
            p = json.loads(e["payload_json"])
            records.append(StepRecord(run_id=p["run_id"], step=int(p["step"]), states=tuple(p["states"]),
                                      calls=tuple(p["calls"]), errors=tuple(p["errors"]),
                                      new_evidence=int(p["new_evidence"]),
                                      completed_operations=int(p["completed_operations"]),
                                      candidates=p.get("candidates")))
    return records


def _diagnose(steps: list[Any], suite: Any) -> list[Diagnosis]:
    from loopledger.validators import detect_batch, steps_frame

    detectors = suite.loop_detectors()
    if not steps or not detectors:
        return []
    frame = detect_batch(steps_frame(steps), detectors)
    return [Diagnosis(*row) for row in frame.iter_rows()]


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
    baseline: dict[str, dict[str, Mapping[str, Any]]] | None = None
    if data.baseline is not None:
        baseline = defaultdict(dict)
        for row in data.baseline.get(run_id, ()):
            baseline[row["candidate_id"]][row["validator"]] = row
    by_candidate: dict[str, list[tuple[str, Label]]] = defaultdict(list)
    for (label_cid, validator), label in labels.items():
        by_candidate[label_cid].append((validator, label))
    diffs: list[Diff] = []
    n_decisions = agreeing = labelled = 0
    for (step, attempt, cid), result in evaluated:
        replayed = {d.validator: d for d in result.decisions}
        n_decisions += len(replayed)
        if write:
            decision_rows.extend(
                (replay_id, run_id, step, attempt, cid, d.validator, d.validator_version, result.suite_version,
                 d.verdict.value, d.code, d.message, canonical_json(d.evidence))
                for d in result.decisions)
        # Labels are scored against the replay whether or not there is a baseline.
        for validator, label in by_candidate.get(cid, ()):
            got = (_worst((d.verdict.value, d.code) for d in result.decisions)[0] if validator == ""
                   else replayed[validator].verdict.value if validator in replayed else None)
            if got is not None:
                labelled += 1
                agreeing += got == label.expected_verdict
        if baseline is None:
            continue
        recorded = baseline.get(cid, {})
        for name in list(replayed) + [v for v in recorded if v not in replayed]:
            new, old = replayed.get(name), recorded.get(name)
            new_vc = (new.verdict.value, new.code) if new is not None else (None, None)
            old_vc = (old["verdict"], old["code"]) if old is not None else (None, None)
            if new_vc == old_vc or _absent_accepts(new_vc, old_vc):
                continue
            diffs.append(_diff(run_id, step, attempt, cid, name, old_vc, new_vc, labels.get((cid, name)),
                               old["validator_version"] if old is not None else None,
                               new.validator_version if new is not None else None,
                               old["suite_version"] if old is not None else None))
        if recorded:
            old_worst = _worst((row["verdict"], row["code"]) for row in recorded.values())
            new_worst = _worst((d.verdict.value, d.code) for d in result.decisions)
            if old_worst[0] != new_worst[0]:
                diffs.append(_diff(run_id, step, attempt, cid, "", old_worst, new_worst, labels.get((cid, "")),
                                   None, None, next(iter(recorded.values()))["suite_version"]))
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
    return RunReplay(run_id=run_id, task_id=run.get("task_id") or "", status=run.get("status") or "",
                     reason=run.get("reason"), candidates=len(evaluated), decisions=n_decisions,
                     diffs=tuple(diffs), divergence=divergence, labels=labelled, labels_agreeing=agreeing,
                     error=error)


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


def _write(path: Path, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    """One part file (written even when empty, so the schema is always there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [pa.field(c, pa.int64() if c in _INT_COLUMNS else pa.bool_() if c in _BOOL_COLUMNS else pa.string())
              for c in columns]
    schema = pa.schema(fields)
    arrays = [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(fields)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path, compression="zstd")
