"""Quirks and bad input, on small files written by the tests (no external data needed)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import ImportInputError, error_code, import_traces

TOOLS = {"tools": [
    {"type": "function", "function": {"name": "get_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "cancel_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
], "tool_types": {"get_order": "read", "cancel_order": "write"}}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _tau_bench_file(tmp: Path) -> Path:
    """Two calls reuse the id ``call_1``: the first succeeds, the second fails."""
    traj = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "cancel order A"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "get_order", {"order_id": "A"})]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_order", "content": '{"status": "paid"}'},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "cancel_order", {"order_id": "A"})]},
        {"role": "tool", "tool_call_id": "call_1", "name": "cancel_order", "content": "Error: order A not found"},
        {"role": "assistant", "content": "I could not cancel it."},
        {"role": "user", "content": "ok ###STOP###"},
    ]
    (tmp / "tools").mkdir()
    (tmp / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    (tmp / "runs").mkdir()
    path = tmp / "runs" / "gpt-4o-shop.json"
    path.write_text(json.dumps([{"task_id": 7, "trial": 0, "reward": 0.0, "info": {}, "traj": traj}]))
    return path


def test_reused_call_id_is_matched_by_position(tmp_path: Path) -> None:
    path = _tau_bench_file(tmp_path)
    result = import_traces("tau-bench", [path], home=tmp_path / "home")
    assert result.runs == 1
    ops = sorted(table(tmp_path / "home", "operations"), key=lambda o: o["step"])
    assert [(o["tool"], o["outcome"]) for o in ops] == [("get_order", "success"), ("cancel_order", "validation_failed")]
    events = [json.loads(e["payload_json"]) for e in table(tmp_path / "home", "events") if e["kind"] == "operation_result"]
    assert [e["error_code"] for e in events] == [None, "NOT_FOUND"]
    assert events[0]["evidence"] == [{"kind": "get_order", "subject": "A"}]
    (run,) = table(tmp_path / "home", "runs")
    assert (run["status"], run["reason"], run["reward"], run["tool_calls"]) == ("SUCCEEDED", "completed", 0.0, 2)
    (label,) = table(tmp_path / "home", "labels")
    assert (label["expected_verdict"], label["source"], label["step"]) == ("reject", "import", 3)


def test_the_data_folder_itself_can_be_given_its_catalogues_are_not_read_as_traces(tmp_path: Path) -> None:
    """tau-bench's layout is ``tools/`` beside the trajectories' folder: the
    folder above both is the natural thing to give (it failed on
    ``tools/shop_tools.json`` as a trajectory file)."""
    data = tmp_path / "data"
    data.mkdir()
    _tau_bench_file(data)
    result = import_traces("tau-bench", [data], home=tmp_path / "home")
    assert result.runs == 1 and [Path(f.path).name for f in result.files] == ["gpt-4o-shop.json"]
    # A catalogue named on its own is still read as what it was given as.
    with pytest.raises(ImportInputError, match="shop_tools.json"):
        import_traces("tau-bench", [data / "tools" / "shop_tools.json"], home=tmp_path / "other")


@pytest.mark.parametrize("given", ["gpt-4o-shop.json", "."])
def test_a_path_relative_to_the_working_folder_finds_its_catalogue(tmp_path: Path, monkeypatch,
                                                                   given: str) -> None:
    path = _tau_bench_file(tmp_path)
    monkeypatch.chdir(path.parent)
    result = import_traces("tau-bench", [Path(given)], home=tmp_path / "home")
    assert result.runs == 1


def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    path = _tau_bench_file(tmp_path)
    import_traces("tau-bench", [path], home=tmp_path / "home")
    again = import_traces("tau-bench", [path], home=tmp_path / "home")
    assert (again.runs, again.skipped) == (0, 1)
    assert len(table(tmp_path / "home", "runs")) == 1
    assert len(table(tmp_path / "home", "labels")) == 1


def _jsonl(tmp: Path, *records: dict[str, Any], name: str = "chats.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _chat(question: str, reward: float, **meta: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "done"}],
            "metadata": {"reward": reward, **meta}}


def test_two_runs_that_share_a_file_name_and_an_id_are_both_kept(tmp_path: Path) -> None:
    """Two experiments' results are often named alike (gpt-4o-airline.json):
    a run id that also holds the record's content keeps both, and importing
    either again still adds nothing."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _jsonl(tmp_path / "a", _chat("alpha", 1, id="same"))
    second = _jsonl(tmp_path / "b", _chat("beta", 0, id="same"))
    home = tmp_path / "home"
    done = import_traces("openai-jsonl", [first, second], home=home)
    assert (done.runs, done.skipped) == (2, 0)
    assert sorted(r["reward"] for r in table(home, "runs")) == [0, 1]
    again = import_traces("openai-jsonl", [second, first], home=home)
    assert (again.runs, again.skipped) == (0, 2)


@pytest.mark.parametrize("form", [0, 1], ids=["file-position-content", "file-position"])
def test_runs_imported_by_earlier_versions_are_not_imported_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  form: int) -> None:
    """Earlier versions made run ids from the file's name and the record's
    position (and later its content too): a home holding such ids still
    knows the runs when the same file is imported again."""
    from loopledger.datasets._import_model import Conversation

    path = _tau_bench_file(tmp_path)
    with monkeypatch.context() as patched:  # an import made by the earlier form of run ids
        patched.setattr(Conversation, "run_id", property(lambda conv: conv.legacy_run_ids[form]))
        assert import_traces("tau-bench", [path], home=tmp_path / "home").runs == 1
    again = import_traces("tau-bench", [path], home=tmp_path / "home")
    assert (again.runs, again.skipped) == (0, 1)
    assert len(table(tmp_path / "home", "runs")) == 1


def test_a_record_given_twice_in_one_file_is_imported_once(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, _chat("alpha", 1, id="x"), _chat("alpha", 1, id="x"))
    done = import_traces("openai-jsonl", [path], home=tmp_path / "home")
    assert (done.runs, done.skipped) == (1, 1)
    # Said as what it is in a home that had none of it before.
    said = cli("import", "openai-jsonl", str(path), "--home", str(tmp_path / "fresh")).stdout
    assert said.startswith(f"{path}: 1 runs (0 already imported, 1 given twice)")
    # ... and with --decide, it is no run that keeps the decisions of an earlier import.
    decided = cli("import", "openai-jsonl", str(path), "--home", str(tmp_path / "decided"), "--decide", "default")
    assert decided.returncode == 0 and "already imported keep" not in decided.stdout, decided.stdout
    again = cli("import", "openai-jsonl", str(path), "--home", str(tmp_path / "fresh")).stdout
    assert again.startswith(f"{path}: 0 runs (2 already imported)"), again


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_chat("alpha", 1)).encode() + b"\n")
    assert import_traces("openai-jsonl", [path], home=tmp_path / "home").runs == 1
    tau = _tau_bench_file(tmp_path)
    tau.write_bytes(b"\xef\xbb\xbf" + tau.read_bytes())
    assert import_traces("tau-bench", [tau], home=tmp_path / "home2").runs == 1


@pytest.mark.parametrize("source", ["", "a/b", "ten ant", "x\u0000y"])
def test_a_source_that_cannot_name_a_tenant_is_refused(tmp_path: Path, source: str) -> None:
    path = _jsonl(tmp_path, _chat("alpha", 1, source=source))
    err = _bad(tmp_path, "openai-jsonl", path)
    assert "line 1.metadata.source" in err and len(err.strip().splitlines()) == 1
    assert _runs_recorded(tmp_path / "home") == 0


def test_parallel_calls_are_matched_by_id_whatever_their_order(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "check A and B"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_order", {"order_id": "A"}),
                                                              _call("c2", "get_order", {"order_id": "B"})]},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: order B not found"},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "paid"}'},
        {"role": "assistant", "content": "A is paid; B does not exist."},
    ]
    path = _jsonl(tmp_path, {"messages": messages, "tools": TOOLS["tools"],
                             "metadata": {"id": "x1", "model": "gpt-4.1", "reward": 1}})
    import_traces("openai-jsonl", [path], home=tmp_path / "home")
    ops = {o["call_id"]: o for o in table(tmp_path / "home", "operations")}
    assert (ops["c1"]["outcome"], ops["c2"]["outcome"]) == ("success", "validation_failed")
    assert ops["c1"]["step"] == ops["c2"]["step"] == 1
    (run,) = table(tmp_path / "home", "runs")
    assert (run["model_route"], run["reward"], run["tenant"]) == ("gpt-4.1", 1.0, "openai-jsonl")
    (candidate, final) = sorted(table(tmp_path / "home", "candidates"), key=lambda c: c["step"])
    items = json.loads(candidate["items_json"])
    assert [i["call_id"] for i in items] == ["c1", "c2"] and candidate["finish_reason"] == "tool_calls"
    assert json.loads(final["items_json"]) == [{"type": "text", "text": "A is paid; B does not exist."}]


def test_a_result_that_names_its_call_keeps_it_beside_one_that_names_none(tmp_path: Path) -> None:
    """One result with an id the message never issued made every result go
    by position: the failure of the call to B was recorded as A's."""
    messages = [
        {"role": "user", "content": "check A and B"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_order", {"order_id": "A"}),
                                                              _call("c2", "get_order", {"order_id": "B"})]},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: order B not found"},
        {"role": "tool", "tool_call_id": "zzz", "content": '{"status": "paid"}'},
        {"role": "assistant", "content": "A is paid; B does not exist."},
    ]
    path = _jsonl(tmp_path, {"messages": messages, "tools": TOOLS["tools"], "metadata": {"id": "x2"}})
    import_traces("openai-jsonl", [path], home=tmp_path / "home")
    ops = {o["call_id"]: o for o in table(tmp_path / "home", "operations")}
    # c2 keeps the result that names it; the one naming no call goes to the call left.
    assert (ops["c1"]["outcome"], ops["c2"]["outcome"]) == ("success", "validation_failed")


def test_an_empty_file_of_lines_holds_no_runs_and_does_not_stop_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    (folder / "b.jsonl").write_text("")
    (folder / "c.jsonl").write_text("\n  \n")
    result = import_traces("openai-jsonl", [folder], home=tmp_path / "home")
    assert result.runs == 1 and [f.runs for f in result.files] == [1, 0, 0]
    # Lines that are there but hold no run of the format are still refused.
    (folder / "d.jsonl").write_text("[]\n")
    with pytest.raises(ImportInputError, match="d.jsonl"):
        import_traces("openai-jsonl", [folder], home=tmp_path / "other")


def test_legacy_function_call_shape(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "You can call functions."},
        {"role": "user", "content": "get A"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_order", "arguments": "{\"order_id\": \"A\"}"}},
        {"role": "function", "name": "get_order", "content": "{\"error\": \"Timeout error...\", \"response\": \"\"}"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_order", "arguments": "{\"order_id\": "}},
        {"role": "function", "name": "get_order", "content": "{\"error\": \"\", \"response\": \"paid\"}"},
        {"role": "assistant", "content": "A is paid."},
    ]
    path = _jsonl(tmp_path, {"messages": messages, "functions": [t["function"] for t in TOOLS["tools"]]})
    import_traces("openai-jsonl", [path], home=tmp_path / "home")
    ops = sorted(table(tmp_path / "home", "operations"), key=lambda o: o["step"])
    assert [(o["tool"], o["outcome"]) for o in ops] == [("get_order", "validation_failed"), ("get_order", "success")]
    results = [json.loads(e["payload_json"]) for e in table(tmp_path / "home", "events") if e["kind"] == "operation_result"]
    assert results[0]["error_code"] == "TIMEOUT"
    second = sorted(table(tmp_path / "home", "candidates"), key=lambda c: c["step"])[1]
    (item,) = json.loads(second["items_json"])
    assert item["raw_arguments"] == "{\"order_id\": " and "arguments" not in item


def test_tau2_user_tool_calls_are_kept_and_marked(tmp_path: Path) -> None:
    def msg(role: str, **kw: Any) -> dict[str, Any]:
        return {"role": role, "content": kw.pop("content", ""), "turn_idx": 0, "timestamp": None, **kw}

    sim = {"id": "s1", "task_id": "t1", "trial": 0, "termination_reason": "user_stop", "reward_info": {"reward": 1.0},
           "messages": [
               msg("assistant", content="Hi!"),
               msg("user", content="my phone has no signal"),
               msg("assistant", tool_calls=[{"id": "a1", "name": "get_order", "arguments": {"order_id": "A"},
                                             "requestor": "assistant"}]),
               msg("tool", id="a1", content="{}", requestor="assistant", error=False),
               msg("assistant", content="Please toggle airplane mode."),
               msg("user", tool_calls=[{"id": "u1", "name": "toggle_airplane_mode", "arguments": {},
                                        "requestor": "user"}]),
               msg("tool", id="u1", content="Airplane mode off", requestor="user", error=False),
               msg("user", content="done, it works"),
               msg("assistant", content="Great."),
           ]}
    data = {"info": {"environment_info": {"domain_name": "shop", "policy": "be nice"},
                     "agent_info": {"llm": "xai/grok-3"}}, "tasks": [{"id": "t1"}], "simulations": [sim]}
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "shop_tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "sims").mkdir()
    path = tmp_path / "sims" / "run.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    result = import_traces("tau2", [path], home=tmp_path / "home")
    assert result.files[0].user_tool_calls == 1
    assert [o["tool"] for o in table(tmp_path / "home", "operations")] == ["get_order"]
    (event,) = [json.loads(e["payload_json"]) for e in table(tmp_path / "home", "events") if e["kind"] == "user_tool_call"]
    assert (event["requestor"], event["tool"], event["outcome"]) == ("user", "toggle_airplane_mode", "success")
    (run,) = table(tmp_path / "home", "runs")
    assert (run["model_route"], run["task_id"], run["steps"]) == ("xai/grok-3", "shop/t1", 4)


@pytest.mark.parametrize("text, code", [
    ("Error: flight HAT001 not available on date 2024-05-01", "UNAVAILABLE"),
    ("Error: payment amount does not add up, total price is 300", "PAYMENT_MISMATCH"),
    ("Error: gift card balance is not enough", "INSUFFICIENT_FUNDS"),
    ("Error: Reservation ABC123 not found", "NOT_FOUND"),
    ("Error: certificate cannot be used to update reservation", "NOT_PERMITTED"),
    ("Error: Tool foo not found", "UNKNOWN_TOOL"),
    ("Error: 1 validation error for BookReservation", "INVALID_ARGUMENTS"),
    ("Error: something odd", "TOOL_ERROR"),
])
def test_error_codes(text: str, code: str) -> None:
    assert error_code(text) == code


# --- bad input -----------------------------------------------------------------------


def _bad(tmp: Path, fmt: str, *paths: Path, extra: tuple[str, ...] = ()) -> str:
    result = cli("import", fmt, *map(str, paths), "--home", str(tmp / "home"), *extra)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def _runs_recorded(home: Path) -> int:
    """Runs in the trace tables (where imports go) and in the journal."""
    journal = home / "journal.sqlite"
    in_journal = 0
    if journal.exists():
        with sqlite3.connect(journal) as conn:
            in_journal = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return len(table(home, "runs")) + in_journal


def test_another_format_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = _tau_bench_file(tmp_path)
    err = _bad(tmp_path, "tau2", path)
    assert str(path) in err and "tau2 Results" in err
    assert _runs_recorded(tmp_path / "home") == 0


def test_truncated_gzip_is_refused(tmp_path: Path) -> None:
    whole = gzip.compress(json.dumps({"simulations": []}).encode() * 50)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    err = _bad(tmp_path, "tau2", path)
    assert str(path) in err


def test_unknown_role_names_the_line_and_record(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}
    path = _jsonl(tmp_path, good, bad)
    err = _bad(tmp_path, "openai-jsonl", path)
    assert "line 2" in err and "messages[1]" in err and "'robot'" in err


def test_a_bad_file_among_good_ones_writes_nothing(tmp_path: Path) -> None:
    good = _jsonl(tmp_path, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
                  name="a.jsonl")
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assis')
    err = _bad(tmp_path, "openai-jsonl", good, bad)
    assert str(bad) in err and "line 1" in err
    assert _runs_recorded(tmp_path / "home") == 0


def test_a_failure_while_writing_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopledger.datasets import _import_writer

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    path = _jsonl(tmp_path, {**chat, "metadata": {"id": "1"}}, {**chat, "metadata": {"id": "2"}})
    original = _import_writer.RunWriter._finish
    calls = {"n": 0}

    def failing(self: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        original(self)

    monkeypatch.setattr(_import_writer.RunWriter, "_finish", failing)
    with pytest.raises(OSError):
        import_traces("openai-jsonl", [path], home=tmp_path / "home")
    assert _runs_recorded(tmp_path / "home") == 0
    monkeypatch.setattr(_import_writer.RunWriter, "_finish", original)
    assert import_traces("openai-jsonl", [path], home=tmp_path / "home").runs == 2


def test_unknown_format_and_missing_tools(tmp_path: Path) -> None:
    with pytest.raises(ImportInputError, match="unknown format"):
        import_traces("csv", [tmp_path], home=tmp_path / "home")
    path = _tau_bench_file(tmp_path)
    (tmp_path / "tools" / "shop_tools.json").unlink()
    err = _bad(tmp_path, "tau-bench", path)
    assert "no tool catalogue" in err and "--tools" in err


def test_a_call_without_a_result_is_counted_apart_from_failures(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "where are orders A and B?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_order", {"order_id": "A"}),
                                                                _call("c2", "get_order", {"order_id": "B"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: order A not found"},
        {"role": "assistant", "content": "A does not exist; B I could not check."},
    ]
    path = _jsonl(tmp_path, {"messages": messages, "tools": TOOLS["tools"]})
    (imported,) = import_traces("openai-jsonl", [path], home=tmp_path / "home").files
    assert (imported.operations, imported.failed_operations, imported.unanswered_operations) == (2, 1, 1)
    outcomes = sorted(o["outcome"] for o in table(tmp_path / "home", "operations"))
    assert outcomes == ["unknown_outcome", "validation_failed"]


def test_a_gzip_file_of_json_lines_is_read(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl.gz"
    path.write_bytes(gzip.compress((json.dumps(_chat("hi", 1)) + "\n").encode()))
    done = import_traces("openai-jsonl", [path], home=tmp_path / "home")
    assert done.runs == 1
    (run,) = table(tmp_path / "home", "runs")
    assert run["task_id"] == "chats/1"  # the file's stem: neither .jsonl nor .gz


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_value_nested_too_deeply_is_refused_where_it_is(tmp_path: Path) -> None:
    """It was blamed on the trace file when it was the --tools file's, and
    named no line or field ("$: nested too deeply")."""
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    good = _jsonl(tmp_path, chat)
    tools = tmp_path / "deep_tools.json"
    tools.write_text(json.dumps({"tools": [{"type": "function", "function": {
        "name": "get_order", "parameters": {"type": "object", "default": _nested(300)}}}]}))
    with pytest.raises(ImportInputError) as refused:
        import_traces("openai-jsonl", [good], home=tmp_path / "home", tools=tools)
    assert str(refused.value).startswith(f"{tools}: tools[0].function.parameters: nested more than 200 levels deep")
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps({**chat, "metadata": {"id": "d", "extra": _nested(300)}}) + "\n")
    with pytest.raises(ImportInputError) as refused:
        import_traces("openai-jsonl", [deep], home=tmp_path / "home")
    assert str(refused.value).startswith(f"{deep}: line 1.metadata.extra: nested more than 200 levels deep")
    assert not (tmp_path / "home").exists()


def _line(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}) + "\n"


def test_default_task_ids_start_with_the_files_path_below_the_folder_given(tmp_path: Path) -> None:
    """Two days' ``chats.jsonl`` are different tasks: line 1 of each is not one task."""
    days = tmp_path / "days"
    for day in ("d1", "d2"):
        (days / day).mkdir(parents=True)
        (days / day / "chats.jsonl").write_text(_line(f"question of {day}"))
    (days / "chats.jsonl.gz").write_bytes(gzip.compress(_line("top").encode()))
    import_traces("openai-jsonl", [days], home=tmp_path / "home")
    assert sorted(r["task_id"] for r in table(tmp_path / "home", "runs")) == ["chats/1", "d1/chats/1", "d2/chats/1"]
    # A file named on its own: its own name, as before.
    (tmp_path / "solo.jsonl").write_text(_line("alone"))
    import_traces("openai-jsonl", [tmp_path / "solo.jsonl"], home=tmp_path / "solo")
    assert [r["task_id"] for r in table(tmp_path / "solo", "runs")] == ["solo/1"]
    # Two files of one name in different folders, named directly or found in
    # two folders given: the folders that tell them apart lead their task ids.
    for week in ("w1", "w2"):
        (tmp_path / week / "days" / "d1").mkdir(parents=True)
        (tmp_path / week / "days" / "d1" / "chats.jsonl").write_text(_line(f"question of {week}"))
    named = [tmp_path / week / "days" / "d1" / "chats.jsonl" for week in ("w1", "w2")]
    import_traces("openai-jsonl", named, home=tmp_path / "named")
    assert sorted(r["task_id"] for r in table(tmp_path / "named", "runs")) == ["w1/days/d1/chats/1", "w2/days/d1/chats/1"]
    import_traces("openai-jsonl", [tmp_path / week / "days" for week in ("w1", "w2")], home=tmp_path / "folders")
    assert sorted(r["task_id"] for r in table(tmp_path / "folders", "runs")) == ["w1/days/d1/chats/1", "w2/days/d1/chats/1"]


def test_an_import_that_finds_no_run_leaves_every_table_readable(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    home = tmp_path / "home"
    done = cli("import", "openai-jsonl", str(empty), "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert "these files hold no run" in done.stdout and "next: loopledger replay" not in done.stdout
    from loopledger.engine import TABLES

    for name in TABLES:
        assert list((home / "traces" / name).glob("*.parquet")), name
    # So a replay says what is wrong: there is no run, not a missing table.
    replayed = cli("replay", "--suite", "default", "--home", str(home))
    assert replayed.returncode == 2 and "no run recorded" in replayed.stderr, replayed.stderr


def test_a_tau2_results_file_without_simulations_holds_no_run(tmp_path: Path) -> None:
    """tau2 writes such files (a run stopped before its first simulation):
    one in a folder does not stop the others."""
    folder = tmp_path / "sims"
    folder.mkdir()
    info = {"environment_info": {"domain_name": "shop", "policy": "p"}, "agent_info": {"llm": "m"}}
    (folder / "a.json").write_text(json.dumps({"info": info, "tasks": [], "simulations": []}))
    result = import_traces("tau2", [folder], home=tmp_path / "home")
    assert (result.runs, [f.runs for f in result.files]) == (0, [0])
    # Without the 'info' that makes it tau2's, an empty list is still no sign of the format.
    (folder / "b.json").write_text(json.dumps({"simulations": []}))
    with pytest.raises(ImportInputError, match="b.json.*no runs in this file"):
        import_traces("tau2", [folder], home=tmp_path / "other")


def test_decide_says_that_runs_already_imported_keep_their_decisions(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(_line("one"))
    home = str(tmp_path / "home")
    assert cli("import", "openai-jsonl", str(path), "--home", home).returncode == 0
    again = cli("import", "openai-jsonl", str(path), "--home", home, "--decide", "default")
    assert again.returncode == 0, again.stderr
    assert "runs skipped as already imported keep the decisions they were imported with" in again.stdout
    assert table(tmp_path / "home", "validations") == []
    # Imported the first time with --decide: nothing to say.
    fresh = cli("import", "openai-jsonl", str(path), "--home", str(tmp_path / "fresh"), "--decide", "default")
    assert fresh.returncode == 0 and "already imported keep" not in fresh.stdout
    assert table(tmp_path / "fresh", "validations")


def test_tool_results_that_answer_no_call_are_counted_and_kept_as_messages(tmp_path: Path) -> None:
    def tool(call_id: str, content: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    messages = [
        {"role": "user", "content": "get A"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_order", {"order_id": "A"})]},
        tool("c1", "paid"),
        tool("c1", "paid again"),  # a second answer to one call
        tool("zz", "who asked?"),  # an id no call gave
        {"role": "assistant", "content": "A is paid."},
        tool("c1", "late"),  # after a text answer
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "Bye."},
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": messages, "tools": TOOLS["tools"]}) + "\n")
    home = tmp_path / "home"
    done = cli("import", "openai-jsonl", str(path), "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert "1 tool calls (0 failed), 0 user tool calls, 3 tool results answering no call (kept as messages)" \
        in done.stdout, done.stdout
    (op,) = table(home, "operations")
    assert op["outcome"] == "success"
    contexts = [json.loads(a["body"]) for a in table(home, "artifacts") if a["kind"] == "context"]
    kept = [m.get("content") for c in contexts for m in c.get("messages", []) if m.get("role") == "tool"]
    assert {"paid again", "who asked?", "late"} <= set(kept)
    # A transcript whose every result answers its call says nothing of the kind.
    (tmp_path / "plain.jsonl").write_text(json.dumps({"messages": messages[:3] + messages[5:6],
                                                      "tools": TOOLS["tools"]}) + "\n")
    plain = cli("import", "openai-jsonl", str(tmp_path / "plain.jsonl"), "--home", str(tmp_path / "plain"))
    assert plain.returncode == 0 and "answering no call" not in plain.stdout
