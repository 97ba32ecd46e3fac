"""Scenario files: a precise error for every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopledger.engine._errors import BadInput
from loopledger.engine._scenario import load_scenario, load_scenarios

GOOD = """
id: ok
contract: {goal: do it}
model:
  - final: done
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_minimal_scenario_loads(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, GOOD))
    assert scenario.id == "ok"
    assert scenario.tenant == "acme"
    assert [e.final for e in scenario.entries_for("v1")] == ["done"]


def test_repeat_expands_and_prompt_versions_pick_their_list(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, """
id: pv
contract: {goal: g}
model:
  default: [{final: a, repeat: 2}]
  v2: [{final: b}]
"""))
    assert [e.final for e in scenario.entries_for("v1")] == ["a", "a"]
    assert [e.final for e in scenario.entries_for("v2")] == ["b"]


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ("contract: {goal: g}\nmodel: [{final: x}]\n", "s.yaml: id", "required field missing"),
        ("id: a\nmodel: [{final: x}]\n", "s.yaml: contract", "required field missing"),
        ("id: a\ncontract: {goal: g}\nbudgets: {max_steps: eight}\n", "s.yaml: budgets.max_steps", "integer"),
        ("id: a\ncontract: {goal: g}\nfaults: [{tool: t, kind: explode}]\n", "s.yaml: faults[0].kind", "explode"),
        ("id: a\ncontract: {goal: g}\nmodel: [{}]\n", "s.yaml: model", "an entry needs"),
        ("id: a\ncontract: {goal: g, colour: red}\n", "s.yaml: contract.colour", "unknown field"),
        ("id: a\ncontract: {goal: g}\nmodel: {v1: nope}\n", "s.yaml: model.v1", "expected a list, got 'nope'"),
        ("id: a\ncontract: {goal: g}\nuser: [5]\n", "s.yaml: user[0]", "expected a mapping, got 5"),
        ("id: a\ncontract: {goal: g}\nmodel: {v2.md: [{final: x}]}\n", "s.yaml: model",
         "key 'v2.md' is no prompt version; expected default or a prompt version's name"),
        ("", "s.yaml", "the file holds no scenario"),
        ("id: a b\ncontract: {goal: g}\n", "s.yaml: id", "expected a name of ASCII letters and digits"),
        ("id: \"a\\n\"\ncontract: {goal: g}\n", "s.yaml: id", "expected a name of ASCII letters and digits"),
        ("id: remboursement-été\ncontract: {goal: g}\n", "s.yaml: id", "expected a name of ASCII letters"),
        ("- just\n- a list\n", "s.yaml", "mapping"),
        ("id: a\ncontract: {goal: g}\nexpect: {status: DONE}\n", "s.yaml: expect.status",
         "expected a run state (READY, "),
        ("id: a\ncontract: {goal: g}\nfaults: [{tool: t, kind: fails}, {tool: t, call: 1, kind: rate_limit}]\n",
         "s.yaml: faults", "faults[1] is a second fault on t call 1 (faults[0]); expected one fault per call"),
        ('id: a\ncontract: {goal: g, required_evidence: ["ord\\0"]}\n', "s.yaml: contract.required_evidence[0]",
         "contains a NUL character"),
        ('id: a\ncontract: {goal: g}\nmodel: [{final: "x \\uD800 y"}]\n', "s.yaml: model[0].final",
         "contains an unpaired surrogate"),
        ('id: a\ncontract: {goal: g}\nmodel: [{tool_calls: [{name: "t\\0", arguments: {}}]}]\n',
         "s.yaml: model[0].tool_calls[0].name", "contains a NUL character"),
        # A value of another type is refused, not converted.
        ('id: a\ncontract: {goal: g}\nbudgets: {max_steps: "1"}\n', "s.yaml: budgets.max_steps",
         "expected an integer, got '1'"),
        ('id: a\ncontract: {goal: g}\nbudgets: {max_cost: "0.5"}\n', "s.yaml: budgets.max_cost", "expected a number"),
        # A budget of nothing would stop the run before its first call, as max_steps: 0 would.
        ('id: a\ncontract: {goal: g}\nbudgets: {max_cost: 0}\n', "s.yaml: budgets.max_cost",
         "expected greater than 0, got 0"),
        ('id: a\ncontract: {goal: g}\nexpect: {side_effects: {payments.refund: "0"}}\n',
         "s.yaml: expect.side_effects.payments.refund", "expected an integer"),
        ('id: a\ncontract: {goal: g}\nexpect: {decisions: [{step: "1", verdict: accept}]}\n',
         "s.yaml: expect.decisions[0].step", "expected an integer"),
        ('id: a\ncontract: {goal: g}\nuser: [{approve: "no"}]\n', "s.yaml: user[0].approve",
         "expected true or false, got 'no'"),
        # A scripted reply is an approval's decision or an answer: one of them.
        ("id: a\ncontract: {goal: g}\nuser: [{}]\n", "s.yaml: user[0]",
         "expected exactly one of approve (true or false) or answer, got neither"),
        ("id: a\ncontract: {goal: g}\nuser: [{approve: true, answer: {executed: false}}]\n", "s.yaml: user[0]",
         "got approve and answer"),
        ("id: a\ncontract: {goal: g}\nuser: [{approve: false, by: ''}]\n", "s.yaml: user[0].by",
         "expected non-empty text"),
        # JSON has no .inf or .nan: sent, one would be recorded as null.
        ("id: a\ncontract: {goal: g}\nmodel: [{tool_calls: [{name: payments.refund, arguments: {amount: .inf}}]}]\n",
         "s.yaml: model[0].tool_calls[0].arguments", "amount is not a finite number"),
        ("id: a\ncontract: {goal: g}\nmodel: [{tool_calls: [{name: t, arguments: {a: {b: [1, .nan]}}}]}]\n",
         "s.yaml: model[0].tool_calls[0].arguments", "a.b[1] is not a finite number"),
        ("id: a\ncontract: {goal: g}\nuser: [{answer: {n: -.inf}}]\n", "s.yaml: user[0].answer",
         "n is not a finite number"),
        ("id: a\ncontract: {goal: g}\nmodel: [{final: x, plan: [.nan]}]\n", "s.yaml: model[0].plan",
         "is not a finite number"),
        # Two faulty forms one attempt cannot both play: a broken stream has no finish.
        ("id: a\ncontract: {goal: g}\nmodel: [{stream: truncated, finish_reason: length, final: x}]\n",
         "s.yaml: model[0]", "stream: truncated (the stream breaks, nothing ends it) cannot be played with "
                             "finish_reason: length"),
        ("id: a\ncontract: {goal: g}\nmodel: [{stream: truncated, error: boom, final: x}]\n", "s.yaml: model[0]",
         "cannot be played with error"),
        # An error event is the whole attempt: nothing beside it would be played.
        ("id: a\ncontract: {goal: g}\nmodel: [{error: boom, finish_reason: length}]\n", "s.yaml: model[0]",
         "error (the provider answers with an error event, nothing else of the attempt is played) cannot be "
         "played with finish_reason; expected one faulty form per entry"),
        ("id: a\ncontract: {goal: g}\nmodel: [{error: boom, final: x, tool_calls: [{name: t}]}]\n", "s.yaml: model[0]",
         "cannot be played with tool_calls, final;"),
        # An expectation no run could meet.
        ("id: a\ncontract: {goal: g}\nexpect: {decisions: [{step: 1, validator: structure, verdict: accept}, "
         "{step: 1, validator: structure, verdict: reject}]}\n", "s.yaml: expect.decisions",
         "step 1 attempt 1 (structure) is expected both accept and reject"),
    ],
)
def test_bad_fields_name_file_field_and_expectation(tmp_path: Path, text: str, where: str, why: str) -> None:
    with pytest.raises(BadInput) as info:
        load_scenario(write(tmp_path, text))
    assert str(info.value).startswith(str(tmp_path / where)) or where in str(info.value)
    assert why in str(info.value)


def test_a_bare_faulty_form_is_an_entry(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, """
id: faulty
contract: {goal: g}
model:
  - stream: truncated
  - finish_reason: length
  - final: done
"""))
    assert [(e.stream, e.finish_reason) for e in scenario.entries_for("v1")] == [
        ("truncated", None), (None, "length"), (None, None)]


def test_raw_arguments_alone_is_a_call_whose_arguments_do_not_parse(tmp_path: Path) -> None:
    """CONTRACT.md lists ``raw_arguments: '{"order_id": "ORD-'`` among the
    faulty forms: alone, it calls the contract's first allowed tool, else
    the tool the script calls next; with neither it is refused."""
    allowed = load_scenario(write(tmp_path, """
id: raw
contract: {goal: g, allowed_tools: [orders.get_order, payments.refund]}
model:
  default:
    - raw_arguments: '{"order_id": "ORD-'
    - final: done
  v2:
    - raw_arguments: '{'
    - final: done
"""))
    for version in ("v1", "v2"):
        first = allowed.entries_for(version)[0]
        assert [c.name for c in first.tool_calls] == ["orders.get_order"]
    assert allowed.entries_for("v1")[0].raw_arguments == '{"order_id": "ORD-'
    following = load_scenario(write(tmp_path, """
id: raw2
contract: {goal: g}
model:
  - raw_arguments: '{"path": '
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/app.py}}]
""", "b.yaml"))
    assert [c.name for c in following.entries_for("v1")[0].tool_calls] == ["workspace.read_file"]
    globbed = load_scenario(write(tmp_path, "id: raw4\ncontract: {goal: g, allowed_tools: ['orders.*']}\n"
                                            "model:\n  - raw_arguments: '{'\n", "d.yaml"))
    assert [c.name for c in globbed.entries_for("v1")[0].tool_calls] == ["orders.get_order"]
    with pytest.raises(BadInput) as refused:
        load_scenario(write(tmp_path, "id: raw3\ncontract: {goal: g}\nmodel:\n  - raw_arguments: '{'\n", "c.yaml"))
    assert "c.yaml" in str(refused.value) and "model[0]: raw_arguments alone names no tool" in str(refused.value)


def test_decisions_name_a_member_of_the_suite(tmp_path: Path) -> None:
    from loopledger.engine._runner import check_tools

    path = write(tmp_path, "id: a\ncontract: {goal: g}\nexpect:\n  decisions: [{step: 1, validator: nope, verdict: accept}]\n")
    with pytest.raises(BadInput, match=r"s\.yaml: expect\.decisions\[0\]\.validator: 'nope' is not in suite 'default'"):
        check_tools(load_scenario(path))
    path = write(tmp_path, "id: a\ncontract: {goal: g}\nsuite: no-such-suite\n")
    with pytest.raises(BadInput, match=r"s\.yaml: suite: unknown suite 'no-such-suite'"):
        check_tools(load_scenario(path))


def test_a_script_needs_a_list_for_the_prompt_version(tmp_path: Path) -> None:
    from loopledger.engine._runner import check_script

    scenario = load_scenario(write(tmp_path, "id: a\ncontract: {goal: g}\nmodel:\n  v1: [{final: x}]\n"))
    check_script(scenario, "v1")
    with pytest.raises(BadInput, match=r"s\.yaml: model: no list for prompt version 'v2' and no default; lists given: v1"):
        check_script(scenario, "v2")


def test_a_tenant_names_a_folder(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"s\.yaml: tenant: expected a name of ASCII letters.*got '\.\./globex'"):
        load_scenario(write(tmp_path, "id: a\ntenant: ../globex\ncontract: {goal: g}\n"))


def test_yaml_values_are_json_values(tmp_path: Path) -> None:
    """A date is the text it is written as (YAML 1.2 reads it so; a date
    object is no JSON value); a set, whose order Python would pick anew on
    every run, is refused at its line. ``answer: null`` is an answer."""
    scenario = load_scenario(write(tmp_path, """
id: a
contract: {goal: g}
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1, since: 2024-01-01}}]
  - final: 2024-01-01T10:00:00Z
user: [{answer: 2024-02-03}, {answer: null}]
"""))
    (entry, final) = scenario.entries_for("v1")
    assert entry.tool_calls[0].arguments == {"order_id": "ORD-1", "since": "2024-01-01"}
    assert final.final == "2024-01-01T10:00:00Z"
    assert [(u.approve, u.answer) for u in scenario.user] == [(None, "2024-02-03"), (None, None)]
    said = load_scenario(write(tmp_path, "id: a\ncontract: {goal: g}\nuser: [{approve: false, by: Ana, note: frozen}]\n"))
    assert [(u.approve, u.by, u.note) for u in said.user] == [(False, "Ana", "frozen")]
    for value in ("!!set {a: null, b: null}", "!!binary aGk=", "!!omap [{a: 1}]"):
        with pytest.raises(BadInput) as info:
            load_scenario(write(tmp_path, f"id: a\ncontract: {{goal: g}}\nuser: [{{answer: {value}}}]\n"))
        assert info.value.where.endswith("s.yaml: line 3"), info.value.where
        assert f"a !!{value.split()[0][2:]} value; expected JSON values only" in info.value.reason


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as info:
        load_scenario(write(tmp_path, "id: a\ncontract: {goal: g\nmodel: [\n"))
    assert "line" in info.value.where and "not valid YAML" in info.value.reason


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(BadInput) as info:
        load_scenarios([tmp_path])
    assert "also the id of" in str(info.value)


def test_a_file_reached_twice_is_one_scenario(tmp_path: Path) -> None:
    """Named twice, inside a folder also given, or through a link: one
    scenario (the first place it was found), not a clash with itself."""
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    first = write(inner, GOOD, "one.yaml")
    (tmp_path / "link.yaml").symlink_to(first)
    found = load_scenarios([first, tmp_path / "a", inner, first, tmp_path / "link.yaml"])
    assert [s.source for s in found] == [str(first)]


def test_a_folder_leaves_out_hidden_files_and_folders(tmp_path: Path) -> None:
    """``.git``, ``.venv`` or an editor's lock file hold YAML that is no
    scenario; named on the command line, a hidden file is read."""
    shown = write(tmp_path, GOOD, "one.yaml")
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".git", "not: [a scenario", "config.yaml")
    (tmp_path / ".#one.yaml").symlink_to("user@host.1234:1700000000")  # an editor's lock: a dangling link
    hidden = write(tmp_path, GOOD.replace("id: ", "id: hidden-", 1), ".draft.yaml")
    assert [s.source for s in load_scenarios([tmp_path])] == [str(shown)]
    assert [s.source for s in load_scenarios([hidden])] == [str(hidden)]


def test_a_missing_path_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as info:
        load_scenarios([tmp_path / "nope"])
    assert "no such file" in str(info.value) and "bundled" not in str(info.value)


def test_a_missing_bundled_path_names_the_installed_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' ``datasets/scenarios/...``, run outside a checkout."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput) as info:
        load_scenarios([Path("datasets/scenarios/happy-refund.yaml")])
    installed = Path(str(info.value).split("installed in ")[1].rstrip(")"))
    assert installed.is_file() and installed.name == "happy-refund.yaml"


def test_every_bundled_scenario_loads() -> None:
    from importlib import resources

    folder = Path(str(resources.files("loopledger.datasets").joinpath("scenarios")))
    scenarios = load_scenarios([folder])
    assert len(scenarios) >= 25
    assert all(s.expect.status for s in scenarios), "every bundled scenario says what it expects"


def test_what_a_model_sends_is_made_storable_once_at_collection() -> None:
    """A NUL character (PostgreSQL's text cannot hold one) or an unpaired
    surrogate (no UTF-8 form) in a model's output becomes U+FFFD when the
    candidate is formed, so every record of it holds the same text on any
    journal; a valid surrogate pair becomes its character."""
    from loopledger.engine._model import Finish, TextDelta, ToolCallDelta, collect

    collected = collect(iter([
        TextDelta("said \x00 and \ud800"),
        ToolCallDelta(0, "call\x00x", "look\x00up", '{"q": "a\\u0000b", "e": "\\ud83d\\ude00", "s": "\\udc00"}'),
        Finish("tool_calls"),
    ]))
    text, call = collected.items
    assert text == {"type": "text", "text": "said \ufffd and \ufffd"}
    assert (call["call_id"], call["name"]) == ("call\ufffdx", "look\ufffdup")
    assert call["arguments"] == {"q": "a\ufffdb", "e": "\U0001f600", "s": "\ufffd"}


def test_arguments_giving_a_key_twice_are_kept_as_received_not_parsed() -> None:
    """Python would keep the last value, another reader the first: such
    arguments mean two things, so they are the text received (a repair),
    never a call to run."""
    from loopledger.engine._model import Finish, ToolCallDelta, collect

    twice = '{"order_id": "ORD-1", "order_id": "ORD-1001"}'
    nested = '{"a": {"k": 1, "k": 2}}'
    # Two keys that become one once made storable (a NUL, a lone surrogate: U+FFFD).
    stored_as_one = '{"k\\u0000": 1, "k\\ud800": 2}'
    collected = collect(iter([ToolCallDelta(0, "c1", "orders.get_order", twice),
                              ToolCallDelta(1, "c2", "orders.get_order", nested),
                              ToolCallDelta(2, "c3", "orders.get_order", '{"order_id": "ORD-1001"}'),
                              ToolCallDelta(3, "c4", "orders.get_order", stored_as_one),
                              Finish("tool_calls")]))
    first, second, third, fourth = collected.items
    assert (first.get("arguments"), first["raw_arguments"]) == (None, twice)
    assert (second.get("arguments"), second["raw_arguments"]) == (None, nested)
    assert third["arguments"] == {"order_id": "ORD-1001"} and "raw_arguments" not in third
    assert fourth.get("arguments") is None and "k" in fourth["raw_arguments"]


def test_a_version_written_into_the_tool_name_is_the_items_version() -> None:
    """``deploy.service@v1``: the item names the tool as the operations do,
    and keeps the version the model asked for in its own field."""
    from loopledger.engine._model import Finish, ToolCallDelta, collect

    collected = collect(iter([ToolCallDelta(0, "c1", "deploy.service@v1", "{}"),
                              ToolCallDelta(1, "c2", "orders.get_order", "{}"),
                              ToolCallDelta(2, "c3", "odd@", "{}"),
                              # Two versions: no tool's name; kept whole, never split into a real tool.
                              ToolCallDelta(3, "c4", "orders.get_order@v1@junk", "{}"),
                              Finish("tool_calls")]))
    assert [(i["name"], i["version"]) for i in collected.items] == [
        ("deploy.service", "v1"), ("orders.get_order", None), ("odd@", None), ("orders.get_order@v1@junk", None)]


def test_a_recorded_runs_spec_is_read_by_the_rules_it_was_written_under(tmp_path: Path) -> None:
    """Rules added for files being loaded do not strand runs already
    recorded: their frozen spec (a unicode id, usage with other keys and
    whole numbers as floats, a reason or an evidence kind outside today's
    lists) still resumes."""
    import json
    import sqlite3

    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text("""\
id: lookup
contract: {goal: Look ORD-1001 up, allowed_tools: [orders.get_order]}
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1001}}]
  - final: ORD-1001 is paid.
""")
    home = tmp_path / "home"
    runner = Runner(Home.resolve(home))
    try:
        run_id = runner.create(load_scenario(path), "v1")
    finally:
        runner.close()
    conn = sqlite3.connect(home / "journal.sqlite")
    (spec_json,) = conn.execute("SELECT spec_json FROM run_specs WHERE run_id = ?", (run_id,)).fetchone()
    spec = json.loads(spec_json)
    spec["id"] = "tâche lookup"
    spec["model"][0]["usage"] = {"tokens_in": 10.0, "cached_tokens": 4.0}
    spec["expect"]["reason"] = "finished"
    spec["contract"]["required_evidence"] = ["order_seen"]
    conn.execute("UPDATE run_specs SET spec_json = ? WHERE run_id = ?", (json.dumps(spec), run_id))
    conn.commit()
    conn.close()
    runner = Runner(Home.resolve(home))
    try:
        runner.drive_all([run_id], 1)
        record = runner.store.get_run(run_id)
    finally:
        runner.close()
    # It ran to its end: the evidence kind no tool gives is never met, so the
    # gate sends the answer back until the script runs out.
    assert (record.state.value, record.reason) == ("FAILED", "model_error")
    assert record.model_attempts == 2 and record.tool_calls == 1 and record.tokens_in >= 10


def test_a_suite_file_is_named_relative_to_the_scenario_wherever_the_command_runs(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    import subprocess
    import sys

    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "tight.yaml").write_text("name: tight\nvalidators:\n  - structure\n  - loop.repeated_call: {threshold: 2}\n")
    (tmp_path / "suites" / "bad.yaml").write_text("name: bad\nvalidators:\n  - loop.repeated_call: {threshold: 1}\n")
    (tmp_path / "scenarios").mkdir()
    body = "contract: {goal: Look ORD-1001 up, allowed_tools: [orders.get_order]}\nmodel:\n  - final: done\n"
    (tmp_path / "scenarios" / "good.yaml").write_text(f"id: good\nsuite: ../suites/tight.yaml\n{body}")
    from loopledger.engine._scenario import load_scenario

    monkeypatch.chdir(tmp_path.parent)
    assert load_scenario(tmp_path / "scenarios" / "good.yaml").suite == str(tmp_path / "suites" / "tight.yaml")
    cli = [str(Path(sys.executable).with_name("loopledger"))]
    ok = subprocess.run([*cli, "run", str(tmp_path / "scenarios" / "good.yaml"), "--home", str(tmp_path / "h")],
                        capture_output=True, text=True, timeout=120, cwd="/")
    assert ok.returncode == 0, ok.stderr
    # A suite that cannot load is named with its own file and field.
    (tmp_path / "scenarios" / "good.yaml").unlink()
    (tmp_path / "scenarios" / "bad.yaml").write_text(f"id: bad\nsuite: ../suites/bad.yaml\n{body}")
    bad = subprocess.run([*cli, "run", str(tmp_path / "scenarios"), "--home", str(tmp_path / "h2")],
                         capture_output=True, text=True, timeout=120, cwd="/")
    assert bad.returncode == 2, bad.stdout
    (line,) = bad.stderr.strip().splitlines()
    assert "bad.yaml: suite" in line and "suites/bad.yaml: validators[0].loop.repeated_call.threshold" in line


@pytest.mark.parametrize("named", ["suites/Strict.YAML", "suites/strict"])
def test_a_suite_named_as_a_path_is_read_beside_the_scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             named: str) -> None:
    (tmp_path / "suites").mkdir()
    (tmp_path / named).write_text("name: mine\nvalidators: [structure]\n")
    path = write(tmp_path, GOOD + f"suite: {named}\n")
    monkeypatch.chdir("/")
    assert load_scenario(path).suite == str((tmp_path / named).resolve())


def test_required_evidence_names_paths_as_the_workspace_does(tmp_path: Path) -> None:
    """``file_written:./notes/b.txt`` is ``file_written:notes/b.txt``, the
    subject the workspace gives the write: written otherwise it could never
    be met. A path that climbs out of the workspace is refused."""
    scenario = load_scenario(write(tmp_path, """
id: a
contract:
  goal: g
  required_evidence: ["file_written:./notes//b.txt", "listing:.", "order_found:ORD-1001", file_read]
"""))
    assert scenario.contract.required_evidence == [
        "file_written:notes/b.txt", "listing:.", "order_found:ORD-1001", "file_read"]
    with pytest.raises(BadInput) as info:
        load_scenario(write(tmp_path, 'id: a\ncontract: {goal: g, required_evidence: ["file_read:../x"]}\n'))
    assert info.value.where.endswith("s.yaml: contract.required_evidence")
    assert "item 0, 'file_read:../x': escapes the workspace root; expected a workspace path" in info.value.reason


def test_a_write_to_a_dotted_path_meets_the_evidence_it_requires(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    path = write(tmp_path, """
id: dotted
contract:
  goal: Write notes/b.txt
  required_evidence: ["file_written:./notes/b.txt"]
  allowed_tools: [workspace.write_file]
model:
  - tool_calls: [{name: workspace.write_file, arguments: {path: ./notes/b.txt, content: "hi"}}]
  - final: Written.
    claims: [{text: written, evidence: ["file_written:notes/b.txt"]}]
expect: {status: SUCCEEDED, reason: completed, side_effects: {workspace.write_file: 1}}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.run([sys.executable, "-c", "from loopledger._cli import main; main()", "run", str(path),
                           "--check", "--json", "--home", str(tmp_path / "home")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["status"] == "SUCCEEDED"
