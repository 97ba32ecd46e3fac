"""Suites: loaders, errors naming file and field, version stability."""

from __future__ import annotations

import sys
import textwrap

import pytest
from validators_helpers import call, make_input

from loopledger.validators import (
    Suite,
    SuiteError,
    ValidatorSpec,
    Verdict,
    build_validator,
    bundled_suites,
    get_factory,
    load_suite,
    parse_suite,
    registered,
)

BUILTINS = ["structure", "tool_exists", "tool_version", "tool_args_schema", "permission", "repeated_side_effect",
            "references",
            "output_rules", "completion_gate", "loop.repeated_call", "loop.repeated_error", "loop.no_progress",
            "loop.oscillation"]


def test_every_builtin_is_registered_and_in_the_bundled_suites():
    assert set(BUILTINS) <= set(registered())
    assert {"default", "strict"} <= set(bundled_suites())
    for name in ("default", "strict"):
        assert [m.name for m in load_suite(name).members] == BUILTINS


def test_strict_differs_from_default_only_in_params():
    default, strict = load_suite("default"), load_suite("strict")
    assert default.version != strict.version
    assert {m.name: m.version for m in default.members} == {m.name: m.version for m in strict.members}
    assert dict(strict.members[BUILTINS.index("loop.repeated_call")].params) == {"threshold": 2}


def test_version_ignores_key_and_member_order_and_follows_params():
    a = parse_suite({"name": "a", "validators": [{"loop.oscillation": {"period": 2, "cycles": 2}}, "structure"]})
    b = parse_suite({"validators": ["structure", {"loop.oscillation": {"cycles": 2, "period": 2}}], "name": "b"})
    c = parse_suite({"name": "a", "validators": ["structure", {"loop.oscillation": {"period": 2, "cycles": 3}}]})
    assert a.version == b.version != c.version
    # defaults written out or left implicit: the same behaviour, the same version
    d = parse_suite({"name": "d", "validators": ["structure", {"loop.oscillation": {"period": 2, "cycles": 2, "channels": ["calls", "states"]}}]})
    assert d.version == a.version


def test_recorded_spec_rebuilds_the_same_validator_and_suite():
    suite = load_suite("strict")
    again = parse_suite(suite.to_dict(), "recorded")
    assert again.version == suite.version
    for m in suite.members:
        rebuilt = build_validator(m.spec().to_dict())
        assert rebuilt.spec() == m.spec()
    assert build_validator(ValidatorSpec("tool_exists", "1", {})).name == "tool_exists"


def test_load_from_file_and_module(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nvalidators:\n  - structure\n  - output_rules: {patterns: [email]}\n")
    suite = load_suite(str(path))
    assert [m.name for m in suite.members] == ["structure", "output_rules"]
    mod = tmp_path / "my_suites.py"
    mod.write_text(textwrap.dedent("""
        from loopledger.validators import parse_suite
        SUITE = parse_suite({"name": "obj", "validators": ["structure"]})
        def make():
            return SUITE
        MAPPING = {"name": "map", "validators": ["tool_exists"]}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_suite("my_suites:SUITE").name == "obj"
        assert load_suite("my_suites:make").name == "obj"
        assert load_suite("my_suites:MAPPING").members[0].name == "tool_exists"
    finally:
        sys.modules.pop("my_suites", None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("name: strict\nvalidators:\n  - structure\n  - tool_exists\n  - tool_version\n  - tool_exist\n",
         r"^strict\.yaml: validators\[3\]: unknown validator 'tool_exist' \(did you mean 'tool_exists'\?\); known: "),
        ("name: s\nvalidators:\n  - loop.repeated_call: {threshold: 1}\n",
         r"^strict\.yaml: validators\[0\]\.loop\.repeated_call\.threshold: expected an integer >= 2, got 1$"),
        ("name: s\nvalidators:\n  - output_rules: {pattern: [email]}\n",
         r"^strict\.yaml: validators\[0\]\.output_rules\.pattern: expected one of the known params"),
        ("name: s\nvalidators:\n  - structure\n  - structure\n", r"validators\[1\]: validator 'structure' already listed"),
        ("name: s\nvalidators: structure\n", r"^strict\.yaml: validators: expected a non-empty list"),
        ("validators: [structure]\n", r"^strict\.yaml: name: expected a non-empty string"),
        ("name: s\nvalidators: [{name: structure, version: '9'}]\n", r"validators\[0\]\.version: unknown version '9'"),
        ("name: s\nvalidators: [structure\n", r"^strict\.yaml: line \d+: not valid YAML"),
        ("name: s\nvalidators:\n  - output_rules: {patterns: !!set {email: null}}\n",
         r"^strict\.yaml: line 3: a !!set value; expected JSON values only \(mappings, lists"),
        ("name: s\nvalidators:\n  - output_rules: {patterns: secret_key}\n",
         r"^strict\.yaml: validators\[0\]\.output_rules\.patterns: expected a list of strings, got 'secret_key'$"),
        ("name: s\nvalidators:\n  - output_rules: {custom: abc}\n",
         r"^strict\.yaml: validators\[0\]\.output_rules\.custom: expected a mapping of rule name to regular"),
        ("name: s\nvalidators:\n  - loop.oscillation: {channels: 5}\n",
         r"^strict\.yaml: validators\[0\]\.loop\.oscillation\.channels: expected a list of strings, got 5$"),
    ],
)
def test_bad_suites_name_file_and_field(tmp_path, monkeypatch, body, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strict.yaml").write_text(body)
    with pytest.raises(SuiteError, match=message):
        load_suite("strict.yaml")


WRONG_VALUES = [5, -1, 0, 1.5, "x", "", [], ["nope"], [5], {}, {"a": 1}, {"a": "("}, None, True]


@pytest.mark.parametrize("name", BUILTINS)
def test_every_param_of_the_wrong_shape_is_a_suite_error(tmp_path, monkeypatch, name):
    """Whatever a suite file puts in a param, building the suite either works
    or fails with one SuiteError naming the param; nothing else escapes."""
    import json

    monkeypatch.chdir(tmp_path)
    for param in [*get_factory(name).defaults, "no_such_param"]:
        for value in WRONG_VALUES:
            (tmp_path / "s.yaml").write_text(f"name: s\nvalidators:\n  - {name}: {{{param}: {json.dumps(value)}}}\n")
            try:
                load_suite("s.yaml")
            except SuiteError as exc:
                assert str(exc).startswith(f"s.yaml: validators[0].{name}.{param}"), str(exc)


def test_unknown_references():
    with pytest.raises(SuiteError, match="unknown suite 'nope'"):
        load_suite("nope")
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite("missing/file.yaml")
    with pytest.raises(SuiteError, match="cannot import module"):
        load_suite("no_such_module_x:SUITE")


@pytest.mark.parametrize("ref", [None, 3, ["default"], b"default", ""])
def test_a_reference_that_is_not_one_is_named_neutrally(ref):
    """Called from Python, the reference is named ``suite`` (no CLI option)."""
    with pytest.raises(SuiteError) as caught:
        load_suite(ref)
    assert caught.value.where == "suite" and str(caught.value).startswith("suite: expected a bundled suite name")
    with pytest.raises(SuiteError, match=r"^suite: unknown suite 'nope'"):
        load_suite("nope")


@pytest.mark.parametrize("inp", [None, {}, {"run_id": "r"}, "{}"])
def test_evaluate_refuses_what_is_not_a_decision_input(inp):
    from loopledger.validators import InputError

    with pytest.raises(InputError, match=r"^inp: expected a DecisionInput"):
        load_suite("default").evaluate(inp)


def test_evaluate_gives_one_decision_per_member_and_the_worst_verdict():
    suite = load_suite("default")
    inp = make_input([call("deploy.service@v1", {"service": "api", "version": "1"})],
                     contract={"forbidden_paths": ["payments/**"]})
    result = suite.evaluate(inp)
    assert [d.validator for d in result.decisions] == BUILTINS
    bumped = {"output_rules": "3", "completion_gate": "3", "loop.oscillation": "2"}
    assert [d.validator_version for d in result.decisions] == [bumped.get(name, "1") for name in BUILTINS]
    assert result.suite_version == suite.version
    assert result.verdict is Verdict.REJECT
    assert [d.code for d in result.blocking] == ["stale_tool_version"]
    result = suite.evaluate(make_input([call("deploy.service", {"service": "api", "version": "1"})]))
    assert (result.verdict, [d.code for d in result.blocking]) == (Verdict.ASK, ["approval_required"])
    result = suite.evaluate(make_input([call("orders.get_order", {"order_id": "ORD-1042"})]))
    assert (result.verdict, result.blocking) == (Verdict.ACCEPT, ())


def test_a_member_that_raises_is_recorded_not_propagated():
    def boom():
        def check(inp):
            raise RuntimeError("bug")
        return check

    from loopledger.validators._registry import ValidatorFactory

    suite = Suite("x", [ValidatorFactory("boom", "1", boom)(), get_factory("structure")()])
    result = suite.evaluate(make_input([call("orders.get_order", {"order_id": "ORD-1042"})]))
    assert [(d.validator, d.code) for d in result.decisions] == [("boom", "validator_error"), ("structure", "ok")]


def test_a_users_validator_params_are_checked_against_their_annotations(tmp_path, monkeypatch):
    """A custom factory's ``max_amount: float`` refuses ``"ten"``, ``"10"``
    and ``true`` when the suite is built (one SuiteError naming the param),
    instead of turning every decision into validator_error; a whole number
    is a float; unannotated params are the factory's own business."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "acme_typed.py").write_text(textwrap.dedent('''
        from loopledger.validators import validator

        @validator(name="acme.typed_limit", version="1")
        def typed_limit(*, max_amount: float = 100.0, tools: list[str] = (), note=None):
            def check(inp):
                return []
            return check
    '''))
    monkeypatch.chdir(tmp_path)
    body = "name: s\nimports: [acme_typed]\nvalidators:\n  - acme.typed_limit: {{{params}}}\n"
    for params, message in (('max_amount: "ten"', "max_amount: expected a value of type float, got 'ten'"),
                            ('max_amount: "10"', "max_amount: expected a value of type float, got '10'"),
                            ("max_amount: true", "max_amount: expected a value of type float, got True"),
                            ("tools: [1, 2]", "tools: expected a value of type list[str], got [1, 2]")):
        (tmp_path / "s.yaml").write_text(body.format(params=params))
        with pytest.raises(SuiteError) as caught:
            load_suite("s.yaml")
        assert str(caught.value) == f"s.yaml: validators[0].acme.typed_limit.{message}"
    (tmp_path / "s.yaml").write_text(body.format(params="max_amount: 10, tools: [payments.refund], note: {any: 1}"))
    assert [m.name for m in load_suite("s.yaml").members] == ["acme.typed_limit"]


def test_a_suite_file_named_in_capitals_or_without_its_suffix(tmp_path, monkeypatch):
    """``OK.YAML`` is a file, not an unknown bundled name; a bare name is a
    bundled suite first, else a file of that name in the working folder."""
    body = "name: mine\nvalidators: [structure]\n"
    (tmp_path / "OK.YAML").write_text(body)
    (tmp_path / "mine").write_text(body)
    (tmp_path / "default").write_text(body)  # a bundled name wins over a file
    monkeypatch.chdir(tmp_path)
    assert load_suite("OK.YAML").name == "mine"
    assert load_suite("mine").name == "mine"
    assert load_suite("default").name == "default"
    with pytest.raises(SuiteError, match="unknown suite 'nothing'"):
        load_suite("nothing")


def test_a_missing_file_named_as_a_bundled_suite_says_how_to_name_it(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SuiteError) as info:
        load_suite("datasets/suites/strict.yaml")
    assert "the bundled suite of that name is --suite strict" in str(info.value)
