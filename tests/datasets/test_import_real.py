"""Round trip on the real files: what the trace tables hold equals what the
source files contain, counted here straight from the raw JSON."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from import_kit import load, table


def _raw_facts(external: Path, tau2_files: list[Path]) -> dict[str, Counter]:
    """Per source: runs, agent tool calls, user tool calls, rewards, failed results."""
    facts: dict[str, Counter] = {"tau-bench": Counter(), "tau2": Counter()}
    for record in load(external / "tau-bench" / "trajectories" / "gpt-4o-airline.json"):
        c = facts["tau-bench"]
        c["runs"] += 1
        c["reward"] += record["reward"]
        for m in record["traj"]:
            if m["role"] == "assistant":
                c["candidates"] += 1
                c["calls"] += len(m.get("tool_calls") or [])
            if m["role"] == "tool" and m["content"].startswith("Error"):
                c["failed"] += 1
    for path in tau2_files:
        for sim in load(path)["simulations"]:
            c = facts["tau2"]
            c["runs"] += 1
            c["reward"] += sim["reward_info"]["reward"]
            for m in sim["messages"]:
                if m["role"] == "assistant":
                    c["candidates"] += 1
                    c["calls"] += len(m.get("tool_calls") or [])
                if m["role"] == "user":
                    c["user_calls"] += len(m.get("tool_calls") or [])
                if m["role"] == "tool" and m["requestor"] == "assistant" and m["error"]:
                    c["failed"] += 1
    return facts


def test_counts_rewards_and_outcomes_match_the_source(real_home: Path, external: Path, tau2_files: list[Path]) -> None:
    raw = _raw_facts(external, tau2_files)
    runs = table(real_home, "runs")
    ops = table(real_home, "operations")
    candidates = table(real_home, "candidates")
    events = table(real_home, "events")
    labels = table(real_home, "labels")
    by_tenant = {t: [r for r in runs if r["tenant"] == t] for t in raw}
    assert len(runs) == 786 == sum(c["runs"] for c in raw.values())
    for tenant, c in raw.items():
        mine = by_tenant[tenant]
        ids = {r["run_id"] for r in mine}
        assert len(mine) == c["runs"]
        assert sum(r["reward"] for r in mine) == c["reward"]
        assert sum(r["tool_calls"] for r in mine) == c["calls"]
        assert sum(1 for o in ops if o["run_id"] in ids) == c["calls"]
        assert sum(1 for x in candidates if x["run_id"] in ids) == c["candidates"]
        assert sum(1 for o in ops if o["run_id"] in ids and o["outcome"] == "validation_failed") == c["failed"]
        # One import label per run, on its final candidate: accept iff reward 1.
        mine_labels = [lab for lab in labels if lab["run_id"] in ids]
        assert len(mine_labels) == c["runs"]
        assert sum(lab["expected_verdict"] == "accept" for lab in mine_labels) == c["reward"]
    assert raw["tau-bench"]["runs"] == 200 and raw["tau2"]["runs"] == 586
    user_calls = [e for e in events if e["kind"] == "user_tool_call"]
    assert len(user_calls) == raw["tau2"]["user_calls"] > 0
    assert all(json.loads(e["payload_json"])["requestor"] == "user" for e in user_calls)
    # Every run ended exactly once, in a terminal state, and every request has its one result.
    assert {r["status"] for r in runs} <= {"SUCCEEDED", "BUDGET_EXHAUSTED", "FAILED"}
    results = Counter(json.loads(e["payload_json"])["operation_id"] for e in events if e["kind"] == "operation_result")
    assert set(results.values()) == {1} and len(results) == len(ops)


def test_event_seqs_have_no_gaps_and_final_candidates_are_labelled(real_home: Path) -> None:
    events = table(real_home, "events")
    seqs: dict[str, list[int]] = {}
    for e in events:
        seqs.setdefault(e["run_id"], []).append(e["seq"])
    assert all(sorted(s) == list(range(1, len(s) + 1)) for s in seqs.values())
    last = {}
    for c in table(real_home, "candidates"):
        if c["step"] >= last.get(c["run_id"], (0, ""))[0]:
            last[c["run_id"]] = (c["step"], c["candidate_id"])
    for label in table(real_home, "labels"):
        assert (label["step"], label["candidate_id"]) == last[label["run_id"]]
        assert label["source"] == "import" and label["validator"] == ""


def test_reused_tool_call_ids_in_tau_bench_are_matched_by_position(real_home: Path, external: Path) -> None:
    """49 tau-bench runs reuse a call id; each call still gets the result that
    followed it, so every operation's outcome agrees with its own result."""
    records = load(external / "tau-bench" / "trajectories" / "gpt-4o-airline.json")
    reused = [r for r in records if _reuses_ids(r["traj"])]
    assert len(reused) == 49
    expected: list[str] = []  # outcome of each call, in order, from the raw results by position
    for r in reused:
        traj = r["traj"]
        for i, m in enumerate(traj):
            for k, _ in enumerate(m.get("tool_calls") or []):
                answer = traj[i + 1 + k] if i + 1 + k < len(traj) and traj[i + 1 + k]["role"] == "tool" else None
                expected.append("unknown_outcome" if answer is None else
                                "validation_failed" if answer["content"].startswith("Error") else "success")
    runs = {(r["task_id"], json.loads(r["spec_json"])["imported"]["source_id"]): r["run_id"]
            for r in table(real_home, "runs") if r["tenant"] == "tau-bench"}
    wanted = [runs[(f"airline/{r['task_id']}", f"{r['task_id']}:{r['trial']}")] for r in reused]
    ops = [o for o in table(real_home, "operations") if o["run_id"] in set(wanted)]
    ops.sort(key=lambda o: (wanted.index(o["run_id"]), o["step"], o["operation_id"]))
    assert [o["outcome"] for o in ops] == expected


def _reuses_ids(traj: list[dict]) -> bool:
    ids = Counter(c["id"] for m in traj for c in m.get("tool_calls") or [])
    return any(n > 1 for n in ids.values())


def test_parallel_calls_in_tau2_become_operations_of_one_step(real_home: Path, tau2_files: list[Path]) -> None:
    parallel_runs = set()
    for path in tau2_files:
        for sim in load(path)["simulations"]:
            if any(m["role"] == "assistant" and len(m.get("tool_calls") or []) > 1 for m in sim["messages"]):
                parallel_runs.add(str(sim["id"]))
    assert len(parallel_runs) == 121
    runs = {json.loads(r["spec_json"])["imported"]["source_id"]: r["run_id"]
            for r in table(real_home, "runs") if r["tenant"] == "tau2"}
    per_step = Counter((o["run_id"], o["step"]) for o in table(real_home, "operations"))
    with_parallel = {run for (run, _), n in per_step.items() if n > 1}
    assert with_parallel & {runs[s] for s in runs} == {runs[s] for s in parallel_runs}


def test_toolbench_legacy_function_calls(external: Path, tmp_path: Path) -> None:
    from loopledger.datasets import import_traces

    folder = external / "toolbench-examples" / "answer"
    result = import_traces("toolbench", [folder], home=tmp_path)
    # 2 of the 15 answers have no message path (valid_data false): skipped.
    assert result.runs == 13
    expected_calls = finishes = 0
    wins = 0
    for path in sorted(folder.rglob("*.json")):
        data = load(path)
        if "train_messages" not in data["answer_generation"]:
            continue
        wins += bool(data["win"])
        # ToolBench's Finish is the agent's answer, not a tool call.
        expected_calls += sum(1 for m in data["answer_generation"]["train_messages"][-1]
                              if m.get("role") == "assistant" and m.get("function_call")
                              and m["function_call"]["name"] != "Finish")
        finishes += sum(1 for m in data["answer_generation"]["train_messages"][-1]
                        if m.get("role") == "assistant" and (m.get("function_call") or {}).get("name") == "Finish")
    runs = table(tmp_path, "runs")
    assert sum(r["reward"] for r in runs) == wins == 9
    operations = table(tmp_path, "operations")
    assert len(operations) == expected_calls > 0
    assert "Finish" not in {o["tool"] for o in operations} and finishes > 0
    assert (result.invalid, result.skipped) == (2, 2)
