"""The replay's own correctness (the recording suite gives back the recorded
decisions), changed suites give exactly the expected flips, labels turn
diffs into regressions and fixes, and the replay tables hold what the
result says."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loopledger.replay import ReplayResult, replay, replay_many


def scan(folder: Path, query: str = "SELECT * FROM t") -> list[tuple]:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{folder}/**/*.parquet', union_by_name = true)")
    return con.execute(query).fetchall()


def task(run_id: str) -> str:
    return run_id.rsplit(".", 2)[0]


@pytest.fixture(scope="module")
def default_replay(recorded_home: Path, tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    return replay(recorded_home / "traces", "default", write_to=tmp_path_factory.mktemp("replays"))


def test_the_recording_suite_gives_zero_flips(default_replay: ReplayResult, recorded_home: Path) -> None:
    s = default_replay.summary
    traces = recorded_home / "traces"
    validated = scan(traces / "events", "SELECT count(*) FROM t WHERE kind = 'transition' AND to_state = 'VALIDATING'")
    recorded = scan(traces / "validations", "SELECT count(*) FROM t")
    runs = scan(traces / "runs", "SELECT count(*) FROM t")
    candidates = scan(traces / "candidates", "SELECT count(*) FROM t")
    assert (s.candidates, s.candidates_rerun, s.decisions, s.runs) == (
        candidates[0][0], validated[0][0], recorded[0][0], runs[0][0])
    # Truncated, cut and failed streams are recorded but never validated.
    assert s.candidates > s.candidates_rerun > 50
    assert (s.flips, s.candidate_flips, s.runs_diverged, s.run_errors) == (0, 0, 0, 0)
    assert default_replay.diffs == () and default_replay.diverged == ()
    assert default_replay.ok("flips")


def test_replayed_decisions_equal_the_recorded_rows(default_replay: ReplayResult, recorded_home: Path) -> None:
    cols = "run_id, step, attempt, candidate_id, validator, validator_version, suite_version, verdict, code"
    recorded = scan(recorded_home / "traces" / "validations", f"SELECT {cols} FROM t ORDER BY ALL")
    assert default_replay.path is not None
    replayed = scan(default_replay.path / "decisions", f"SELECT {cols} FROM t ORDER BY ALL")
    assert replayed == recorded


def test_the_recording_suite_finds_the_recorded_loop_diagnoses(default_replay: ReplayResult,
                                                               recorded_home: Path) -> None:
    # The batch detectors read what the live loop validators read: the
    # finished steps before each candidate and the last candidate's own
    # calls. A stop at a candidate (its proposed calls never ran) is found
    # at the same step, by the same detector, as the engine recorded it.
    cols = "run_id, step, detector, detector_version, pattern, evidence_json"
    recorded = scan(recorded_home / "traces" / "loop_diagnoses", f"SELECT {cols} FROM t ORDER BY ALL")
    assert default_replay.path is not None
    replayed = scan(default_replay.path / "loop_diagnoses", f"SELECT {cols} FROM t ORDER BY ALL")
    assert {task(r[0]) for r in recorded} >= {"loop-repeated-call", "loop-oscillation", "loop-no-progress",
                                               "loop-repeated-error"}
    assert replayed == recorded
    by_run = {run_id: {(d.step, d.detector) for d in r.diagnoses} for run_id, r in default_replay.runs.items()}
    assert {(run_id, step, detector) for run_id, found in by_run.items() for step, detector in found} == {
        (r[0], r[1], r[2]) for r in recorded}


def test_parallel_workers_give_the_same_result(default_replay: ReplayResult, recorded_home: Path) -> None:
    parallel = replay(recorded_home / "traces", "default", workers=2)
    assert dataclasses.replace(parallel.summary, replay_id="", seconds=0) == dataclasses.replace(
        default_replay.summary, replay_id="", seconds=0)
    assert dict(parallel.runs) == dict(default_replay.runs)


def test_a_lower_repeated_call_threshold_gives_exactly_the_expected_flips(recorded_home: Path, suite_file) -> None:
    # Recorded with threshold 3: loop-repeated-call calls the same tool with
    # the same arguments at steps 1, 2, 3 and was stopped at step 3. With 2,
    # the candidate of step 2 is the one that is refused, and nothing else moves.
    result = replay(recorded_home / "traces", suite_file(**{"loop.repeated_call": {"threshold": 2}}))
    flips = [(task(d.run_id), d.step, d.attempt, d.validator, d.baseline_verdict, d.replay_verdict, d.replay_code)
             for d in result.diffs if not d.candidate_level]
    assert flips == [("loop-repeated-call", 2, 1, "loop.repeated_call", "accept", "reject", "loop_detected")]
    (run,) = result.diverged
    assert run.divergence is not None and (run.divergence.step, run.divergence.validators) == (2, ("loop.repeated_call",))
    assert "no longer what suite changed would have produced" in run.divergence.describe("changed")
    # The overall verdict of that candidate flipped too, and the recorded
    # failure of the run is data, not the replay's verdict.
    assert [(d.step, d.replay_verdict) for d in run.diffs if d.candidate_level] == [(2, "reject")]
    assert run.run_failed and run.reason == "loop_detected"
    # The batch detector finds the same stop: the calls of step 2's
    # candidate repeat step 1's.
    assert [(d.step, d.detector, d.pattern) for d in run.diagnoses] == [(2, "loop.repeated_call", "repeated_call")]
    assert result.summary.flips == 1 and result.summary.runs_diverged == 1


def test_diffs_past_the_divergence_point_are_marked(recorded_home: Path) -> None:
    result = replay(recorded_home / "traces", "strict")
    run = next(r for r in result.diverged if task(r.run_id) == "loop-no-progress")
    assert run.divergence is not None
    at = (run.divergence.step, run.divergence.attempt)
    assert run.diffs and all(d.after_divergence == ((d.step, d.attempt) > at) for d in run.diffs)
    assert any(d.after_divergence for d in run.diffs)
    # So do the reports, on each such diff.
    from xml.etree import ElementTree as ET

    from loopledger.replay._report import junit

    (case,) = [c for c in ET.fromstring(junit(result, "flips")).iter("testcase") if c.get("name") == run.run_id]
    (failure,) = case.iter("failure")
    (others,) = case.iter("system-out")  # the candidate-level diffs, which --fail-on flips does not count
    lines = failure.text.splitlines() + others.text.splitlines()[1:]
    assert len(lines) == len(run.diffs)
    assert sum("past the divergence point" in line for line in lines) == sum(d.after_divergence for d in run.diffs)


def test_a_scenario_label_makes_a_missed_loop_a_regression(recorded_home: Path, suite_file) -> None:
    # loop-repeated-call.yaml expects loop.repeated_call to reject step 3.
    result = replay(recorded_home / "traces", suite_file(**{"loop.repeated_call": {"threshold": 4}}))
    regressions = [(task(d.run_id), d.step, d.validator, d.label_source) for d in result.diffs
                   if d.kind == "regression"]
    assert ("loop-repeated-call", 3, "loop.repeated_call", "scenario") in regressions
    assert not result.ok("regressions") and result.summary.regressions == len(regressions)
    assert result.summary.labels_agreeing < result.summary.labels


@pytest.mark.parametrize(("label", "baseline", "replay", "kind"), [
    ("reject", "reject", "accept", "regression"),
    ("accept", "reject", "accept", "fix"),
    ("ask", "reject", "accept", "change"),  # agrees with neither
    (None, "reject", "accept", "change"),
    ("reject", "reject", "reject", "change"),  # a code-only difference
    # A side without a decision (a validator one suite does not run) did not object.
    ("accept", None, "reject", "regression"),
    ("reject", None, "reject", "fix"),
    ("reject", "reject", None, "regression"),
    ("accept", "reject", None, "fix"),
])
def test_a_label_classifies_a_diff(label, baseline, replay, kind) -> None:
    from loopledger.replay._labels import classify

    assert classify(label, baseline, replay) == kind


def test_human_labels_make_regressions_and_fixes(home_copy: Path, suite_file) -> None:
    from replay_kit import cli

    run_id = scan(home_copy / "traces" / "runs", "SELECT run_id FROM t WHERE task_id = 'loop-repeated-call'")[0][0]
    added = cli("label", run_id, "--step", "2", "--validator", "loop.repeated_call", "--expect", "reject",
                "--note", "two identical calls are already a loop", "--home", str(home_copy))
    assert added.returncode == 0, added.stderr
    added = cli("label", run_id, "--step", "2", "--expect", "accept", "--home", str(home_copy))
    assert added.returncode == 0, added.stderr
    labels = scan(home_copy / "traces" / "labels",
                  "SELECT validator, expected_verdict, source FROM t WHERE source = 'human' ORDER BY 1")
    assert labels == [("", "accept", "human"), ("loop.repeated_call", "reject", "human")]
    result = replay(home_copy / "traces", suite_file(**{"loop.repeated_call": {"threshold": 2}}))
    kinds = {(d.validator, d.kind, d.label_source) for d in result.diffs}
    # The validator's label agrees with the replay: a fix. The label on the
    # candidate as a whole agrees with the recorded accept: a regression.
    assert kinds == {("loop.repeated_call", "fix", "human"), ("", "regression", "human")}
    assert (result.summary.fixes, result.summary.regressions) == (1, 1)

    # The reports list both; a failing JUnit case shows the run's other diffs too.
    from xml.etree import ElementTree as ET

    from loopledger.replay._report import junit, markdown

    report = markdown(result, "regressions")
    assert "## Regressions (1)" in report and "## Fixes (1)" in report
    # One validator flip and one candidate flip: the kinds count both diffs, and say so.
    assert (result.summary.flips, result.summary.candidate_flips) == (1, 1)
    assert "| of these 2 diffs: regressions | 1 |" in report and "| of these 2 diffs: fixes | 1 |" in report
    (case,) = [c for c in ET.fromstring(junit(result, "regressions")).iter("testcase") if c.get("name") == run_id]
    (failure,) = case.iter("failure")
    assert "(candidate): accept/ok -> " in failure.text and "regression, label accept from human" in failure.text
    assert "loop.repeated_call" not in failure.text
    (out,) = case.iter("system-out")
    assert out.text.startswith("other diffs:") and "loop.repeated_call" in out.text and "(fix, label reject" in out.text


def test_the_markdown_report_says_how_many_rows_it_left_out(default_replay: ReplayResult) -> None:
    import dataclasses
    from types import MappingProxyType

    from loopledger.replay import Diff, Divergence, RunReplay
    from loopledger.replay._report import markdown

    def run(i: int) -> RunReplay:
        diff = Diff(f"run-{i:03d}", 1, 1, f"c{i}", "structure", "accept", "reject", "ok", "truncated", "regression",
                    expected_verdict="accept", label_source="human")
        return RunReplay(f"run-{i:03d}", "task", "SUCCEEDED", "completed", candidates=1, candidates_rerun=1,
                         decisions=1, diffs=(diff,), divergence=Divergence(diff.run_id, 1, 1, diff.candidate_id,
                                                                          ("structure",)))

    runs = {r.run_id: r for r in map(run, range(130))}
    result = dataclasses.replace(default_replay, runs=MappingProxyType(runs))
    report = markdown(result, "regressions")
    assert "## Regressions (130)" in report and "## Runs diverged (130)" in report
    assert report.count(f"… and 30 more ({result.path / 'diffs'}).") == 2
    assert "run-099" in report and "run-100" not in report
    small = dataclasses.replace(default_replay, runs=MappingProxyType(dict(list(runs.items())[:100])))
    assert "more (replays/" not in markdown(small, "regressions")


def test_an_earlier_replay_is_a_baseline(home_copy: Path) -> None:
    replays = home_copy / "replays"
    strict = replay(home_copy / "traces", "strict", write_to=replays)
    again = replay(home_copy / "traces", "strict", baseline=strict.replay_id, write_to=replays)
    assert again.summary.flips == 0 and again.summary.baseline == strict.replay_id
    back = replay(home_copy / "traces", "default", baseline=strict.replay_id, write_to=replays)
    flipped = sorted((d.run_id, d.step, d.validator, d.replay_verdict, d.baseline_verdict) for d in back.diffs)
    expected = sorted((d.run_id, d.step, d.validator, d.baseline_verdict, d.replay_verdict) for d in strict.diffs)
    assert flipped == expected and back.summary.flips == strict.summary.flips > 0


def test_a_comparison_across_validator_versions_is_shown_as_such(home_copy: Path) -> None:
    replays = home_copy / "replays"
    first = replay(home_copy / "traces", "default", write_to=replays)
    assert first.path is not None
    # Pretend the earlier replay ran completion_gate version 0, which
    # decided differently on one candidate.
    decisions = first.path / "decisions"
    table = pa.concat_tables([pq.read_table(p) for p in sorted(decisions.glob("*.parquet"))])
    rows = table.to_pylist()
    target = next(r for r in rows if r["validator"] == "completion_gate" and r["verdict"] == "accept")
    for r in rows:
        if r["validator"] == "completion_gate":
            r["validator_version"] = "0"
    target["verdict"], target["code"] = "reject", "missing_evidence"
    for p in decisions.glob("*.parquet"):
        p.unlink()
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), decisions / "part-00000.parquet")
    result = replay(home_copy / "traces", "default", baseline=first.replay_id)
    flips = [d for d in result.diffs if not d.candidate_level]
    assert len(flips) == 1 and flips[0].across_versions
    assert (flips[0].baseline_validator_version, flips[0].replay_validator_version) == ("0", "3")
    assert result.summary.flips_across_versions == 1
    # The Markdown report shows the flip as one across versions, in its own
    # cell; the JUnit report in the failure's message and text.
    from xml.etree import ElementTree as ET

    from loopledger.replay._report import junit, markdown

    (row,) = [line for line in markdown(result, "flips").splitlines() if line.startswith("| `completion_gate`")]
    assert row.startswith("| `completion_gate` (versions 0→3) | ")
    (failure,) = ET.fromstring(junit(result, "flips")).iter("failure")
    assert "1 of these flip(s) compare different versions of a validator" in failure.get("message")
    assert f"suite default ({result.summary.suite_version}) would have produced" in failure.get("message")
    assert "completion_gate (versions 0→3): reject/missing_evidence -> accept/ok" in failure.text


def test_the_replay_tables(default_replay: ReplayResult) -> None:
    path = default_replay.path
    assert path is not None and path.name == default_replay.replay_id
    assert not path.with_name(path.name + ".partial").exists()
    summary = pq.read_table(path / "summary").to_pylist()
    assert len(summary) == 1
    contract = {"replay_id", "suite_version", "baseline", "candidates", "decisions", "flips", "regressions",
                "runs_diverged", "seconds"}
    assert contract <= set(summary[0]) and summary[0]["decisions"] == default_replay.summary.decisions
    diff_cols = {"run_id", "step", "attempt", "candidate_id", "validator", "baseline_verdict", "replay_verdict",
                 "baseline_code", "replay_code", "kind"}
    assert diff_cols <= set(pq.read_table(path / "diffs").column_names)
    diag_cols = {"run_id", "step", "detector", "detector_version", "pattern", "evidence_json"}
    diagnoses = pq.read_table(path / "loop_diagnoses")
    assert diag_cols <= set(diagnoses.column_names)
    assert diagnoses.num_rows == default_replay.summary.diagnoses
    for row in diagnoses.to_pylist():
        assert json.loads(row["evidence_json"])
    meta = json.loads((path / "replay.json").read_text())
    assert meta["suite_version"] == default_replay.summary.suite_version
    # The decisions are also the replay's `validations` table (the trace
    # table's name, with its columns), the same files under both names.
    validation_cols = {"run_id", "step", "attempt", "candidate_id", "validator", "validator_version",
                       "suite_version", "verdict", "code", "message", "evidence_json"}
    validations = pq.read_table(path / "validations")
    assert validation_cols <= set(validations.column_names)
    assert validations.num_rows == default_replay.summary.decisions > 0
    assert validations.equals(pq.read_table(path / "decisions"))
    assert sorted(p.name for p in (path / "validations").iterdir()) == sorted(
        p.name for p in (path / "decisions").iterdir())


def test_results_are_frozen_and_keyed_by_run(default_replay: ReplayResult) -> None:
    run_id, run = next(iter(default_replay.runs.items()))
    assert run.run_id == run_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "SUCCEEDED"  # type: ignore[misc]
    with pytest.raises(TypeError):
        default_replay.runs["x"] = run  # type: ignore[index]


def test_replay_many_reads_once_and_judges_with_each_suite(recorded_home: Path) -> None:
    results = replay_many(recorded_home / "traces", ["default", "strict"])
    assert set(results) == {"default", "strict"}
    assert results["default"].summary.flips == 0
    assert results["strict"].summary.flips == replay(recorded_home / "traces", "strict").summary.flips > 0


def test_a_replay_names_its_traces_by_their_absolute_path(home_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Read later from anywhere (a baseline's refusal names the traces it replayed).
    monkeypatch.chdir(home_copy)
    result = replay("traces", "default", write_to="replays")
    assert result.path is not None
    meta = json.loads((result.path / "replay.json").read_text())
    assert meta["traces"] == str(home_copy / "traces") and Path(meta["traces"]).is_absolute()


def test_an_interruption_right_after_the_claim_leaves_no_partial_replay(
        recorded_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C the moment the ``<id>.partial`` folder is made (a loaded
    machine may stop the process for a while there) still leaves nothing
    unfinished behind."""
    import loopledger.replay._harness as harness

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "remember", interrupted)
    out = tmp_path / "replays"
    with pytest.raises(KeyboardInterrupt):
        replay(recorded_home / "traces", "default", write_to=out, workers=1)
    assert list(out.iterdir()) == []
