"""JSON Schema as loopledger applies it (validators/_jsonschema.py): the
library's verdicts and messages, with patterns bounded in time."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from validators_helpers import steps_of_another_thread_during

from loopledger.validators._jsonschema import PATTERN_TIMEOUT_S, BoundedValidator, unusable

SCHEMAS = [
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
    {"type": "object", "patternProperties": {"^x-": {"type": "integer"}, "^y": {"type": "string"}},
     "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "pattern": "a|b"}},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
    {"$defs": {"x": {"patternProperties": {"^x": {"type": "integer"}}}},
     "allOf": [{"$ref": "#/$defs/x"}], "properties": {"b": {}}, "unevaluatedProperties": False},
    {"if": {"patternProperties": {"^i": {"type": "string"}}}, "then": {"properties": {"t": {}}},
     "unevaluatedProperties": {"type": "boolean"}},
]


@settings(max_examples=200, deadline=None)
@given(instance=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                             lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6))
def test_same_errors_as_the_library_on_patterns_that_finish(instance: object) -> None:
    for schema in SCHEMAS:
        mine = sorted((list(e.path), e.message) for e in BoundedValidator(schema).iter_errors(instance))
        theirs = sorted((list(e.path), e.message) for e in Draft202012Validator(schema).iter_errors(instance))
        assert mine == theirs, (schema, instance)


def test_a_pattern_that_backtracks_without_end_is_cut_off() -> None:
    began = time.monotonic()
    errors = [e.message for e in BoundedValidator({"type": "string", "pattern": "(a|a)*$"}).iter_errors("a" * 40 + "!")]
    assert time.monotonic() - began < PATTERN_TIMEOUT_S * 5
    assert len(errors) == 1 and "could not be matched against '(a|a)*$' within" in errors[0]
    keys = BoundedValidator({"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}}})
    assert ["could not be matched" in e.message for e in keys.iter_errors({"a" * 40 + "!": 1})] == [True]


def test_a_bounded_match_keeps_the_interpreter_lock() -> None:
    """``regex`` under a timeout gives the lock up for each match unless told
    not to; in the engine's threads each pattern check then cost a switch to
    another run's thread (about 0.5 ms against 4 µs)."""
    slow = BoundedValidator({"type": "string", "pattern": "(a|a)*$"})
    assert steps_of_another_thread_during(lambda: list(slow.iter_errors("a" * 40 + "!"))) < 1_000_000


def test_names_matched_for_additional_and_unevaluated_properties_are_cut_off_too() -> None:
    slow = {"a" * 40 + "!": 1}
    for schema in (
        {"patternProperties": {"^(a|aa)+$": {}}, "additionalProperties": False},
        {"allOf": [{"$ref": "#/$defs/p"}], "$defs": {"p": {"patternProperties": {"^(a|aa)+$": {}}}},
         "unevaluatedProperties": False},
    ):
        began = time.monotonic()
        messages = [e.message for e in BoundedValidator(schema).iter_errors(slow)]
        assert time.monotonic() - began < PATTERN_TIMEOUT_S * 8, schema
        assert messages and all("could not be matched" in m for m in messages), (schema, messages)


def test_unusable_names_what_no_answer_could_fit() -> None:
    assert unusable({"type": "string", "pattern": "^a"}) is None
    assert unusable({"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}}) is None
    assert unusable({"$ref": "https://json-schema.org/draft/2020-12/schema"}) is None  # shipped, not fetched
    assert unusable({"type": "nonsense"}) is not None
    assert unusable({"items": {"pattern": "("}}) == "'(' is not a 'regex'"
    assert unusable({"properties": {"a": {"$ref": "#/$defs/nope"}}}).startswith(
        "$.properties.a: $ref '#/$defs/nope' resolves to nothing here")
