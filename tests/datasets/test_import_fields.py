"""Every field an importer keeps is checked where it is read: a wrong type, a
NaN or an infinity (Python's json reads them; JSON has none) is bad input,
named by file, record and field, with what was expected; never a traceback,
never a value silently mangled, and nothing already recorded changes.

The breaches found by hand go through the command line; the wider matrix of
fields goes through ``read_conversations`` (the same checks, without a
process per case)."""

from __future__ import annotations

import copy
import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import ImportInputError, import_traces, read_conversations

NAN, INF = float("nan"), float("inf")

TOOLS = {"tools": [{"type": "function", "function": {"name": "get_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}}}}], "tool_types": {"get_order": "read"}}


def _call(**function: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": "{}", **function}}


def openai_record() -> dict[str, Any]:
    return {"messages": [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "get A"},
        {"role": "assistant", "content": None, "tool_calls": [_call(arguments='{"order_id": "A"}')],
         "usage": {"prompt_tokens": 10, "completion_tokens": 2}, "cost": 0.001},
        {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": "paid"},
        {"role": "assistant", "content": "A is paid."},
    ], "tools": copy.deepcopy(TOOLS["tools"]),
        "metadata": {"id": "conv-1", "task_id": "t/1", "model": "gpt-4.1", "reward": 1, "source": "bot",
                     "termination": "user_stop"}}


def tau_bench_record() -> dict[str, Any]:
    record = openai_record()
    return {"task_id": 3, "trial": 0, "reward": 1.0,
            "info": {"task": {"user_id": "u1", "instruction": "x"}, "source": "user"}, "traj": record["messages"]}


def tau2_results() -> dict[str, Any]:
    return {"info": {"environment_info": {"domain_name": "shop", "policy": "be nice"},
                     "agent_info": {"llm": "xai/grok-3"}},
            "tasks": [{"id": "t1"}],
            "simulations": [{"id": "s1", "task_id": "t1", "trial": 0, "termination_reason": "user_stop",
                             "start_time": "2025-10-05T07:42:54", "reward_info": {"reward": 1.0}, "messages": [
                                 {"role": "assistant", "content": "Hi!", "cost": 0.0},
                                 {"role": "user", "content": "get A"},
                                 {"role": "assistant", "content": None, "cost": 0.01,
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 1},
                                  "tool_calls": [{"id": "a1", "name": "get_order", "arguments": {"order_id": "A"},
                                                  "requestor": "assistant"}]},
                                 {"role": "tool", "id": "a1", "content": "{}", "requestor": "assistant",
                                  "error": False},
                                 {"role": "assistant", "content": "Done."}]}]}


def toolbench_answer() -> dict[str, Any]:
    return {"win": True, "answer_generation": {
        "valid_data": True, "finish_type": "give_answer", "query": "get A",
        "function": [{"name": "get_order", "parameters": {"type": "object", "properties": {}}}],
        "train_messages": [[
            {"role": "system", "content": "You can call functions."},
            {"role": "user", "content": "get A"},
            {"role": "assistant", "content": None, "function_call": {"name": "get_order", "arguments": "{}"}},
            {"role": "function", "name": "get_order", "content": '{"error": "", "response": "paid"}'},
            {"role": "assistant", "content": "A is paid."}]]}}


def _write(folder: Path, fmt: str, data: Any, name: str | None = None) -> Path:
    """``data`` as a ``fmt`` file in ``folder`` (the tool catalogue beside it).
    ``json.dumps`` writes NaN and Infinity, as Python tools do."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / "tools").mkdir(exist_ok=True)
    (folder.parent / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    if fmt == "openai-jsonl":
        path = folder / (name or "chats.jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    elif fmt == "tau2":
        path = folder / (name or "run.json.gz")
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    else:  # tau-bench (the domain is the name's last part), toolbench
        path = folder / (name or "gpt-4o-shop.json")
        path.write_text(json.dumps(data))
    return path


def _seeded_home(tmp: Path) -> Path:
    """A data directory holding runs already, to show a refused import leaves them be."""
    home = tmp / "home"
    import_traces("openai-jsonl", [_write(tmp / "seed", "openai-jsonl", [openai_record()])], home=home)
    assert len(table(home, "runs")) == 1
    return home


def _files(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def _refused(tmp: Path, fmt: str, path: Path, *extra: str) -> str:
    """Import ``path`` into a home holding runs already; assert exit 2, one
    line on stderr, no traceback, the home unchanged; return the line."""
    home = _seeded_home(tmp)
    before = _files(home)
    result = cli("import", fmt, str(path), "--home", str(home), *extra)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert _files(home) == before
    return lines[0]


# --- through the command line: the breaches found ------------------------------------


def _meta(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda r: r["metadata"].update(changes)


def _assistant(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda r: r["messages"][2].update(changes)


@pytest.mark.parametrize("change, field, reason", [
    (_meta(reward=NAN), "line 1.metadata.reward", "expected a finite number, got nan"),
    (_meta(reward=INF), "line 1.metadata.reward", "expected a finite number, got inf"),
    (_meta(reward=-INF), "line 1.metadata.reward", "expected a finite number, got -inf"),
    (_assistant(cost=NAN), "line 1.messages[2].cost", "expected a finite number, got nan"),
    (_assistant(usage={"prompt_tokens": INF}), "line 1.messages[2].usage.prompt_tokens",
     "expected an integer, got inf"),
    (_assistant(tool_calls=None, function_call="f"), "line 1.messages[2].function_call",
     "expected an object with name and arguments, got a string"),
    (_meta(task_id=[1]), "line 1.metadata.task_id", "expected a string or an integer, got a list"),
    (_meta(model=3), "line 1.metadata.model", "expected a string, got an integer"),
    (_assistant(tool_calls=[_call(arguments=5)]), "line 1.messages[2].tool_calls[0].function.arguments",
     "expected a JSON string or an object, got an integer"),
    (_meta(score=NAN), "line 1.metadata.score", "expected a finite number, got nan"),
], ids=["reward-nan", "reward-inf", "reward-minus-inf", "cost-nan", "tokens-inf", "function-call-string",
        "task-id-list", "model-int", "arguments-int", "extra-metadata-nan"])
def test_openai_jsonl_bad_field_is_named(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str,
                                         reason: str) -> None:
    good, bad = openai_record(), openai_record()
    change(bad)
    bad["metadata"]["id"] = "conv-2"
    path = _write(tmp_path / "in", "openai-jsonl", [good, bad])
    assert _refused(tmp_path, "openai-jsonl", path) == f"loopledger: bad input: {path}: {field.replace('line 1', 'line 2')}: {reason}"


@pytest.mark.parametrize("change, field, reason", [
    (lambda r: r.update(reward=NAN), "record 1.reward", "expected a finite number, got nan"),
    (lambda r: r.update(trial=[0]), "record 1.trial", "expected an integer, got a list"),
    (lambda r: r.update(info="str"), "record 1.info", "expected an object, got a string"),
    (lambda r: r["info"].update(task=[]), "record 1.info.task", "expected an object, got a list"),
    (lambda r: r.update(task_id=1.5), "record 1.task_id", "expected a string or an integer, got a number"),
], ids=["reward-nan", "trial-list", "info-string", "task-list", "task-id-float"])
def test_tau_bench_bad_field_is_named(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str,
                                      reason: str) -> None:
    record = tau_bench_record()
    change(record)
    path = _write(tmp_path / "runs", "tau-bench", [record])
    assert _refused(tmp_path, "tau-bench", path) == f"loopledger: bad input: {path}: {field}: {reason}"


def test_tau2_nan_reward_is_named(tmp_path: Path) -> None:
    data = tau2_results()
    data["simulations"][0]["reward_info"]["reward"] = NAN
    path = _write(tmp_path / "sims", "tau2", data)
    line = _refused(tmp_path, "tau2", path)
    assert line == f"loopledger: bad input: {path}: simulations[0].reward_info.reward: expected a finite number, got nan"


def test_unknown_decide_suite_names_decide(tmp_path: Path) -> None:
    path = _write(tmp_path / "in", "openai-jsonl", [openai_record()])
    line = _refused(tmp_path, "openai-jsonl", path, "--decide", "nosuch")
    assert line.startswith("loopledger: bad input: --decide: unknown suite 'nosuch'")
    assert "--suite" not in line


def test_bad_decide_suite_file_names_decide_and_the_file(tmp_path: Path) -> None:
    suite = tmp_path / "mine.yaml"
    suite.write_text("name: mine\nvalidators: 3\n")
    path = _write(tmp_path / "in", "openai-jsonl", [openai_record()])
    line = _refused(tmp_path, "openai-jsonl", path, "--decide", str(suite))
    assert line.startswith(f"loopledger: bad input: --decide: {suite}: ")


# --- the wider matrix, through the API ------------------------------------------------


def _refusal(fmt: str, path: Path) -> ImportInputError:
    with pytest.raises(ImportInputError) as caught:
        read_conversations(fmt, [path])
    return caught.value


def _msg(index: int, **changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda r: r["messages"][index].update(changes)


OPENAI_CASES = [
    (_meta(id=[1]), "metadata.id", "expected a string or an integer, got a list"),
    (_meta(id=True), "metadata.id", "expected a string or an integer, got a boolean"),
    (_meta(source=1), "metadata.source", "expected a string, got an integer"),
    (_meta(source="bot\n"), "metadata.source", "expected a name of letters"),
    (_meta(termination={}), "metadata.termination", "expected a string, got an object"),
    (_meta(reward="1"), "metadata.reward", "expected a number, got a string"),
    (_meta(reward=True), "metadata.reward", "expected a number, got a boolean"),
    (_meta(extra={"a": [1, NAN]}), "metadata.extra.a[1]", "expected a finite number, got nan"),
    (lambda r: r.update(metadata="x"), "metadata", "expected an object, got a string"),
    (lambda r: r.update(metadata=[]), "metadata", "expected an object, got a list"),
    (lambda r: r.update(tools="x"), "tools", "expected a list of tools, got a string"),
    (lambda r: r.update(tools=None, functions={"name": "f"}), "functions", "expected a list of tools, got an object"),
    (lambda r: r["tools"][0]["function"].update(parameters="x"), "tools[0].function.parameters",
     "expected a JSON Schema object, got a string"),
    (lambda r: r["tools"][0]["function"]["parameters"].update(minimum=NAN), "tools[0].function.parameters.minimum",
     "expected a finite number, got nan"),
    (_msg(1, content=5), "messages[1].content", "expected a string, a list of content parts or null, got an integer"),
    (_msg(1, content=["hi"]), "messages[1].content[0]", "expected a content part (an object), got a string"),
    (_msg(1, content=[{"type": "text", "text": 5}]), "messages[1].content[0].text", "expected a string, got an integer"),
    (_msg(1, content="x\ud800"), "messages[1].content", "not valid Unicode text (a lone surrogate escape)"),
    (_msg(1, role=["user"]), "messages[1].role", "unknown role a list; expected one of"),
    (_msg(1, requestor="robot"), "messages[1].requestor", "expected 'assistant' or 'user', got 'robot'"),
    (_msg(2, tool_calls="x"), "messages[2].tool_calls", "expected a list of tool calls, got a string"),
    (_msg(2, tool_calls=["x"]), "messages[2].tool_calls[0]", "expected a tool call (an object), got a string"),
    (_msg(2, tool_calls=[{"id": "c1", "function": "get_order"}]), "messages[2].tool_calls[0].function",
     "expected an object with name and arguments, got a string"),
    (_msg(2, tool_calls=[{**_call(), "id": 5}]), "messages[2].tool_calls[0].id", "expected a string, got an integer"),
    (_msg(2, tool_calls=[_call(arguments=None)]), "messages[2].tool_calls[0].function.arguments",
     "expected a JSON string or an object, got null"),
    (_msg(2, tool_calls=[_call(arguments={"n": INF})]), "messages[2].tool_calls[0].function.arguments.n",
     "expected a finite number, got inf"),
    (_msg(2, tool_calls=None, function_call={"name": "get_order", "arguments": [1]}),
     "messages[2].function_call.arguments", "expected a JSON string or an object, got a list"),
    (_msg(2, usage="x"), "messages[2].usage", "expected an object, got a string"),
    (_msg(2, usage={"prompt_tokens": -1}), "messages[2].usage.prompt_tokens", "expected an integer >= 0, got -1"),
    (_msg(2, usage={"completion_tokens": 1.5}), "messages[2].usage.completion_tokens",
     "expected an integer, got a number"),
    (_msg(2, usage={"prompt_tokens": 1 << 70}), "messages[2].usage.prompt_tokens", "expected an integer >= 0, got"),
    (_msg(2, cost="0.1"), "messages[2].cost", "expected a number, got a string"),
    (_msg(2, cost=-1), "messages[2].cost", "expected a number >= 0, got -1"),
    (_msg(3, error="yes"), "messages[3].error", "expected true or false, got a string"),
    (_msg(3, tool_call_id=5), "messages[3].tool_call_id", "expected a string, got an integer"),
    (_msg(3, name=["get_order"]), "messages[3].name", "expected a string, got a list"),
]


@pytest.mark.parametrize("change, field, reason", OPENAI_CASES, ids=[c[1] + ":" + c[2][:24] for c in OPENAI_CASES])
def test_openai_jsonl_fields(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str,
                             reason: str) -> None:
    record = openai_record()
    change(record)
    path = _write(tmp_path, "openai-jsonl", [record])
    assert str(_refusal("openai-jsonl", path)).startswith(f"{path}: line 1.{field}: {reason}")


TAU2_CASES: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (lambda d: d.update(info="x"), "info", "expected an object, got a string"),
    (lambda d: d["info"].update(environment_info=[]), "info.environment_info", "expected an object, got a list"),
    (lambda d: d["info"]["environment_info"].update(domain_name=5), "info.environment_info.domain_name",
     "expected a string, got an integer"),
    (lambda d: d["info"]["environment_info"].update(policy=["p"]), "info.environment_info.policy",
     "expected a string, got a list"),
    (lambda d: d["info"]["agent_info"].update(llm=None) or d["info"].update(agent_info="grok"), "info.agent_info",
     "expected an object, got a string"),
    (lambda d: d.update(tasks={"id": "t1"}), "tasks", "expected a list of tasks, got an object"),
    (lambda d: d["tasks"].append("t2"), "tasks[1]", "expected a task (an object), got a string"),
    (lambda d: d["simulations"][0].update(id=["s1"]), "simulations[0].id", "expected a string or an integer, got a list"),
    (lambda d: d["simulations"][0].pop("task_id"), "simulations[0].task_id", "missing; expected a string or an integer"),
    (lambda d: d["simulations"][0].update(trial="0"), "simulations[0].trial", "expected an integer, got a string"),
    (lambda d: d["simulations"][0].update(termination_reason=5), "simulations[0].termination_reason",
     "expected a string, got an integer"),
    (lambda d: d["simulations"][0].update(start_time=NAN), "simulations[0].start_time",
     "expected a string, got nan"),
    (lambda d: d["simulations"][0].update(reward_info="1"), "simulations[0].reward_info",
     "expected an object, got a string"),
    (lambda d: d["simulations"][0]["reward_info"].update(reward=True), "simulations[0].reward_info.reward",
     "expected a number, got a boolean"),
    (lambda d: d["simulations"][0]["messages"][3].update(error="true"), "simulations[0].messages[3].error",
     "expected true or false, got a string"),
    (lambda d: d["simulations"][0]["messages"][3].update(requestor="bot"), "simulations[0].messages[3].requestor",
     "expected 'assistant' or 'user', got 'bot'"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(requestor=5),
     "simulations[0].messages[2].tool_calls[0].requestor",
     "expected 'assistant' (the call is on an assistant message), got an integer"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(requestor="bot"),
     "simulations[0].messages[2].tool_calls[0].requestor",
     "expected 'assistant' (the call is on an assistant message), got 'bot'"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(requestor="user"),
     "simulations[0].messages[2].tool_calls[0].requestor",
     "expected 'assistant' (the call is on an assistant message), got 'user'"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(arguments=5),
     "simulations[0].messages[2].tool_calls[0].arguments", "expected a JSON string or an object, got an integer"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(name=None),
     "simulations[0].messages[2].tool_calls[0].name", "a tool call needs a function name"),
    (lambda d: d["simulations"][0]["messages"][2]["tool_calls"][0].update(name=" "),
     "simulations[0].messages[2].tool_calls[0].name", "a tool call needs a function name (a non-empty string)"),
    (lambda d: d["simulations"][0]["messages"][2].update(cost=NAN), "simulations[0].messages[2].cost",
     "expected a finite number, got nan"),
]


@pytest.mark.parametrize("change, field, reason", TAU2_CASES, ids=[c[1] + ":" + c[2][:24] for c in TAU2_CASES])
def test_tau2_fields(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str, reason: str) -> None:
    data = tau2_results()
    change(data)
    path = _write(tmp_path / "sims", "tau2", data)
    assert str(_refusal("tau2", path)).startswith(f"{path}: {field}: {reason}")


TAU_BENCH_CASES: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (lambda r: r.pop("task_id"), "record 1.task_id", "missing; expected a string or an integer"),
    (lambda r: r.update(trial=True), "record 1.trial", "expected an integer, got a boolean"),
    (lambda r: r.update(reward="1.0"), "record 1.reward", "expected a number, got a string"),
    (lambda r: r.update(reward=True), "record 1.reward", "expected a number, got a boolean"),
    (lambda r: r.update(traj="x"), "record 1.traj", "expected a list of messages, got a string"),
    # A field left out is said as missing, not as a null that was written.
    (lambda r: r.pop("traj"), "record 1.traj", "missing; expected a list of messages"),
    (lambda r: r["traj"][0].pop("role"), "record 1.traj[0].role", "missing; expected one of ["),
    (lambda r: r["traj"][2]["tool_calls"][0].pop("function"), "record 1.traj[2].tool_calls[0].function",
     "missing; expected an object with name and arguments"),
    (lambda r: r["info"]["task"].update(user_id=5), "record 1.info.task.user_id", "expected a string, got an integer"),
    (lambda r: r["traj"][2]["tool_calls"][0]["function"].update(arguments=[]),
     "record 1.traj[2].tool_calls[0].function.arguments", "expected a JSON string or an object, got a list"),
]


@pytest.mark.parametrize("change, field, reason", TAU_BENCH_CASES,
                         ids=[c[1] + ":" + c[2][:24] for c in TAU_BENCH_CASES])
def test_tau_bench_fields(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str, reason: str) -> None:
    record = tau_bench_record()
    change(record)
    path = _write(tmp_path / "runs", "tau-bench", [record])
    assert str(_refusal("tau-bench", path)).startswith(f"{path}: {field}: {reason}")


def test_an_empty_tau_bench_file_and_messages_of_the_wrong_kind_are_said_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    assert str(_refusal("tau-bench", empty)) == f"{empty}: the file is empty; expected a JSON list of tau-bench records"
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": "hi"}\n')
    assert str(_refusal("openai-jsonl", chats)) == f"{chats}: line 1.messages: expected a list of messages, got a string"
    chats.write_text('{"metadata": {}}\n')
    assert str(_refusal("openai-jsonl", chats)) == f"{chats}: line 1.messages: missing; expected a list of messages"


TOOLBENCH_CASES: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (lambda d: d.update(win="yes"), "win", "expected true or false, got a string"),
    (lambda d: d.update(win=1), "win", "expected true or false, got an integer"),
    (lambda d: d["answer_generation"].update(function={"name": "f"}), "answer_generation.function",
     "expected a list of tools, got an object"),
    (lambda d: d["answer_generation"]["function"][0].update(parameters=[]), "answer_generation.function[0].parameters",
     "expected a JSON Schema object, got a list"),
    (lambda d: d["answer_generation"].update(query=5), "answer_generation.query", "expected a string, got an integer"),
    (lambda d: d["answer_generation"].update(valid_data="false"), "answer_generation.valid_data",
     "expected true or false, got a string"),
    (lambda d: d["answer_generation"].update(finish_type=["give_answer"]), "answer_generation.finish_type",
     "expected a string, got a list"),
    (lambda d: d["answer_generation"]["train_messages"][-1][2].update(function_call="get_order"),
     "answer_generation.train_messages[0][2].function_call",
     "expected an object with name and arguments, got a string"),
]


@pytest.mark.parametrize("change, field, reason", TOOLBENCH_CASES,
                         ids=[c[1] + ":" + c[2][:24] for c in TOOLBENCH_CASES])
def test_toolbench_fields(tmp_path: Path, change: Callable[[dict[str, Any]], None], field: str, reason: str) -> None:
    data = toolbench_answer()
    change(data)
    path = _write(tmp_path / "G1_answer", "toolbench", data, name="7_ChatGPT_DFS_woFilter_w2.json")
    assert str(_refusal("toolbench", path)).startswith(f"{path}: {field}: {reason}")


def test_toolbench_names_the_message_path_it_reads(tmp_path: Path) -> None:
    """The last of ``train_messages`` is read, and named by its index."""
    data = toolbench_answer()
    path_messages = data["answer_generation"]["train_messages"][0]
    broken = copy.deepcopy(path_messages)
    broken[2]["function_call"] = "get_order"
    data["answer_generation"]["train_messages"] = [path_messages[:2], broken]
    path = _write(tmp_path / "G1_answer", "toolbench", data, name="7_ChatGPT_DFS_woFilter_w2.json")
    assert str(_refusal("toolbench", path)) == (
        f"{path}: answer_generation.train_messages[1][2].function_call: "
        "expected an object with name and arguments, got a string")


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    good = json.dumps(openai_record()).encode()
    path.write_bytes(good + b"\n" + good.replace(b'"get A"', b'"caf\xe9"') + b"\n")
    error = _refusal("openai-jsonl", path)
    column = good.replace(b'"get A"', b'"caf\xe9"').index(b"\xe9") + 1
    assert (error.file, error.record) == (str(path), "line 2")
    assert error.reason == f"not UTF-8 text (byte 0xe9 at column {column}); expected JSON lines in UTF-8"


def test_a_line_separator_inside_a_string_does_not_cut_the_line(tmp_path: Path) -> None:
    """JSON strings may hold U+2028 and U+2029 as they are; only "\\n" ends a line."""
    record = openai_record()
    record["messages"][1]["content"] = "get\u2028A\u2029now\x85"
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    ((_, (conv,)),) = read_conversations("openai-jsonl", [path])
    assert conv.messages[1].content == "get\u2028A\u2029now\x85"


@pytest.mark.parametrize("catalogue, field, reason", [
    ({**TOOLS, "tool_types": "read"}, "tool_types", "expected an object mapping tool names to read, write or generic"),
    ({**TOOLS, "tool_types": {"get_order": 1}}, "tool_types.get_order", "expected read, write or generic, got an integer"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": INF}}}]},
     "tools[0].function.parameters.default", "expected a finite number, got inf"),
    ([{"name": "f", "parameters": 3}], "[0].parameters", "expected a JSON Schema object, got an integer"),
])
def test_tool_catalogue_fields(tmp_path: Path, catalogue: Any, field: str, reason: str) -> None:
    tools = tmp_path / "catalogue.json"
    tools.write_text(json.dumps(catalogue))
    path = _write(tmp_path / "in", "openai-jsonl", [{**openai_record(), "tools": None}])
    with pytest.raises(ImportInputError) as caught:
        read_conversations("openai-jsonl", [path], tools=tools)
    assert str(caught.value).startswith(f"{tools}: {field}: {reason}")


def test_a_file_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    folder = _write(tmp_path / "in", "openai-jsonl", [openai_record()]).parent
    os.rename(folder / "chats.jsonl", os.fsdecode(os.fsencode(folder) + b"/chats-\xff.jsonl"))
    error = _refusal("openai-jsonl", folder)
    assert error.record is None and "name is not valid UTF-8" in error.reason


def test_a_value_the_checks_missed_is_still_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop: should a reader let through a value JSON cannot carry,
    the writer's CanonicalJSONError becomes bad input naming the file and
    record, and nothing is recorded."""
    import dataclasses

    from loopledger.datasets import _import_run

    reader, patterns = _import_run.FORMATS["openai-jsonl"]

    def leaky(path: Path, tools: Path | None = None, name: str | None = None) -> list[Any]:
        return [dataclasses.replace(conv, metadata={"score": NAN}) for conv in reader(path, tools, name)]

    home = _seeded_home(tmp_path)
    before = _files(home)
    monkeypatch.setitem(_import_run.FORMATS, "openai-jsonl", (leaky, patterns))
    record = openai_record()
    record["metadata"]["id"] = "conv-2"  # not the run already there
    path = _write(tmp_path / "in", "openai-jsonl", [record])
    with pytest.raises(ImportInputError) as caught:
        import_traces("openai-jsonl", [path], home=home)
    assert (caught.value.file, caught.value.record) == (str(path), "line 1")
    assert "$.imported.metadata.score" in caught.value.reason and "nan" in caught.value.reason
    assert _files(home) == before


# --- what real data holds is still read -------------------------------------------------


def test_lenient_where_the_sources_are(tmp_path: Path) -> None:
    """Integer ids, content parts, null usage and cost, and arguments that are
    not a JSON object (NaN is not JSON, a key given twice has two readings:
    the text is kept as the model wrote it)."""
    record = openai_record()
    record["metadata"].update(id=17, task_id=4, reward=0)
    record["messages"][1]["content"] = [{"type": "text", "text": "get "}, {"type": "image_url"}, {"text": "A"}]
    record["messages"][2].update(usage=None, cost=None,
                                 tool_calls=[_call(arguments='{"order_id": NaN}'), {**_call(arguments="5"), "id": "c2"},
                                             {**_call(arguments='{"order_id": "A", "order_id": "B"}'), "id": "c3"}])
    (conv,) = read_conversations("openai-jsonl", [_write(tmp_path, "openai-jsonl", [record])])[0][1]
    assert (conv.source_id, conv.task_id, conv.reward) == ("17", "4", 0.0)
    assert conv.messages[1].content == "get [image]A"  # the image is not text, but it was there
    assert [(c.arguments, c.raw_arguments) for c in conv.messages[2].tool_calls] == [
        (None, '{"order_id": NaN}'), (None, "5"), (None, '{"order_id": "A", "order_id": "B"}')]  # a key twice: two readings
    assert (conv.messages[2].tokens_in, conv.messages[2].cost_usd) == (None, None)  # unknown, not free
    home = tmp_path / "home"
    assert import_traces("openai-jsonl", [_write(tmp_path, "openai-jsonl", [record])], home=home).runs == 1


def test_each_message_enters_the_contexts_once(tmp_path: Path) -> None:
    """The messages before the first answer were in the first context twice
    (system, user, system, user)."""
    home = tmp_path / "home"
    import_traces("openai-jsonl", [_write(tmp_path, "openai-jsonl", [openai_record()])], home=home)
    contexts = {a["artifact_id"]: json.loads(a["body"]) for a in table(home, "artifacts") if a["kind"] == "context"}
    first, second = (contexts[c["context_artifact_id"]] for c in sorted(table(home, "candidates"),
                                                                        key=lambda c: c["step"]))
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert second["previous_context"] in contexts
    assert [m["role"] for m in second["messages"]] == ["assistant", "tool"]


def test_a_named_source_is_the_tenant_and_the_format_stays_the_importers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    import_traces("openai-jsonl", [_write(tmp_path, "openai-jsonl", [openai_record()])], home=home)  # source "bot"
    (run,) = table(home, "runs")
    assert run["tenant"] == "bot" and run["run_id"].startswith("bot-")
    assert json.loads(run["spec_json"])["imported"]["format"] == "openai-jsonl"


# --- files that break the reader itself ------------------------------------------------


@pytest.mark.parametrize("fmt", ["openai-jsonl", "tau-bench", "tau2", "toolbench"])
def test_a_gzip_file_whose_data_is_broken_is_bad_input(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "in" / "broken.json.gz"
    path.parent.mkdir()
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03this is not deflate data at all")
    line = _refused(tmp_path, fmt, path)
    assert line.startswith(f"loopledger: bad input: {path}: cannot read: a broken gzip stream (")
    assert line.endswith("expected a whole gzip file, or the file uncompressed")


def test_json_nested_beyond_the_parser_is_bad_input(tmp_path: Path) -> None:
    deep = "[" * 3000 + "]" * 3000
    record = json.dumps(openai_record()).replace('"reward": 1', f'"reward": 1, "k": {deep}', 1)
    chats = tmp_path / "in" / "deep.jsonl"
    chats.parent.mkdir()
    chats.write_text(record + "\n")
    assert _refused(tmp_path, "openai-jsonl", chats).endswith(
        f"{chats}: line 1: nested too deeply to read; expected JSON nested at most 200 levels, as a trace holds it")
    tools = tmp_path / "deep-tools.json"
    tools.write_text(deep)
    assert "deep-tools.json: nested too deeply to read" in _refused(
        tmp_path, "openai-jsonl", _write(tmp_path / "ok", "openai-jsonl", [openai_record()]), "--tools", str(tools))


def test_a_runs_usage_and_cost_must_add_up_to_what_a_trace_holds(tmp_path: Path) -> None:
    half = 1 << 62  # each message's count is fine; the run's total is not
    record = openai_record()
    record["messages"][2]["usage"] = {"prompt_tokens": half, "completion_tokens": 1}
    record["messages"][4]["usage"] = {"prompt_tokens": half, "completion_tokens": 1}
    line = _refused(tmp_path / "a", "openai-jsonl", _write(tmp_path / "a" / "in", "openai-jsonl", [record]))
    assert f"line 1: the run's prompt tokens add up to {2 * half}, beyond what a trace holds" in line
    record = openai_record()
    record["messages"][2]["cost"] = record["messages"][4]["cost"] = 1e308
    line = _refused(tmp_path / "b", "openai-jsonl", _write(tmp_path / "b" / "in", "openai-jsonl", [record]))
    assert "line 1: the run's costs add up past the largest number a trace holds" in line


def test_a_folder_searched_names_what_it_cannot_read(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write(folder, "openai-jsonl", [openai_record()])
    (folder / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert _refused(tmp_path / "a", "openai-jsonl", folder).endswith(
        f"{folder / 'gone.jsonl'}: a symbolic link to no file or folder")
    (folder / "gone.jsonl").unlink()
    # A hidden folder is never read; a visible one that cannot be is named.
    (folder / ".cache").mkdir()
    (folder / "more").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        real_scandir = os.scandir

        def scandir(path: Any = ".") -> Any:
            if Path(path).name in (".cache", "more"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_scandir(path)

        patch.setattr(os, "scandir", scandir)
        with pytest.raises(ImportInputError, match=r"more: cannot read: Permission denied$") as caught:
            import_traces("openai-jsonl", [folder], home=tmp_path / "home")
        assert ".cache" not in str(caught.value)


def test_a_replay_says_which_candidates_have_no_recorded_decisions(tmp_path: Path) -> None:
    """Imported without --decide, a run's candidates were never judged: the
    replay compares them with nothing (no candidate flip; the reward's label
    classifies no diff) and says so, with the two ways to get a baseline."""
    import xml.etree.ElementTree as ET

    from loopledger.replay import replay
    from loopledger.replay._report import junit, markdown

    path = _write(tmp_path / "in", "openai-jsonl", [openai_record()])
    plain, decided = tmp_path / "plain", tmp_path / "decided"
    import_traces("openai-jsonl", [path], home=plain)
    import_traces("openai-jsonl", [path], home=decided, decide="default")
    bare = replay(plain / "traces", "default")
    assert bare.summary.not_recorded == bare.summary.candidates_rerun == 2
    assert "2 candidate(s) in 1 run(s) have no recorded decisions" in markdown(bare, "regressions")
    assert "--decide SUITE" in markdown(bare, "regressions")
    # The JUnit report says it too: as a property, and in the run's output.
    report = ET.fromstring(junit(bare, "regressions"))
    assert {p.get("name"): p.get("value") for p in report.iter("property")}["not_recorded"] == "2"
    (out,) = [e.text for e in report.iter("system-out")]
    assert "2 candidate(s) have no recorded decisions" in out
    judged = replay(decided / "traces", "default")
    assert judged.summary.not_recorded == 0 and judged.summary.candidates_rerun == 2
    assert "no recorded decisions" not in markdown(judged, "regressions")
    assert "no recorded decisions" not in junit(judged, "regressions")


def test_a_replay_says_when_the_recorded_decisions_come_from_several_suites(tmp_path: Path) -> None:
    """Runs imported with --decide default and others with --decide strict:
    the recorded side is two suites, compared alike, and the reports say so."""
    from loopledger.replay import replay
    from loopledger.replay._report import markdown

    first = openai_record()
    second = openai_record()
    second["metadata"]["id"] = "conv-2"
    home = tmp_path / "home"
    import_traces("openai-jsonl", [_write(tmp_path / "a", "openai-jsonl", [first])], home=home, decide="default")
    import_traces("openai-jsonl", [_write(tmp_path / "b", "openai-jsonl", [second])], home=home, decide="strict")
    result = replay(home / "traces", "default")
    assert result.summary.baseline_suites == 2
    assert sorted(len(r.baseline_suites) for r in result.runs.values()) == [1, 1]
    assert "The recorded decisions were made under 2 suite versions" in markdown(result, "regressions")
    # One suite recorded them all: nothing to say.
    alone = tmp_path / "alone"
    import_traces("openai-jsonl", [_write(tmp_path / "c", "openai-jsonl", [first])], home=alone, decide="default")
    single = replay(alone / "traces", "default")
    assert single.summary.baseline_suites == 1 and "suite versions" not in markdown(single, "regressions")
    # Against an earlier replay (one suite): not counted.
    earlier = replay(home / "traces", "default", write_to=home / "replays")
    against = replay(home / "traces", "strict", baseline=earlier.replay_id, write_to=home / "replays")
    assert against.summary.baseline_suites == 0 and "suite versions" not in markdown(against, "regressions")
