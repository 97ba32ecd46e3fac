"""Scenario files refused quickly and precisely: alias bombs and other
shapes no scenario needs, nulls where a value is expected, side-effect
counts no backend keeps, path patterns that could never match, paths that
are not files; and what ``--check`` says about decisions never made."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopledger.engine._errors import BadInput
from loopledger.engine._scenario import load_scenario, load_scenarios, parse_scenario

REPO = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("loopledger"))


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def bomb(levels: int, tail: str = "id: bomb\ncontract: {goal: x}\nmodel: [{final: hi}]\n") -> str:
    """The billion-laughs file: each level a list of nine aliases of the one before."""
    names = "abcdefghijklmnop"[:levels]
    lines = [f"{names[0]}: &{names[0]} [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n" + tail


# -- 1. anchors and aliases ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_alias_bomb_is_refused_at_once_naming_the_file_and_the_alias_line(tmp_path: Path) -> None:
    path = write(tmp_path, bomb(9))
    started = time.monotonic()
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert time.monotonic() - started < 2
    assert info.value.where == f"{path}: line 5", str(info.value)  # the first alias beyond the bound: *d
    assert "alias *d" in info.value.reason and "at most 10,000 nodes" in info.value.reason


@pytest.mark.timeout(60)
def test_an_alias_bomb_inside_valid_fields_is_refused_too(tmp_path: Path) -> None:
    # Every key is a scenario's: nothing but the bound stops it before the
    # checks, the validation and the frozen spec walk half a million nodes.
    entries = ["  - final: hi\n    plan: &a [" + ",".join(["lol"] * 9) + "]\n"]
    for prev, name in zip("abcde", "bcdef"):
        entries.append(f"  - final: hi\n    plan: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n")
    path = write(tmp_path, "id: hidden\ncontract: {goal: x}\nmodel:\n" + "".join(entries))
    started = time.monotonic()
    with pytest.raises(BadInput, match=r"line \d+: alias \*[a-f] repeats"):
        load_scenario(path)
    assert time.monotonic() - started < 2


@pytest.mark.timeout(120)
def test_run_refuses_an_alias_bomb_with_exit_2_and_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, bomb(9))
    started = time.monotonic()
    proc = subprocess.run([CLI, "run", str(path), "--home", str(tmp_path / "home")],
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert f"{path}: line 5: alias *d" in line and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        # An alias inside the node it names is a cycle: an endless tree.
        ("id: a\ncontract: {goal: g}\nmodel:\n  - final: x\n    plan: &p [1, *p]\n", "line 5", "alias *p is inside"),
        # Nesting deeper than any scenario needs would exhaust the stack.
        ("id: a\ncontract: {goal: g}\nmodel:\n  - final: x\n    plan: " + "[" * 2000 + "]" * 2000 + "\n",
         "line 5", "nested more than 100 deep"),
    ],
)
def test_cycles_and_deep_nesting_are_refused_not_a_traceback(tmp_path: Path, text: str, where: str, why: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert info.value.where == f"{path}: {where}" and why in info.value.reason


def test_anchors_and_aliases_used_normally_keep_working(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, """
id: reuse
contract: {goal: Look ORD-1001 up, allowed_tools: &tools [orders.get_order]}
model:
  - &lookup
    tool_calls: [{name: orders.get_order, arguments: &args {order_id: ORD-1001}}]
  - *lookup
  - *lookup
  - tool_calls: [{name: orders.get_order, arguments: {<<: *args}}]
  - final: ORD-1001 is paid.
expect: {status: SUCCEEDED}
"""))
    entries = scenario.entries_for("v1")
    assert [e.tool_calls[0].arguments for e in entries[:4]] == [{"order_id": "ORD-1001"}] * 4
    assert entries[0] == entries[1] == entries[2]
    assert scenario.contract.allowed_tools == ["orders.get_order"]


def test_unknown_top_level_keys_are_refused_before_anything_walks_their_values(tmp_path: Path,
                                                                                monkeypatch) -> None:
    import loopledger.engine._scenario as scenario_module

    def walked(*args, **kwargs):
        raise AssertionError("the values were walked before the keys were checked")

    monkeypatch.setattr(scenario_module, "_check_text", walked)
    path = write(tmp_path, "a: [1, 2, 3]\nid: x\ncontract: {goal: x}\nmodel: [{final: hi}]\n")
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert info.value.where == f"{path}: a"
    assert info.value.reason.startswith("unknown field; expected one of id, description, tenant, contract")


# -- 2. null arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "where", "why"),
    [
        ("{tool_calls: [{name: orders.get_order, arguments: null}]}", "model[0].tool_calls[0].arguments",
         "expected a mapping of argument names to values, got null"),
        ("{tool_calls: [{name: orders.get_order, raw_arguments: null}]}", "model[0].tool_calls[0].raw_arguments",
         "expected a string (the arguments as the model sent them), got null"),
        ("{raw_arguments: null, tool_calls: [{name: orders.get_order}]}", "model[0].raw_arguments",
         "expected a string"),
        ("{tool_calls: [{name: orders.get_order, arguments: [1, 2]}]}", "model[0].tool_calls[0].arguments",
         "expected a mapping"),
        ("{tool_calls: [{name: orders.get_order, raw_arguments: 42}]}", "model[0].tool_calls[0].raw_arguments",
         "expected a string, got 42"),
    ],
)
def test_null_arguments_are_refused_not_turned_into_no_arguments(tmp_path: Path, call: str, where: str,
                                                                 why: str) -> None:
    path = write(tmp_path, f"id: a\ncontract: {{goal: g}}\nmodel: [{call}]\n")
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert info.value.where == f"{path}: {where}" and why in info.value.reason


def test_a_call_without_arguments_and_a_frozen_spec_with_nulls_still_load(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, "id: a\ncontract: {goal: g}\nmodel:\n"
                                             "  - tool_calls: [{name: orders.get_order}]\n"
                                             "  - tool_calls: [{name: orders.get_order, raw_arguments: '{'}]\n"))
    assert scenario.model[0].tool_calls[0].arguments is None
    # The spec a run freezes writes the form not given as null; it resumes.
    spec = scenario.spec()
    assert spec["model"][0]["tool_calls"][0]["raw_arguments"] is None
    assert spec["model"][1]["tool_calls"][0]["arguments"] is None
    assert parse_scenario(spec, "run r", stored=True).model == scenario.model


@pytest.mark.parametrize(
    ("text", "where", "why"),
    [
        ('id: ""\ncontract: {goal: g}\nmodel: [{final: ok}]\n', "id", "expected non-empty text, got ''"),
        ("id: a\ncontract: {goal: g}\nmodel:\n  3: [{final: ok}]\n", "model (key 3)", "expected a string, got 3"),
    ],
)
def test_an_empty_id_and_a_key_of_the_wrong_type_are_said_in_the_files_words(tmp_path: Path, text: str, where: str,
                                                                               why: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert (info.value.where, info.value.reason) == (f"{path}: {where}", why)


# -- 3. expect.side_effects --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("orders.get_order", "orders.get_order has no side effects, so its calls are not executions the backend counts"),
        ("workspace.read_file", "workspace.read_file has no side effects"),
        ("ask_user", "ask_user has no side effects"),
        ("orders.nope", "unknown tool 'orders.nope'"),
    ],
)
def test_side_effects_name_a_tool_whose_executions_are_counted(tmp_path: Path, tool: str, why: str) -> None:
    from loopledger.engine._runner import check_tools
    from loopledger.engine._tools import TOOL_TRAITS

    path = write(tmp_path, f"id: a\ncontract: {{goal: g}}\nmodel: [{{final: x}}]\nexpect: {{side_effects: {{{tool}: 1}}}}\n")
    with pytest.raises(BadInput) as info:
        check_tools(load_scenario(path))
    counted = sorted(name for name, traits in TOOL_TRAITS.items() if traits.side_effect)
    assert info.value.where == f"{path}: expect.side_effects.{tool}"
    assert why in info.value.reason
    assert info.value.reason.endswith("expected a tool whose executions are counted: " + ", ".join(counted))


def test_side_effects_of_a_counted_tool_pass(tmp_path: Path) -> None:
    from loopledger.engine._runner import check_tools

    check_tools(load_scenario(write(tmp_path, "id: a\ncontract: {goal: g}\nmodel: [{final: x}]\n"
                                              "expect: {side_effects: {payments.refund: 0, workspace.write_file: 2}}\n")))


# -- 5. forbidden_paths --------------------------------------------------------------------------------------


READS = """
model:
  - tool_calls: [{name: workspace.read_file, arguments: {path: payments/config.json}}]
  - tool_calls: [{name: workspace.read_file, arguments: {path: payments/provider/client.py}}]
  - tool_calls: [{name: workspace.read_file, arguments: {path: src/app.py}}]
  - final: done
expect:
  status: SUCCEEDED
  decisions:
    - {step: 1, validator: permission, verdict: reject}
    - {step: 2, validator: permission, verdict: reject}
    - {step: 3, validator: permission, verdict: accept}
"""


@pytest.mark.parametrize("pattern", ["payments/", "payments", "/payments/**", "./payments/**", "payments/**",
                                     "/payments", "./payments/", "payments//", "src/../payments"])
def test_forbidden_paths_forbid_what_they_name_however_written(tmp_path: Path, pattern: str) -> None:
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner

    path = write(tmp_path, "id: fp\ncontract:\n  goal: read\n  allowed_tools: [workspace.read_file]\n"
                           f"  forbidden_paths: [{pattern!r}]\n" + READS)
    scenario = load_scenario(path)
    # Recorded in canonical form: the permission validator, and a replay of
    # the run, match the pattern as recorded.
    assert scenario.contract.forbidden_paths == ["payments/**"]
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        run_id = runner.create(scenario, "v1")
        runner.drive_all([run_id], 1)
        outcome = runner.outcome(run_id, scenario)
    finally:
        runner.close()
    assert outcome.mismatches == []


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("../payments/**", "escapes the workspace root"),
        ("payments\\\\config.json", "contains a backslash"),
        ("", "empty pattern"),
        ("C:/payments", "a drive letter"),
        ("*/../x", "'..' after '*'"),
    ],
)
def test_a_pattern_that_could_never_match_is_refused(tmp_path: Path, pattern: str, why: str) -> None:
    path = write(tmp_path, f'id: a\ncontract: {{goal: g, forbidden_paths: [ok/**, "{pattern}"]}}\nmodel: [{{final: x}}]\n')
    with pytest.raises(BadInput) as info:
        load_scenario(path)
    assert info.value.where == f"{path}: contract.forbidden_paths"
    assert f"item 1, {pattern.replace(chr(92) * 2, chr(92))!r}: {why}" in info.value.reason


def test_a_recorded_runs_patterns_stay_as_it_ran_with_them() -> None:
    spec = {"id": "old", "contract": {"goal": "g", "forbidden_paths": ["payments/", "/x/**"]}, "model": []}
    assert parse_scenario(spec, "run r", stored=True).contract.forbidden_paths == ["payments/", "/x/**"]


# -- 6. paths that are not files ---------------------------------------------------------------------------


def test_a_path_that_exists_but_is_not_a_regular_file_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as info:
        load_scenarios(["/dev/null"])
    assert str(info.value) == ("/dev/null: exists but is a character device, not a regular file; "
                               "expected a scenario file (.yaml) or a folder of them")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="exists but is a named pipe, not a regular file"):
        load_scenarios([fifo])
    (tmp_path / "link.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(BadInput, match="link.yaml: a symbolic link to no file or folder"):
        load_scenarios([tmp_path / "link.yaml"])
    with pytest.raises(BadInput, match="nope.yaml: no such file or folder"):
        load_scenarios([tmp_path / "nope.yaml"])


# -- 4. what --check says about decisions never made -------------------------------------------------------


def test_check_says_a_decision_was_not_made_or_its_step_not_reached(tmp_path: Path) -> None:
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner

    scenario = load_scenario(write(tmp_path, """
id: never
contract:
  goal: Look up ORD-1003
  required_evidence: ["order_found:ORD-1003"]
  allowed_tools: [orders.get_order]
model:
  - stream: truncated
    tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1003}}]
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1003}}]
  - final: ORD-1003 is paid.
    claims: [{text: found, evidence: ["order_found:ORD-1003"]}]
expect:
  status: SUCCEEDED
  decisions:
    - {step: 1, attempt: 2, verdict: accept}
    - {step: 2, validator: completion_gate, verdict: accept}
    - {step: 1, validator: structure, verdict: accept}
    - {step: 1, attempt: 3, validator: structure, verdict: accept}
    - {step: 7, validator: completion_gate, verdict: accept}
"""))
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        run_id = runner.create(scenario, "v1")
        runner.drive_all([run_id], 1)
        outcome = runner.outcome(run_id, scenario)
    finally:
        runner.close()
    assert (outcome.status, outcome.steps) == ("SUCCEEDED", 2)
    assert outcome.mismatches == [
        "step 1 attempt 1: structure made no decision (no validator judged this candidate), expected accept",
        "step 1 attempt 3: no candidate was made, expected structure to decide accept",
        "step 7: not reached (the run's last step was 2), expected completion_gate to decide accept",
    ]
    assert not any("None" in m for m in outcome.mismatches)
