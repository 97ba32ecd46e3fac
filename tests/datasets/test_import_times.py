"""Imported runs carry the source's own times: tau2's start, end and message
times stamp the runs, events, artifacts and labels (never going back); a
source without times is stamped by the import's clock."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, load, table

from loopledger.datasets import import_traces

TOOLS = {"tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]}
PINNED = "2030-01-01T00:00:00+00:00"


def utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def tau2_file(tmp: Path, start: str | None = "2025-10-05T07:42:54", end: str | None = "2025-10-05T07:43:11",
              times: tuple[str | None, ...] = ("07:42:55", "07:42:58", "07:43:01", "07:43:02", "07:43:04",
                                               "07:43:10")) -> Path:
    """One simulation: a greeting the user answers, a tool call and its
    result, a final answer and the user's stop; ``times`` are the messages'
    (on 2025-10-05 unless they hold a date, None: no timestamp)."""
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "get A"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a1", "name": "get_order", "arguments": {"order_id": "A"}, "requestor": "assistant"}]},
        {"role": "tool", "id": "a1", "content": "{}", "requestor": "assistant", "error": False},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "###STOP###"},
    ]
    for message, time in zip(messages, times):
        if time is not None:
            message["timestamp"] = time if "T" in time else f"2025-10-05T{time}"
    sim: dict[str, Any] = {"id": "s1", "task_id": "t1", "trial": 0, "termination_reason": "user_stop",
                           "reward_info": {"reward": 1.0}, "messages": messages}
    if start is not None:
        sim["start_time"] = start
    if end is not None:
        sim["end_time"] = end
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "run.json"
    path.write_text(json.dumps({"info": {"environment_info": {"domain_name": "shop", "policy": "be nice"}},
                                "simulations": [sim]}))
    return path


def imported(tmp: Path, fmt: str, path: Path) -> dict[str, list[dict[str, Any]]]:
    tools = tmp / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    home = tmp / "home"
    assert import_traces(fmt, [path], home=home, tools=tools).runs == 1
    return {name: table(home, name) for name in ("runs", "events", "artifacts", "labels")}


def times_by_kind(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each event as (its kind, or the state a transition went to; its time as HH:MM:SS), in seq order."""
    return [(e["to_state"] if e["kind"] == "transition" else e["kind"], e["ts"].strftime("%H:%M:%S"))
            for e in sorted(events, key=lambda e: e["seq"])]


def test_each_commit_is_at_the_latest_source_time_reached(tmp_path: Path) -> None:
    tables = imported(tmp_path, "tau2", tau2_file(tmp_path))
    (run,) = tables["runs"]
    assert (run["started_at"], run["ended_at"]) == (utc("2025-10-05T07:42:54"), utc("2025-10-05T07:43:11"))
    assert times_by_kind(tables["events"]) == [
        ("run_created", "07:42:54"),
        ("MODEL_RUNNING", "07:42:54"), ("VALIDATING", "07:42:55"), ("candidate_recorded", "07:42:55"),
        ("WAITING_USER", "07:42:55"), ("READY", "07:42:58"), ("reply_accepted", "07:42:58"),
        ("MODEL_RUNNING", "07:42:58"), ("VALIDATING", "07:43:01"), ("candidate_recorded", "07:43:01"),
        ("TOOL_RUNNING", "07:43:01"),
        ("READY", "07:43:02"), ("operation_dispatched", "07:43:02"), ("operation_result", "07:43:02"),
        ("step_closed", "07:43:02"),
        ("MODEL_RUNNING", "07:43:02"), ("VALIDATING", "07:43:04"), ("candidate_recorded", "07:43:04"),
        ("FINALIZING", "07:43:04"), ("step_closed", "07:43:04"), ("transcript_tail", "07:43:10"),
        ("SUCCEEDED", "07:43:11"),
    ]
    # Artifacts are stamped with the commit that stores them, the label with the terminal one.
    assert [(a["kind"], a["created_at"].strftime("%H:%M:%S")) for a in tables["artifacts"]] == [
        ("tool_registry", "07:42:54"), ("context", "07:42:54"), ("candidate", "07:42:55"),
        ("context", "07:42:58"), ("candidate", "07:43:01"), ("tool_result", "07:43:02"),
        ("context", "07:43:02"), ("candidate", "07:43:04"), ("final", "07:43:04")]
    assert [label["created_at"] for label in tables["labels"]] == [utc("2025-10-05T07:43:11")]


def test_times_with_an_offset_are_converted(tmp_path: Path) -> None:
    path = tau2_file(tmp_path, start="2025-10-05T09:42:54+02:00", end="2025-10-05T07:43:11Z",
                     times=("2025-10-05T02:42:55-05:00", "07:42:58", "2025-10-05T07:43:01+00:00",
                            "07:43:02", "07:43:04", "07:43:10"))
    tables = imported(tmp_path, "tau2", path)
    (run,) = tables["runs"]
    assert (run["started_at"], run["ended_at"]) == (utc("2025-10-05T07:42:54"), utc("2025-10-05T07:43:11"))
    kinds = dict(times_by_kind(tables["events"]))
    assert kinds["run_created"] == "07:42:54" and kinds["reply_accepted"] == "07:42:58"
    assert [e[1] for e in times_by_kind(tables["events"]) if e[0] == "candidate_recorded"] == [
        "07:42:55", "07:43:01", "07:43:04"]


@pytest.mark.parametrize("start, end, times, started, ended", [
    # No start_time: the first message's time; no end_time: the latest time reached.
    (None, None, ("07:42:55", "07:42:58", None, None, "07:43:04", "07:43:10"), "07:42:55", "07:43:10"),
    (None, "07:43:11", (None, None, None, "07:43:02", None, None), "07:43:02", "07:43:11"),
    # Only an end: the run is there from its start to its end.
    (None, "07:43:11", (None,) * 6, "07:43:11", "07:43:11"),
    # Out of order in the source: times never go back.
    ("07:43:00", "07:42:00", ("07:42:55", "07:42:58", "07:43:05", "07:43:01", "07:43:04", "07:43:10"),
     "07:43:00", "07:43:10"),
])
def test_missing_and_disordered_times(tmp_path: Path, start: str | None, end: str | None,
                                      times: tuple[str | None, ...], started: str, ended: str) -> None:
    day = "2025-10-05T"
    path = tau2_file(tmp_path, start=start and day + start, end=end and day + end, times=times)
    tables = imported(tmp_path, "tau2", path)
    (run,) = tables["runs"]
    assert (run["started_at"], run["ended_at"]) == (utc(day + started), utc(day + ended))
    stamps = [e["ts"] for e in sorted(tables["events"], key=lambda e: e["seq"])]
    assert stamps == sorted(stamps) and stamps[0] == run["started_at"] and stamps[-1] == run["ended_at"]


def test_runs_without_source_times_get_the_import_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tau-bench has no times, nor a tau2 record without them: the import's
    clock (pinned here by LOOPLEDGER_NOW) stamps them; it does not override
    a source's own times."""
    monkeypatch.setenv("LOOPLEDGER_NOW", PINNED)
    untimed = imported(tmp_path / "untimed", "tau2",
                       tau2_file(tmp_path / "untimed", start=None, end=None, times=(None,) * 6))
    record = {"task_id": 3, "trial": 0, "reward": 1.0, "info": {}, "traj": [
        {"role": "system", "content": "policy"}, {"role": "user", "content": "get A"},
        {"role": "assistant", "content": "A is paid."}, {"role": "user", "content": "###STOP###"}]}
    (tmp_path / "bench").mkdir()
    bench = tmp_path / "bench" / "gpt-4o-shop.json"
    bench.write_text(json.dumps([record]))
    tau_bench = imported(tmp_path / "bench", "tau-bench", bench)
    for tables in (untimed, tau_bench):
        stamps = {r["started_at"] for r in tables["runs"]} | {r["ended_at"] for r in tables["runs"]}
        stamps |= {e["ts"] for e in tables["events"]} | {a["created_at"] for a in tables["artifacts"]}
        assert stamps | {label["created_at"] for label in tables["labels"]} == {utc(PINNED)}
    timed = imported(tmp_path / "timed", "tau2", tau2_file(tmp_path / "timed"))
    assert (timed["runs"][0]["started_at"], timed["runs"][0]["ended_at"]) == (
        utc("2025-10-05T07:42:54"), utc("2025-10-05T07:43:11"))
    # The wall clock (no LOOPLEDGER_NOW): the import label is at the run's end, as with a source's times.
    monkeypatch.delenv("LOOPLEDGER_NOW")
    (tmp_path / "wall").mkdir()
    wall = tmp_path / "wall" / "gpt-4o-shop.json"
    wall.write_text(json.dumps([record]))
    tables = imported(tmp_path / "wall", "tau-bench", wall)
    (run,), (label,) = tables["runs"], tables["labels"]
    assert label["source"] == "import" and label["created_at"] == run["ended_at"] >= run["started_at"]


@pytest.mark.parametrize("change, field, reason", [
    (lambda sim: sim.update(start_time="yesterday"), "simulations[0].start_time",
     "expected an ISO-8601 time, got 'yesterday'"),
    (lambda sim: sim.update(end_time=1728114191), "simulations[0].end_time", "expected a string, got an integer"),
    (lambda sim: sim["messages"][3].update(timestamp="2025-10-05T25:00:00"), "simulations[0].messages[3].timestamp",
     "expected an ISO-8601 time, got '2025-10-05T25:00:00'"),
], ids=["start-text", "end-number", "timestamp-hour-25"])
def test_a_malformed_time_is_bad_input_named_and_nothing_is_written(tmp_path: Path, change: Any, field: str,
                                                                     reason: str) -> None:
    path = tau2_file(tmp_path)
    data = json.loads(path.read_text())
    change(data["simulations"][0])
    path.write_text(json.dumps(data))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    home = tmp_path / "home"
    result = cli("import", "tau2", str(path), "--tools", str(tools), "--home", str(home))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip() == f"loopledger: bad input: {path}: {field}: {reason}"
    assert table(home, "runs") == [] and table(home, "events") == []


def test_real_tau2_runs_carry_the_files_times(tau2_files: list[Path], tmp_path: Path) -> None:
    files = tau2_files[:3]  # airline, and telecom with the user's own tool calls
    home = tmp_path / "home"
    import_traces("tau2", files, home=home)
    expected = {}
    for path in files:
        for sim in load(path)["simulations"]:
            expected[(path.name, sim["id"])] = (utc(sim["start_time"]), utc(sim["end_time"]))
    runs = table(home, "runs")
    got = {(json.loads(r["spec_json"])["imported"]["file"], json.loads(r["spec_json"])["imported"]["source_id"]):
           (r["started_at"], r["ended_at"]) for r in runs}
    assert got == expected and len(got) >= 20
    bounds = {r["run_id"]: (r["started_at"], r["ended_at"]) for r in runs}
    stamps = defaultdict(list)
    for e in sorted(table(home, "events"), key=lambda e: (e["run_id"], e["seq"])):
        stamps[e["run_id"]].append(e["ts"])
    for run_id, (start, end) in bounds.items():
        assert stamps[run_id] == sorted(stamps[run_id]), run_id
        assert stamps[run_id][0] == start and stamps[run_id][-1] == end, run_id
        assert len(set(stamps[run_id])) > 3, run_id  # the messages' times, not only the start and end
    for row in table(home, "artifacts") + table(home, "labels"):
        start, end = bounds[row["run_id"]]
        assert start <= row["created_at"] <= end
