"""A run is what its record says, not where the record lies: importing the
same data again (reordered, with records added in front, gzipped, renamed)
adds only what is new; and an import refused for bad input leaves a data
folder it would have created uncreated."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import import_traces

TOOLS = {"tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]}


def _traj(question: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "A"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "paid"},
        {"role": "assistant", "content": "It is paid."},
        {"role": "user", "content": "###STOP###"},
    ]


def _tau_bench(folder: Path, questions: list[str], name: str = "gpt-4o-shop.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / "tools").mkdir(exist_ok=True)
    (folder.parent / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    path = folder / name
    # task_id and trial alike: only the content tells the records apart.
    path.write_text(json.dumps([{"task_id": 1, "trial": 0, "reward": 1.0, "info": {}, "traj": _traj(q)}
                                for q in questions]))
    return path


def _jsonl(path: Path, questions: list[str], **meta: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"messages": _traj(q)[1:5], "metadata": meta}) + "\n" for q in questions))
    return path


def _tau2(path: Path, sims: list[tuple[str, str]]) -> Path:
    """A tau2 file of simulations ``(id, question)``, its catalogue beside its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent.parent / "tools").mkdir(exist_ok=True)
    (path.parent.parent / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    data = {"info": {"environment_info": {"domain_name": "shop", "policy": "p"}, "agent_info": {"llm": "m"}},
            "simulations": [{"id": sim_id, "task_id": "t1", "trial": 0, "reward_info": {"reward": 1.0},
                             "messages": [{"role": "user", "content": q},
                                          {"role": "assistant", "content": "done"}]} for sim_id, q in sims]}
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def _run_ids(home: Path) -> set[str]:
    return {r["run_id"] for r in table(home, "runs")}


def test_tau_bench_a_record_added_in_front_adds_only_itself(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = _tau_bench(tmp_path / "runs", ["alpha", "beta"])
    assert import_traces("tau-bench", [path], home=home).runs == 2
    before = _run_ids(home)
    _tau_bench(tmp_path / "runs", ["new", "alpha", "beta"])
    again = import_traces("tau-bench", [path], home=home)
    assert (again.runs, again.skipped) == (1, 2)
    assert before < _run_ids(home) and len(_run_ids(home)) == 3


def test_tau_bench_a_gzipped_or_moved_copy_adds_nothing_another_models_adds_its_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = _tau_bench(tmp_path / "runs", ["alpha", "beta"])
    import_traces("tau-bench", [path], home=home)
    packed = tmp_path / "runs" / "gpt-4o-shop.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert (import_traces("tau-bench", [packed], home=home).skipped, len(table(home, "runs"))) == (2, 2)
    moved = tmp_path / "elsewhere" / "gpt-4o-shop.json"  # another folder, the same model and domain
    moved.parent.mkdir()
    shutil.copy(path, moved)
    assert import_traces("tau-bench", [moved], home=home).runs == 0
    # The same records under another model's name: that model's runs.
    other = tmp_path / "runs" / "claude-shop.json"
    shutil.copy(path, other)
    assert import_traces("tau-bench", [other], home=home).runs == 2
    assert sorted(row["model_route"] for row in table(home, "runs")) == ["claude", "claude", "gpt-4o", "gpt-4o"]


def test_openai_jsonl_without_ids_is_known_by_content(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = _jsonl(tmp_path / "chats.jsonl", ["alpha", "beta"])
    import_traces("openai-jsonl", [path], home=home)
    _jsonl(path, ["beta", "new", "alpha"])  # reordered, a line added in the middle
    again = import_traces("openai-jsonl", [path], home=home)
    assert (again.runs, again.skipped) == (1, 2)
    packed = tmp_path / "elsewhere" / "other-name.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert import_traces("openai-jsonl", [packed], home=home).runs == 0
    assert len(table(home, "runs")) == 3


def test_tau2_is_known_by_its_simulation_id(tmp_path: Path) -> None:
    """tau2 names each simulation with a UUID: a gzipped copy, a file with
    a simulation added in front, or one whose simulations were re-saved
    with other fields holds the same runs."""
    home = tmp_path / "home"
    path = _tau2(tmp_path / "sims" / "run.json", [("s1", "alpha"), ("s2", "beta")])
    import_traces("tau2", [path], home=home)
    packed = _tau2(tmp_path / "sims" / "copy.json.gz", [("s0", "new"), ("s1", "alpha"), ("s2", "beta")])
    again = import_traces("tau2", [packed], home=home)
    assert (again.runs, again.skipped) == (1, 2)
    resaved = json.loads(path.read_text())
    resaved["simulations"][0]["seed"] = 7
    path.write_text(json.dumps(resaved))
    assert import_traces("tau2", [path], home=home).runs == 0
    assert len(table(home, "runs")) == 3


def test_toolbench_is_known_by_content_not_by_folder(tmp_path: Path) -> None:
    answer = {"win": True, "answer_generation": {
        "valid_data": True, "finish_type": "give_answer", "query": "q", "function": [],
        "train_messages": [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]}}
    first = tmp_path / "G1_answer" / "7_ChatGPT_DFS_woFilter_w2.json"
    first.parent.mkdir()
    first.write_text(json.dumps(answer))
    home = tmp_path / "home"
    assert import_traces("toolbench", [first], home=home).runs == 1
    copy = tmp_path / "copied" / "7_ChatGPT_DFS_woFilter_w2.json.gz"
    copy.parent.mkdir()
    copy.write_bytes(gzip.compress(first.read_bytes()))
    assert import_traces("toolbench", [copy], home=home).runs == 0


@pytest.mark.parametrize("fmt", ["tau-bench", "openai-jsonl", "tau2"])
def test_a_refused_import_creates_no_data_folder(tmp_path: Path, fmt: str) -> None:
    if fmt == "tau-bench":
        path = _tau_bench(tmp_path / "runs", ["alpha"])
        path.write_text(path.read_text().replace('"trial": 0', '"trial": "zero"'))
    elif fmt == "openai-jsonl":
        path = _jsonl(tmp_path / "chats.jsonl", ["alpha"], reward="high")
    else:
        path = _tau2(tmp_path / "sims" / "run.json", [("s1", "alpha")])
        path.write_text(path.read_text().replace('"role": "user"', '"role": "robot"'))
    home = tmp_path / "new-home"
    result = cli("import", fmt, str(path), "--home", str(home))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert not home.exists()
