"""The pages' data functions against answers computed independently over
the raw Parquet files, and their behaviour on empty, partial and corrupt
data directories."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loopledger.ui import _compare as c
from loopledger.ui import _queries as q
from loopledger.ui._data import TERMINAL_STATES, CorruptData, NoData, Traces, fingerprint
from loopledger.ui._stats import wilson
from ui_kit import SYNTHETIC_REPLAY, scalar, table


@pytest.fixture
def traces(recorded_home: Path) -> Traces:
    return Traces(recorded_home)


def test_overview_counts_match_the_runs_table(traces: Traces, recorded_home: Path) -> None:
    runs = table(recorded_home, "runs")
    got = q.overview(traces)["totals"]
    assert got["runs"] == scalar(f"SELECT count(*) FROM {runs}") > 0
    assert got["finished"] == scalar(f"SELECT count(*) FROM {runs} WHERE status IN {TERMINAL_STATES}")
    assert got["succeeded"] == scalar(f"SELECT count(*) FROM {runs} WHERE status = 'SUCCEEDED'")
    assert got["budget_stopped"] == scalar(f"SELECT count(*) FROM {runs} WHERE status = 'BUDGET_EXHAUSTED'")
    looped = scalar(f"""SELECT count(*) FROM {runs} WHERE reason IN ('loop_detected', 'no_progress')
                        OR run_id IN (SELECT run_id FROM {table(recorded_home, 'loop_diagnoses')})""")
    assert got["looped"] == looped > 0
    assert got["tokens_in"] == scalar(f"SELECT sum(tokens_in) FROM {runs}")
    breakdown = q.overview(traces)["breakdowns"]["prompt_version"]
    assert dict(zip(breakdown["value"], breakdown["runs"], strict=True)) == dict(
        __import__("duckdb").sql(f"SELECT prompt_version, count(*) FROM {runs} GROUP BY 1").fetchall())


def test_queued_waiting_and_processing_time_follow_the_transitions(traces: Traces, recorded_home: Path) -> None:
    events = pq.read_table(recorded_home / "traces" / "events",
                           columns=["run_id", "seq", "ts", "from_state", "to_state"])
    versions = dict(__import__("duckdb").sql(
        f"SELECT run_id, prompt_version FROM {table(recorded_home, 'runs')}").fetchall())
    by_run: dict[str, list[tuple[int, object, str, str | None]]] = defaultdict(list)
    for row in events.to_pylist():
        if row["to_state"] is not None:
            by_run[row["run_id"]].append((row["seq"], row["ts"], row["to_state"], row["from_state"]))
    expected: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for run_id, moves in by_run.items():
        moves.sort()
        for (_, start, state, came_from), (_, end, _, _) in zip(moves, moves[1:], strict=False):
            # processing, waiting, or queued: the span that starts at the run's creation
            bucket = 2 if came_from is None else 1 if state in ("WAITING_USER", "WAITING_TOOL") else 0
            expected[versions[run_id]][bucket] += (end - start).total_seconds()
    got = q.time_split(traces).set_index("prompt_version")
    for version, (processing, waiting, queued) in expected.items():
        assert got.at[version, "processing_s"] == pytest.approx(processing, rel=1e-6)
        assert got.at[version, "waiting_s"] == pytest.approx(waiting, rel=1e-6, abs=1e-9)
        assert got.at[version, "queued_s"] == pytest.approx(queued, rel=1e-6, abs=1e-9)
    assert sum(w for _, w, _ in expected.values()) > 0, "the bundled scenarios include waits"
    assert sum(qd for _, _, qd in expected.values()) > 0, "runs of a batch wait their turn"


def test_runs_filter_sort_and_pages(traces: Traces, recorded_home: Path) -> None:
    runs = table(recorded_home, "runs")
    flt = q.RunFilter(statuses=("FAILED",), prompt_versions=("v1",))
    total = q.runs_count(traces, flt)
    assert total == scalar(f"SELECT count(*) FROM {runs} WHERE status = 'FAILED' AND prompt_version = 'v1'") > 3
    first_total, first = q.runs_page(traces, flt, "steps", True, 0, 3)
    _, second = q.runs_page(traces, flt, "steps", True, 3, 3)
    assert first_total == total and len(first) == 3
    assert set(first["status"]) == {"FAILED"} and set(first["prompt_version"]) == {"v1"}
    assert list(first["steps"]) == sorted(first["steps"], reverse=True)
    assert first["steps"].min() >= second["steps"].max()
    assert not set(first["run_id"]) & set(second["run_id"])
    looping = q.RunFilter(detectors=("loop.oscillation",))
    _, page = q.runs_page(traces, looping)
    assert len(page) > 0 and all("loop.oscillation" in d for d in page["detectors"])
    assert q.runs_count(traces, q.RunFilter(task="no-such-task")) == 0
    with pytest.raises(ValueError):
        q.runs_page(traces, flt, sort="run_id; DROP TABLE runs")


def test_run_detail_holds_the_runs_records(traces: Traces, recorded_home: Path) -> None:
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'loop_diagnoses')} ORDER BY run_id LIMIT 1")
    detail = q.run_detail(traces, run_id)
    assert detail is not None
    assert len(detail["events"]) == scalar(f"SELECT count(*) FROM {table(recorded_home, 'events')} "
                                           f"WHERE run_id = '{run_id}'")
    assert list(detail["events"]["seq"]) == list(range(1, len(detail["events"]) + 1))
    assert len(detail["validations"]) == scalar(f"SELECT count(*) FROM {table(recorded_home, 'validations')} "
                                                f"WHERE run_id = '{run_id}'")
    assert len(detail["diagnoses"]) >= 1
    spans = detail["spans"]
    assert spans["state"].iloc[-1] == detail["run"]["status"]
    assert (spans["seconds"] >= 0).all()
    body = q.artifact_body(traces, detail["candidates"]["context_artifact_id"].iloc[0])
    assert body is not None and "messages" in json.loads(body) or body
    assert q.run_detail(traces, "no-such-run") is None


def test_diagnoses_summary_counts_failed_runs(traces: Traces, recorded_home: Path) -> None:
    summary = q.diagnoses_summary(traces)
    diag = table(recorded_home, "loop_diagnoses")
    assert summary["findings"].sum() == scalar(f"SELECT count(*) FROM {diag}")
    totals = q.diagnoses_totals(traces)
    assert totals["runs_failed"] == scalar(
        f"SELECT count(DISTINCT d.run_id) FROM {diag} d JOIN {table(recorded_home, 'runs')} r USING (run_id) "
        "WHERE r.status NOT IN ('SUCCEEDED')")
    total, page = q.diagnosis_findings(traces, "loop.repeated_call", None, 0, 10)
    assert total == scalar(f"SELECT count(*) FROM {diag} WHERE detector = 'loop.repeated_call'") == len(page)


def test_diagnoses_of_a_replay_are_its_own(traces: Traces, recorded_home: Path) -> None:
    sources = q.diagnosis_sources(traces)
    # The hand-written replay wrote no loop_diagnoses table: nothing to show.
    assert sources[0] == "recorded" and SYNTHETIC_REPLAY not in sources
    (strict,) = sources[1:]
    found = f"read_parquet('{recorded_home}/replays/{strict}/loop_diagnoses/**/*.parquet')"
    recorded = table(recorded_home, "loop_diagnoses")
    # The strict suite's detectors fire where the recording suite's did not.
    assert scalar(f"SELECT count(*) FROM {found}") > scalar(f"SELECT count(*) FROM {recorded}")
    summary = q.diagnoses_summary(traces, source=strict)
    assert summary["findings"].sum() == scalar(f"SELECT count(*) FROM {found}")
    assert q.diagnoses_totals(traces, source=strict)["runs"] == scalar(f"SELECT count(DISTINCT run_id) FROM {found}")
    total, page = q.diagnosis_findings(traces, "loop.repeated_call", None, 0, 1000, source=strict)
    assert total == len(page) == scalar(f"SELECT count(*) FROM {found} WHERE detector = 'loop.repeated_call'") > 0
    by_step = q.diagnoses_by_step(traces, source=strict)
    assert by_step["findings"].sum() == summary["findings"].sum()
    assert q.diagnoses_summary(traces)["findings"].sum() == scalar(f"SELECT count(*) FROM {recorded}")
    with pytest.raises(NoData, match="no-such-replay"):
        q.diagnoses_summary(traces, source="no-such-replay")


def test_prompt_comparison_rates_and_intervals(traces: Traces, recorded_home: Path) -> None:
    runs = table(recorded_home, "runs")
    got = q.prompt_compare(traces, "v1", "v2")
    for version in ("v1", "v2"):
        k = scalar(f"SELECT count(*) FROM {runs} WHERE prompt_version = '{version}' AND status = 'SUCCEEDED'")
        n = scalar(f"SELECT count(*) FROM {runs} WHERE prompt_version = '{version}' AND status IN "
                   f"{TERMINAL_STATES}")  # rates are over finished runs; some runs wait on a person
        rate = got["rates"][version]["success"]
        assert (rate["k"], rate["n"]) == (k, n)
        assert (rate["lo"], rate["hi"]) == pytest.approx(wilson(k, n))
        assert rate["lo"] <= k / n <= rate["hi"]
    assert got["steps"]["runs"].sum() == scalar(f"SELECT count(*) FROM {runs}")
    assert got["cost"]["runs"].sum() == scalar(f"SELECT count(*) FROM {runs}")


def test_wilson_interval_known_values() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and round(hi, 4) == 0.2775
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_compare_recorded_with_a_hand_written_replay(traces: Traces, recorded_home: Path) -> None:
    flips = scalar(f"SELECT count(*) FROM {table(recorded_home, 'validations')} WHERE validator = "
                   "'completion_gate' AND verdict = 'accept' AND run_id LIKE '%.v2.%'")
    got = c.compare_validators(traces, "recorded", SYNTHETIC_REPLAY)
    assert got["used_diffs"]
    assert got["totals"]["flips"] == got["totals"]["verdict_flips"] == flips > 0
    assert got["confusion"].at["accept", "reject"] == flips
    assert set(got["by_validator"]["validator"]) == {"completion_gate"}
    assert (got["divergence"]["divergence_step"] >= 1).all()


def test_the_diffs_shortcut_and_the_full_join_agree(traces: Traces, monkeypatch: pytest.MonkeyPatch) -> None:
    for replay in c.sides(traces)[1:]:
        fast = c.compare_validators(traces, "recorded", replay)
        assert fast["used_diffs"], replay
        monkeypatch.setattr(c, "_diffs_apply", lambda *_: False)
        slow = c.compare_validators(traces, "recorded", replay)
        monkeypatch.undo()
        assert not slow["used_diffs"]
        assert fast["totals"] == slow["totals"]
        assert fast["confusion"].equals(slow["confusion"])
        assert fast["by_validator"].equals(slow["by_validator"])


def test_a_real_replay_compares_like_its_own_summary(traces: Traces, recorded_home: Path) -> None:
    real = [s for s in c.sides(traces) if s not in ("recorded", SYNTHETIC_REPLAY)]
    assert len(real) == 1
    summary = __import__("duckdb").sql(
        f"SELECT flips, runs_diverged, regressions, decisions FROM "
        f"read_parquet('{recorded_home}/replays/{real[0]}/summary/*.parquet')").fetchone()
    got = c.compare_validators(traces, "recorded", real[0])["totals"]
    assert (got["flips"], got["runs_diverged"], got["regressions"], got["decisions"]) == summary


def test_scenario_labels_are_derived_like_the_replay_does(traces: Traces, recorded_home: Path) -> None:
    real = next(s for s in c.sides(traces) if s not in ("recorded", SYNTHETIC_REPLAY))
    labels = __import__("duckdb").sql(
        f"SELECT labels, labels_agreeing FROM read_parquet('{recorded_home}/replays/{real}/summary/*.parquet')"
    ).fetchone()
    summary = c.labels_summary(traces)
    assert summary.loc[summary["source"] == "scenario", "labels"].sum() == labels[0] > 0
    outcomes = c.compare_validators(traces, "recorded", real)["labels"]
    assert len(outcomes) == labels[0]
    assert (outcomes["outcome"].isin(["agrees", "fix"])).sum() == labels[1]


def test_an_empty_home_says_so(tmp_path: Path) -> None:
    empty = Traces(tmp_path)
    with pytest.raises(NoData, match="No `runs` table"):
        q.overview(empty)
    assert c.sides(empty) == []
    assert fingerprint(tmp_path) == fingerprint(tmp_path)


def test_a_home_with_only_runs_still_answers(recorded_home: Path, tmp_path: Path) -> None:
    shutil.copytree(recorded_home / "traces" / "runs", tmp_path / "traces" / "runs")
    partial = Traces(tmp_path)
    assert q.overview(partial)["totals"]["runs"] > 0
    assert q.time_split(partial).empty
    assert q.runs_count(partial, q.RunFilter(detectors=("loop.oscillation",))) == 0
    with pytest.raises(NoData, match="loop_diagnoses"):
        q.diagnoses_summary(partial)


def test_a_corrupt_file_is_a_clear_error(recorded_home: Path, tmp_path: Path) -> None:
    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    before = fingerprint(tmp_path)
    (tmp_path / "traces" / "runs" / "broken.parquet").write_bytes(b"not parquet at all")
    assert fingerprint(tmp_path) != before
    with pytest.raises(CorruptData, match="broken.parquet"):
        q.overview(Traces(tmp_path))


def test_imported_runs_replayed_without_a_baseline_compare_like_the_replay(tmp_path: Path) -> None:
    """Imported without ``--decide``, the runs have no recorded decisions:
    a replay's accepting decisions flip nothing, and its summary counts no
    fix; the page counts the same."""
    import subprocess
    import sys

    loopledger = str(Path(sys.executable).with_name("loopledger"))
    chats = tmp_path / "chats.jsonl"
    lines = []
    for i in range(6):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "get_order", "arguments": json.dumps({"order_id": f"A{i}"})}}
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": f"where is order A{i}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": '{"ok": 1}'},
            {"role": "assistant", "content": f"Order A{i} is on its way."},
        ], "metadata": {"id": f"r{i}", "reward": i % 2}}))
    chats.write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"

    def cli(*args: str) -> None:
        done = subprocess.run([loopledger, *args, "--home", str(home)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr

    cli("import", "openai-jsonl", str(chats))
    # A person says one call's tool_exists should accept (the import gave no
    # catalogue, so the replay rejects it): no decision was recorded, which
    # did not object, so the replay's reject is a regression, here and on the page.
    run_id = __import__("duckdb").sql(f"SELECT min(run_id) FROM read_parquet('{home}/traces/runs/*.parquet')").fetchone()[0]
    cli("label", run_id, "--step", "1", "--validator", "tool_exists", "--expect", "accept")
    cli("replay", "--suite", "default", "--fail-on", "never")
    (replay,) = [p.name for p in (home / "replays").iterdir() if p.is_dir()]
    fixes, regressions, agreeing = __import__("duckdb").sql(
        f"SELECT fixes, regressions, labels_agreeing FROM read_parquet('{home}/replays/{replay}/summary/*.parquet')"
    ).fetchone()
    compared = c.compare_validators(Traces(home), "recorded", replay)
    assert (compared["totals"]["fixes"], compared["totals"]["regressions"]) == (fixes, regressions) == (0, 1)
    # Swapped, the sides' flips mirror each other: the replay's accepting
    # decisions, which the recording never made, are no flips either way.
    swapped = c.compare_validators(Traces(home), replay, "recorded")
    for key in ("flips", "verdict_flips", "runs_diverged"):
        assert swapped["totals"][key] == compared["totals"][key]
    assert swapped["totals"]["regressions"] == compared["totals"]["fixes"]
    assert swapped["totals"]["fixes"] == compared["totals"]["regressions"]
    labels = compared["labels"]
    assert len(labels) > 0 and (labels["outcome"] == "agrees").sum() == agreeing
    # The Overview says whether the tasks were done: the reward, not the status.
    totals = q.overview(Traces(home))["totals"]
    assert (totals["succeeded"], totals["rewarded"], totals["reward_solved"]) == (6, 6, 3)
    assert totals["reward_rate"] == 0.5


def test_a_file_whose_data_pages_are_broken_is_named_with_its_table(recorded_home: Path, tmp_path: Path) -> None:
    """The footer reads, the pages do not: DuckDB's error does not always
    say which file it was reading; the message does."""
    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    (victim,) = sorted((tmp_path / "traces" / "events").glob("*.parquet"))[:1]
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer):
        data[i] = (data[i] * 7 + 13) % 256
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptData) as info:
        q.time_split(Traces(tmp_path))
    assert "`events` table" in str(info.value) and victim.name in str(info.value)


def test_prompt_versions_of_imported_runs_are_compared_by_their_reward(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported conversations all end as SUCCEEDED; their reward says which
    tasks were solved. The comparison and the Runs page show it."""
    import subprocess
    import sys

    lines = []
    for policy, rewards in (("policy A", (1, 1, 0, 1)), ("policy B", (0, 1, 0, 0))):
        for task, reward in enumerate(rewards):
            lines.append(json.dumps({"messages": [
                {"role": "system", "content": policy},
                {"role": "user", "content": f"task {task}"},
                {"role": "assistant", "content": "done"},
            ], "metadata": {"id": f"{policy}-{task}", "task_id": f"t{task}", "reward": reward}}))
    # A task run under one version only has no rate to compare.
    lines.append(json.dumps({"messages": [{"role": "system", "content": "policy A"},
                                          {"role": "user", "content": "task 9"},
                                          {"role": "assistant", "content": "done"}],
                             "metadata": {"id": "policy A-9", "task_id": "t9", "reward": 1}}))
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"
    loopledger = str(Path(sys.executable).with_name("loopledger"))
    done = subprocess.run([loopledger, "import", "openai-jsonl", str(chats), "--home", str(home)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    traces = Traces(home)
    a, b = q.prompt_versions(traces)
    got = q.prompt_compare(traces, a, b)
    solved = {v: (got["rates"][v]["solved"]["k"], got["rates"][v]["solved"]["n"]) for v in (a, b)}
    success = {v: got["rates"][v]["success"]["k"] for v in (a, b)}
    assert sorted(solved.values()) == [(1, 4), (4, 5)] and sorted(success.values()) == [4, 5]
    assert sorted(got["metrics"]["mean_reward"]) == [0.25, 0.8]
    # Tasks 0 and 3 are solved under one policy only; 1 and 2 alike under both.
    assert sorted(got["tasks"]["task_id"]) == ["t0", "t3"] and got["shared_tasks"] == 4
    assert got["tasks_differing"] == 2
    # The list is bounded; how many differ is said apart (the page: "the 1 most different of the 2").
    monkeypatch.setattr(q, "TASK_ROWS", 1)
    fewer = q.prompt_compare(traces, a, b)
    assert len(fewer["tasks"]) == 1 and fewer["tasks_differing"] == 2
    _, page = q.runs_page(traces, q.RunFilter(), "reward", True, 0, 10)
    assert list(page["reward"]) == [1.0] * 5 + [0.0] * 4


def test_an_unreadable_replay_leaves_the_other_pages_and_replays_readable(recorded_home: Path,
                                                                          tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    real = next(p.name for p in (home / "replays").iterdir() if p.name != SYNTHETIC_REPLAY)
    (victim,) = sorted((home / "replays" / SYNTHETIC_REPLAY / "decisions").glob("*.parquet"))[:1]
    victim.write_bytes(b"PAR1 not a footer")
    traces = Traces(home)
    assert q.overview(traces)["totals"]["runs"] == q.overview(Traces(recorded_home))["totals"]["runs"]
    assert q.runs_count(traces, q.RunFilter()) > 0
    assert list(c.unreadable_replays(traces)) == [SYNTHETIC_REPLAY]
    # Not offered for a choice that could only fail: it is named apart.
    assert c.sides(Traces(home)) == ["recorded", real]
    assert set(c.replay_summaries(traces)["replay_dir"]) == {real}
    assert c.compare_validators(traces, "recorded", real)["totals"] == \
        c.compare_validators(Traces(recorded_home), "recorded", real)["totals"]
    with pytest.raises(CorruptData, match=f"replay `{SYNTHETIC_REPLAY}`.*{victim.name}"):
        c.compare_validators(traces, "recorded", SYNTHETIC_REPLAY)
    # The same for the loop findings of a replay whose table cannot be read.
    (diagnoses,) = sorted((home / "replays" / real / "loop_diagnoses").glob("*.parquet"))[:1]
    diagnoses.write_bytes(b"PAR1 not a footer")
    assert q.diagnosis_sources(Traces(home)) == ["recorded"]
    with pytest.raises(CorruptData, match=f"replay `{real}`.*{diagnoses.name}"):  # asked for anyway: the file named
        q.diagnoses_summary(Traces(home), source=real)


def test_a_trace_table_with_an_unreadable_footer_fails_only_the_queries_that_read_it(recorded_home: Path,
                                                                                      tmp_path: Path) -> None:
    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    (victim,) = sorted((tmp_path / "traces" / "validations").glob("*.parquet"))[:1]
    victim.write_bytes(b"not parquet")
    traces = Traces(tmp_path)
    assert q.overview(traces)["totals"]["runs"] == q.overview(Traces(recorded_home))["totals"]["runs"]
    _, page = q.runs_page(traces, q.RunFilter())
    # The Run page: that section says so, the others are there.
    detail = q.run_detail(traces, page["run_id"][0])
    assert list(detail["errors"]) == ["validations"] and victim.name in detail["errors"]["validations"]
    assert detail["validations"].empty and not detail["events"].empty and not detail["candidates"].empty
    with pytest.raises(CorruptData, match=victim.name):
        c.compare_validators(traces, "recorded", "recorded")


def test_a_replay_still_being_written_or_oddly_named_is_not_listed(recorded_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    listed = Traces(home).replay_ids()
    for name in (f"{SYNTHETIC_REPLAY}-2.partial", ".hidden", "two words"):
        shutil.copytree(home / "replays" / SYNTHETIC_REPLAY, home / "replays" / name)
    traces = Traces(home)
    assert traces.replay_ids() == listed
    assert set(c.replay_summaries(traces)["replay_dir"]) == set(listed)


def test_two_replays_over_different_runs_compare_only_what_both_decided_on(recorded_home: Path,
                                                                           tmp_path: Path) -> None:
    """One replay over half the runs, one over all, with the same suite:
    the candidates the first never saw are not compared (as a replay against
    an earlier one counts them, docs/replay.md), so nothing flips."""
    import duckdb

    from loopledger.replay import replay

    home = tmp_path / "home"
    shutil.copytree(recorded_home / "traces", home / "traces")
    runs = sorted(r for (r,) in duckdb.sql(f"SELECT run_id FROM {table(home, 'runs')}").fetchall())
    half = tmp_path / "half"
    for folder in sorted((home / "traces").iterdir()):
        if folder.is_dir():
            (half / folder.name).mkdir(parents=True)
            rows = duckdb.sql(f"SELECT * FROM {table(home, folder.name)}")
            if "run_id" in rows.columns:
                rows = rows.filter(f"run_id IN (SELECT unnest({runs[::2]!r}))")
            pq.write_table(rows.to_arrow_table(), half / folder.name / "part.parquet")
    replay(half, "default", write_to=home / "replays", replay_id="half")
    replay(home / "traces", "default", write_to=home / "replays", replay_id="all")
    got = c.compare_validators(Traces(home), "half", "all")
    assert not got["used_diffs"]
    assert got["totals"]["flips"] == got["totals"]["runs_diverged"] == 0
    missed = scalar(f"SELECT count(DISTINCT candidate_id) FROM read_parquet('{home}/replays/all/decisions/**/*.parquet')"
                    f" WHERE run_id NOT IN (SELECT unnest({runs[::2]!r}))")
    assert got["totals"]["not_compared"] == missed > 0
    # Nor is a label on such a candidate a regression or a fix: one side has
    # no verdict for it.
    assert got["totals"]["regressions"] == got["totals"]["fixes"] == 0
    assert len(got["labels"]) > 0
    swapped = c.compare_validators(Traces(home), "all", "half")["totals"]
    assert swapped["flips"] == 0 and swapped["not_compared"] == missed
    assert swapped["regressions"] == swapped["fixes"] == 0
    outside = ~got["labels"]["run_id"].isin(runs[::2])
    assert outside.any() and set(got["labels"][outside]["outcome"]) == {"not compared"}

    # Against the recorded decisions, through the half replay's own diffs:
    # the runs it never replayed are not compared either, and the verdict
    # matrix holds the decisions it made, not the recorded ones it never saw.
    fast = c.compare_validators(Traces(home), "recorded", "half")
    assert fast["used_diffs"]
    assert fast["totals"]["not_compared"] == missed
    decided = scalar(f"SELECT count(*) FROM read_parquet('{home}/replays/half/decisions/**/*.parquet')")
    assert int(fast["confusion"].to_numpy().sum()) == decided == fast["totals"]["decisions"]
    outside = ~fast["labels"]["run_id"].isin(runs[::2])
    assert set(fast["labels"][outside]["outcome"]) == {"not compared"}


def test_the_verdict_matrix_holds_every_decision_and_swapping_transposes_it(recorded_home: Path,
                                                                           tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite with fewer members: the members it dropped are ``(none)`` on
    its side, however the two are compared (B's diffs or the full join, A
    against B or swapped), and no decision is dropped or counted twice."""
    from loopledger.replay import replay

    home = tmp_path / "home"
    shutil.copytree(recorded_home / "traces", home / "traces")
    fewer = tmp_path / "fewer.yaml"
    fewer.write_text("name: fewer\nvalidators: [structure, completion_gate]\n")
    replay(home / "traces", str(fewer), write_to=home / "replays", replay_id="fewer")
    traces = Traces(home)
    fast = c.compare_validators(traces, "recorded", "fewer")
    assert fast["used_diffs"]
    monkeypatch.setattr(c, "_diffs_apply", lambda *_: False)
    slow = c.compare_validators(traces, "recorded", "fewer")
    swapped = c.compare_validators(traces, "fewer", "recorded")
    monkeypatch.undo()
    assert fast["confusion"].equals(slow["confusion"])
    assert swapped["confusion"].equals(fast["confusion"].T)
    validations = table(home, "validations")
    recorded = scalar(f"SELECT count(*) FROM {validations}")
    assert int(fast["confusion"].to_numpy().sum()) == recorded
    dropped = scalar(f"SELECT count(*) FROM {validations} WHERE validator NOT IN ('structure', 'completion_gate') "
                     "AND verdict = 'accept'")
    assert int(fast["confusion"].loc["accept", "(none)"]) == dropped > 0
    assert int(fast["confusion"]["(none)"].sum()) + fast["totals"]["decisions"] == recorded


def test_flips_between_two_versions_of_a_validator_are_counted_apart(recorded_home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/replay.md: a comparison across versions of one validator is shown
    as such, never mixed into the figures as a change in the data."""
    from loopledger.replay import replay
    from loopledger.validators import Issue, Suite, Verdict, get_factory, validator

    try:
        get_factory("uitest.final", "1")
    except Exception:  # noqa: BLE001 - registered once per process
        @validator(name="uitest.final", version="1")
        def final_v1():
            return lambda inp: []

        @validator(name="uitest.final", version="2")
        def final_v2():
            return lambda inp: ([Issue(Verdict.REPAIR, "v2_says_so", "version 2 objects to finals")]
                                if not inp.candidate.tool_calls else [])

    home = tmp_path / "home"
    shutil.copytree(recorded_home / "traces", home / "traces")
    for version in ("1", "2"):
        suite = Suite(f"v{version}", [get_factory("structure")(), get_factory("uitest.final", version)()])
        replay(home / "traces", suite, write_to=home / "replays", replay_id=f"v{version}", workers=1,
               baseline="recorded" if version == "1" else "v1")
    traces = Traces(home)
    fast = c.compare_validators(traces, "v1", "v2")
    assert fast["used_diffs"]
    monkeypatch.setattr(c, "_diffs_apply", lambda *_: False)
    slow = c.compare_validators(traces, "v1", "v2")
    monkeypatch.undo()
    for got in (fast, slow):
        totals = got["totals"]
        assert totals["flips_across_versions"] == totals["flips"] > 0
        by = got["by_validator"]
        assert set(by["validator"]) == {"uitest.final"} and by["across_versions"].all()
        assert set(zip(by["baseline_version"], by["replay_version"])) == {("1", "2")}
        assert got["divergence"]["flips_across_versions"].sum() == totals["flips"]
    same = c.compare_validators(traces, "recorded", "v1")["totals"]
    assert same["flips_across_versions"] == 0
    from streamlit.testing.v1 import AppTest

    from ui_kit import REPO

    monkeypatch.setenv("LOOPLEDGER_HOME", str(home))
    at = AppTest.from_file(str(REPO / "ui" / "app.py"), default_timeout=60)
    at.run()
    at.switch_page("_pages_validators.py").run()
    at.selectbox(key="cmp_a").set_value("v1").run()
    at.selectbox(key="cmp_b").set_value("v2").run()
    assert not at.exception, [e.value for e in at.exception]
    warned = [w.value for w in at.warning if "compare two versions of a validator" in w.value]
    assert warned and "`uitest.final 1→2`" in warned[0], [w.value for w in at.warning]


def test_a_replay_written_before_its_diffs_had_versions_still_compares(recorded_home: Path, tmp_path: Path) -> None:
    import duckdb

    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    for other in (home / "replays").iterdir():
        if other.name != SYNTHETIC_REPLAY:  # the only replay: no other supplies the columns
            shutil.rmtree(other)
    diffs = home / "replays" / SYNTHETIC_REPLAY / "diffs"
    old = duckdb.sql(f"SELECT * EXCLUDE (baseline_validator_version, replay_validator_version, across_versions) "
                     f"FROM read_parquet('{diffs}/*.parquet')").arrow()
    old = old.read_all() if hasattr(old, "read_all") else old
    for f in diffs.glob("*.parquet"):
        f.unlink()
    pq.write_table(old, diffs / "part.parquet")
    got = c.compare_validators(Traces(home), "recorded", SYNTHETIC_REPLAY)
    assert got["used_diffs"] and got["totals"]["flips"] > 0 and got["totals"]["flips_across_versions"] == 0


def test_runs_recorded_under_different_suites_keep_every_decision_in_the_matrix(tmp_path: Path) -> None:
    """A run recorded with a smaller suite: its candidates have no recorded
    decision from the members it lacks, which a replay with the default
    suite makes. The diffs cannot place those; the matrix still holds them,
    and swapping the sides still transposes it."""
    import subprocess

    from loopledger.replay import replay
    from ui_kit import LOOPLEDGER, REPO

    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "small.yaml").write_text("name: small\nvalidators: [structure, completion_gate]\n")
    premature = (REPO / "datasets" / "scenarios" / "final-premature.yaml").read_text()
    (scenarios / "a.yaml").write_text(premature)
    (scenarios / "b.yaml").write_text(premature.replace("id: final-premature", "id: final-premature-small")
                                      + "\nsuite: small.yaml\n")
    home = tmp_path / "home"
    done = subprocess.run([LOOPLEDGER, "run", str(scenarios / "a.yaml"), str(scenarios / "b.yaml"), "--home",
                           str(home)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    replay(home / "traces", "default", write_to=home / "replays", replay_id="all")
    traces = Traces(home)
    got = c.compare_validators(traces, "recorded", "all")
    swapped = c.compare_validators(traces, "all", "recorded")
    assert swapped["confusion"].equals(got["confusion"].T)
    replayed = scalar(f"SELECT count(*) FROM read_parquet('{home}/replays/all/decisions/**/*.parquet')")
    matrix = got["confusion"]
    assert int(matrix.to_numpy().sum() - matrix.loc["(none)"].sum()) == scalar(
        f"SELECT count(*) FROM {table(home, 'validations')}")
    assert int(matrix.to_numpy().sum() - matrix["(none)"].sum()) == replayed == got["totals"]["decisions"]
    assert int(matrix.loc["(none)"].sum()) > 0


def test_a_page_reads_while_no_export_is_publishing(recorded_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's query lists and reads the files under the export lock
    (shared): while an export holds it to publish, the page waits, and then
    reads the whole set."""
    import fcntl
    import threading
    import time

    from loopledger.ui import _st

    monkeypatch.setenv("LOOPLEDGER_HOME", str(recorded_home))
    _st._cached.clear()
    got: list[dict] = []
    with open(recorded_home / "traces" / ".export.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # as Recorder.export holds it
        page = threading.Thread(target=lambda: got.append(_st.load(q.overview)))
        page.start()
        time.sleep(1.0)
        assert page.is_alive() and not got  # waiting for the export
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        page.join(60)
    assert got and got[0]["totals"] == q.overview(Traces(recorded_home))["totals"]
    assert got[0]["totals"]["runs"] > 0


def test_a_file_replaced_with_its_size_and_time_is_read_again(tmp_path: Path) -> None:
    """What the workbench remembers of a file (whether it reads, whether a
    column is of another kind) is keyed by its inode too: a replacement of
    the same size and modification time (``cp -p``, ``rsync -t``) is another
    file, read again."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopledger.ui._data import _first_unreadable_cached

    path = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"run_id": ["a", "b"]}), path)
    assert _first_unreadable_cached([path]) is None
    before = os.stat(path)
    spare = tmp_path / "spare"
    spare.write_bytes(b"x" * before.st_size)
    os.utime(spare, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(spare, path)
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    found = _first_unreadable_cached([path])
    assert found is not None and found[0] == path
