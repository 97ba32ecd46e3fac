"""What a transcript holds reaches the trace tables: a user's turn wherever
it comes, ToolBench's failures and final answers, OpenAI's refusals, images
and developer messages; the catalogue ``--tools`` names; and every format's
files, gzipped or not, found in folders (hidden files left out)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import import_traces, read_conversations

TOOLS = {"tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}],
         "tool_types": {"get_order": "read"}}


def _call(call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "A"}'}}


def _jsonl(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _events(home: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(e["payload_json"]) for e in sorted(table(home, "events"), key=lambda e: e["seq"])
            if e["kind"] == kind]


def _items(home: Path) -> list[list[dict[str, Any]]]:
    return [json.loads(c["items_json"]) for c in sorted(table(home, "candidates"), key=lambda c: c["step"])]


# --- a user's turn after a tool step -------------------------------------------------


def test_openai_user_message_after_a_tool_result_is_a_user_turn(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chats.jsonl", {"messages": [
        {"role": "user", "content": "look up A"},
        {"role": "assistant", "content": None, "tool_calls": [_call()]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "user", "content": "actually, cancel it instead"},
        {"role": "assistant", "content": "OK, cancelled."}]})
    home = tmp_path / "home"
    import_traces("openai-jsonl", [path], home=home)
    (reply,) = _events(home, "reply_accepted")
    assert reply["message"] == "actually, cancel it instead" and reply["wait_id"] is None and reply["unprompted"]
    (run,) = table(home, "runs")
    assert (run["status"], run["steps"]) == ("SUCCEEDED", 2)
    seqs = sorted(e["seq"] for e in table(home, "events"))
    assert seqs == list(range(1, len(seqs) + 1))


def _tau2_file(tmp: Path, messages: list[dict[str, Any]]) -> Path:
    (tmp / "tools").mkdir(exist_ok=True)
    (tmp / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    (tmp / "sims").mkdir(exist_ok=True)
    path = tmp / "sims" / "run.json"
    path.write_text(json.dumps({"info": {"environment_info": {"domain_name": "shop", "policy": "p"}},
                                "simulations": [{"id": "s1", "task_id": "t1", "termination_reason": "user_stop",
                                                 "messages": messages}]}))
    return path


@pytest.mark.parametrize("after", ["tool", "text"])
def test_tau2_user_tool_call_is_an_event_wherever_the_user_speaks(tmp_path: Path, after: str) -> None:
    agent = ([{"role": "assistant", "content": None, "tool_calls": [
                 {"id": "a1", "name": "get_order", "arguments": {"order_id": "A"}, "requestor": "assistant"}]},
              {"role": "tool", "id": "a1", "content": "ok", "requestor": "assistant", "error": False}]
             if after == "tool" else [{"role": "assistant", "content": "Please toggle airplane mode."}])
    path = _tau2_file(tmp_path, [
        {"role": "user", "content": "hi"},
        *agent,
        {"role": "user", "content": "and?", "tool_calls": [
            {"id": "u2", "name": "toggle_airplane", "arguments": {}, "requestor": "user"}]},
        {"role": "tool", "id": "u2", "content": "airplane mode off", "requestor": "user", "error": False},
        {"role": "assistant", "content": "Great."},
        {"role": "user", "content": "###STOP###"}])
    home = tmp_path / "home"
    (imported,) = import_traces("tau2", [path], home=home).files
    assert imported.user_tool_calls == 1
    (call,) = _events(home, "user_tool_call")
    assert (call["tool"], call["outcome"], call["result"]) == ("toggle_airplane", "success", "airplane mode off")
    (reply,) = _events(home, "reply_accepted")
    assert reply["message"] == "and?"
    assert [o["tool"] for o in table(home, "operations")] == (["get_order"] if after == "tool" else [])


# --- ToolBench ---------------------------------------------------------------------


def _toolbench(folder: Path, messages: list[dict[str, Any]], name: str = "7_ChatGPT_DFS_woFilter_w2.json",
               **answer: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"win": True, "answer_generation": {
        "valid_data": True, "finish_type": "give_answer", "query": "weather?",
        "function": [{"name": "weather", "parameters": {"type": "object", "properties": {}}},
                     {"name": "Finish", "parameters": {"type": "object", "properties": {}}}],
        "train_messages": [messages], **answer}}
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def _fc(name: str, arguments: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "function_call": {"name": name, "arguments": json.dumps(arguments)}}


@pytest.mark.parametrize("error, outcome", [
    ({"code": 5}, "validation_failed"), (["boom"], "validation_failed"), (True, "validation_failed"),
    (5, "validation_failed"), ("Timeout error", "validation_failed"),
    ("", "success"), (None, "success"), ({}, "success"), (False, "success"), (0, "success"),
])
def test_toolbench_error_that_is_not_a_string(tmp_path: Path, error: Any, outcome: str) -> None:
    path = _toolbench(tmp_path / "G1_answer", [
        {"role": "user", "content": "weather?"},
        _fc("weather", {"city": "Z"}),
        {"role": "function", "name": "weather", "content": json.dumps({"error": error, "response": ""})},
        {"role": "assistant", "content": "Sorry."}])
    home = tmp_path / "home"
    import_traces("toolbench", [path], home=home)
    (op,) = table(home, "operations")
    assert op["outcome"] == outcome
    (result,) = _events(home, "operation_result")
    assert result["error_code"] == (None if outcome == "success" else
                                    "TIMEOUT" if error == "Timeout error" else "TOOL_ERROR")


def test_toolbench_finish_is_the_final_answer_not_a_tool_call(tmp_path: Path) -> None:
    path = _toolbench(tmp_path / "G1_answer", [
        {"role": "system", "content": "You are AutoGPT"},
        {"role": "user", "content": "weather?"},
        _fc("weather", {"city": "Z"}, content="Thought: look it up"),
        {"role": "function", "name": "weather", "content": '{"error": "", "response": "sunny"}'},
        _fc("Finish", {"return_type": "give_answer", "final_answer": "It is sunny in Z."}, content="Done.")])
    home = tmp_path / "home"
    (imported,) = import_traces("toolbench", [path], home=home).files
    assert (imported.operations, imported.unanswered_operations) == (1, 0)
    assert [o["tool"] for o in table(home, "operations")] == ["weather"]
    last = _items(home)[-1]
    assert last == [{"type": "text", "text": "Done."}, {"type": "text", "text": "It is sunny in Z."}]
    (final,) = [json.loads(a["body"]) for a in table(home, "artifacts") if a["kind"] == "final"]
    assert final["items"] == last
    (run,) = table(home, "runs")
    assert (run["status"], run["reason"], run["reward"], run["task_id"], run["model_route"]) == (
        "SUCCEEDED", "completed", 1.0, "G1_answer/7", "gpt-3.5-turbo")
    assert sorted(c["finish_reason"] for c in table(home, "candidates")) == ["stop", "tool_calls"]


def test_toolbench_give_up_ends_the_run_without_an_operation(tmp_path: Path) -> None:
    path = _toolbench(tmp_path / "G1_answer", [
        {"role": "user", "content": "weather?"},
        _fc("Finish", {"return_type": "give_up_and_restart"})], finish_type="give_up")
    home = tmp_path / "home"
    import_traces("toolbench", [path], home=home)
    assert table(home, "operations") == []
    (run,) = table(home, "runs")
    assert (run["status"], run["reason"]) == ("FAILED", "model_error")


def test_toolbench_legacy_call_ids_are_the_messages_place(tmp_path: Path) -> None:
    path = _toolbench(tmp_path / "G1_answer", [
        {"role": "user", "content": "weather?"},
        _fc("weather", {"city": "Z"}),
        {"role": "function", "name": "weather", "content": '{"error": "", "response": "sunny"}'},
        {"role": "assistant", "content": "Sunny."}])
    home = tmp_path / "home"
    import_traces("toolbench", [path], home=home)
    (op,) = table(home, "operations")
    assert op["call_id"] == "function_call-1"
    assert _items(home)[0][0]["call_id"] == "function_call-1"


@pytest.mark.parametrize("train_messages", ["absent", [], None, "a path"])
def test_toolbench_answers_marked_not_valid_are_skipped_and_counted(tmp_path: Path, train_messages: Any) -> None:
    folder = tmp_path / "G1_answer"
    _toolbench(folder, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
               name="1_ChatGPT_DFS_woFilter_w2.json")
    invalid = _toolbench(folder, [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}],
                         name="2_ChatGPT_DFS_woFilter_w2.json", valid_data=False)
    data = json.loads(invalid.read_text())
    if train_messages == "absent":
        del data["answer_generation"]["train_messages"]
    elif train_messages != "a path":
        data["answer_generation"]["train_messages"] = train_messages
    invalid.write_text(json.dumps(data))
    result = import_traces("toolbench", [folder], home=tmp_path / "home")
    assert (result.runs, result.skipped, result.invalid) == (1, 1, 1)
    assert [(f.runs, f.skipped, f.invalid) for f in result.files] == [(1, 0, 0), (0, 0, 1)]
    printed = cli("import", "toolbench", str(folder), "--home", str(tmp_path / "home2"))
    assert printed.returncode == 0, printed.stderr
    assert "imported 1 runs" in printed.stdout and "(1 skipped)" in printed.stdout


# --- OpenAI's content -------------------------------------------------------------------


def test_refusal_images_and_developer_messages_are_kept(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chats.jsonl", {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in "},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                     {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "It is not allowed."}]}]})
    ((_, (conv,)),) = read_conversations("openai-jsonl", [path])
    assert conv.messages[0].role == "system" and conv.system_prompt == "Be brief."
    assert conv.messages[1].content == "What is in [image]?"
    home = tmp_path / "home"
    import_traces("openai-jsonl", [path], home=home)
    assert _items(home) == [[{"type": "text", "text": "I can't help with that."}],
                            [{"type": "text", "text": "It is not allowed."}]]
    context = next(json.loads(a["body"]) for a in table(home, "artifacts") if a["kind"] == "context")
    assert [m["role"] for m in context["messages"]] == ["system", "user"]
    assert context["messages"][1]["content"] == "What is in [image]?"


# --- --tools ------------------------------------------------------------------------------


def test_tools_file_is_the_catalogue_for_every_line(tmp_path: Path) -> None:
    own = [{"type": "function", "function": {"name": "line_tool", "parameters": {"type": "object"}}}]
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = _jsonl(tmp_path / "chats.jsonl", {**chat, "tools": own}, {**chat, "metadata": {"id": 2}},
                  {**chat, "tools": [{"type": "function", "function": {"name": "x", "parameters": "not read"}}]})
    catalogue = tmp_path / "catalogue.json"
    catalogue.write_text(json.dumps(TOOLS))
    ((_, conversations),) = read_conversations("openai-jsonl", [path], tools=catalogue)
    assert [[t["name"] for t in c.tools.value] for c in conversations] == [["get_order"]] * 3
    assert [t["read_only"] for t in conversations[0].tools.value] == [True]
    # Without --tools, a line's own catalogue is its.
    ((_, without),) = read_conversations("openai-jsonl", [_jsonl(tmp_path / "own.jsonl", {**chat, "tools": own})])
    assert [t["name"] for t in without[0].tools.value] == ["line_tool"]


# --- gzip and folders ----------------------------------------------------------------------


def _tau_bench_record() -> dict[str, Any]:
    return {"task_id": 1, "trial": 0, "reward": 1.0, "info": {},
            "traj": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_every_format_finds_gzipped_files_in_folders_and_skips_hidden_ones(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "m-shop.json.gz").write_bytes(gzip.compress(json.dumps([_tau_bench_record()]).encode()))
    (runs / ".m-shop.json").write_text("not even JSON")  # an editor's or a tool's hidden file
    (runs / ".cache").mkdir()
    (runs / ".cache" / "m-shop.json").write_text("[]")
    assert import_traces("tau-bench", [runs], home=tmp_path / "h1").runs == 1

    chats = tmp_path / "chats"
    chats.mkdir()
    line = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    (chats / "a.jsonl.gz").write_bytes(gzip.compress((line + "\n").encode()))
    (chats / ".hidden.jsonl").write_text("{broken\n")
    result = import_traces("openai-jsonl", [chats], home=tmp_path / "h2")
    assert result.runs == 1 and [Path(f.path).name for f in result.files] == ["a.jsonl.gz"]

    answers = tmp_path / "G1_answer"
    answers.mkdir()
    toolbench = {"win": False, "answer_generation": {"valid_data": True, "finish_type": "give_up", "function": [],
                                                     "train_messages": [json.loads(line)["messages"]]}}
    (answers / "3_x.json.gz").write_bytes(gzip.compress(json.dumps(toolbench).encode()))
    assert import_traces("toolbench", [answers], home=tmp_path / "h3").runs == 1


def test_a_hidden_file_named_explicitly_is_read(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    path = _jsonl(tmp_path / ".chats.jsonl", line)
    assert import_traces("openai-jsonl", [path], home=tmp_path / "home").runs == 1


# --- tau-bench's termination -----------------------------------------------------------


@pytest.mark.parametrize("ending, status", [
    ([{"role": "user", "content": "thanks ###STOP###"}], ("SUCCEEDED", "completed", "user_stop")),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function",
         "function": {"name": "transfer_to_human_agents", "arguments": '{"summary": "wants a refund"}'}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "Transfer successful"}],
     ("SUCCEEDED", "completed", "agent_stop")),
    ([{"role": "assistant", "content": None, "tool_calls": [_call("c2")]},
      {"role": "tool", "tool_call_id": "c2", "content": "paid"}], ("BUDGET_EXHAUSTED", "max_steps", "max_steps")),
    ([{"role": "user", "content": "and the other order?"}], ("BUDGET_EXHAUSTED", "max_steps", "max_steps")),
    ([{"role": "assistant", "content": "One moment."}], ("BUDGET_EXHAUSTED", "max_steps", "max_steps")),
], ids=["user-stop", "transfer", "tool-result", "user-message", "assistant-text"])
def test_tau_bench_termination_is_inferred_from_the_transcripts_end(tmp_path: Path, ending: list[dict[str, Any]],
                                                                     status: tuple[str, str, str]) -> None:
    """tau-bench ends an episode at the user's ###STOP### or when the agent
    calls a terminate tool (transfer_to_human_agents); anywhere else, the
    step limit cut it."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "runs").mkdir()
    traj = [{"role": "system", "content": "policy"}, {"role": "user", "content": "is A paid?"},
            {"role": "assistant", "content": "Let me see."}, {"role": "user", "content": "ok"}, *ending]
    path = tmp_path / "runs" / "gpt-4o-shop.json"
    path.write_text(json.dumps([{"task_id": 1, "trial": 0, "reward": 1.0, "info": {}, "traj": traj}]))
    home = tmp_path / "home"
    import_traces("tau-bench", [path], home=home)
    (run,) = table(home, "runs")
    imported = json.loads(run["spec_json"])["imported"]
    assert (run["status"], run["reason"], imported["termination"]) == status
    assert imported["metadata"]["termination_inferred"] is True
