"""Canonical JSON and content ids: equal content, equal bytes, equal ids;
different content, different ids."""

from __future__ import annotations

import enum
import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopledger.canonical import CanonicalJSONError, canonical_bytes, canonical_json, content_id, loads, strict_loads

# Deterministic: the same examples on every run.
property_test = settings(derandomize=True, deadline=None, max_examples=150)


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: numbers compare numerically (1 == 1.0), a
    boolean is not a number, arrays and objects compare structurally."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b  # exact: Python compares int and float without rounding
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return False


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(round)  # integral
    | st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(lambda f: float(round(f)))
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5),
    max_leaves=25,
)
# A small world, so that independent draws are often equal.
small = st.recursive(
    st.sampled_from([None, True, False, 0, 1, 0.0, -0.0, 1.0, 0.5, 2, "", "a", "1", "true"]),
    lambda children: st.lists(children, max_size=2) | st.dictionaries(st.sampled_from(["a", "b"]), children, max_size=2),
    max_leaves=4,
)


@st.composite
def twins(draw: st.DrawFn, value: Any) -> Any:
    """A value equal to ``value`` as JSON, spelled differently in Python:
    int <-> integral float, -0.0, tuples for lists, keys in another order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if abs(value) <= 2**53 and draw(st.booleans()):
            return float(value)
        return value
    if isinstance(value, float):
        if value == 0 and draw(st.booleans()):
            return -0.0 if math.copysign(1, value) > 0 else 0
        if value.is_integer() and draw(st.booleans()):
            return int(value)
        return value
    if isinstance(value, (list, tuple)):
        items = [draw(twins(item)) for item in value]
        return tuple(items) if draw(st.booleans()) else items
    keys = draw(st.permutations(list(value)))
    return {key: draw(twins(value[key])) for key in keys}


@st.composite
def shuffled(draw: st.DrawFn, value: Any) -> Any:
    """The same value with every object's keys inserted in another order."""
    if isinstance(value, dict):
        keys = draw(st.permutations(list(value)))
        return {key: draw(shuffled(value[key])) for key in keys}
    if isinstance(value, list):
        return [draw(shuffled(item)) for item in value]
    return value


@property_test
@given(json_values)
def test_canonical_json_is_stable(value: Any) -> None:
    text = canonical_json(value)
    assert canonical_json(loads(text)) == text
    assert json_equal(loads(text), value)
    assert canonical_bytes(value) == text.encode("utf-8")


@property_test
@given(st.data(), json_values)
def test_key_order_is_irrelevant(data: st.DataObject, value: Any) -> None:
    other = data.draw(shuffled(value))
    assert canonical_json(other) == canonical_json(value)
    assert content_id(other) == content_id(value)


@property_test
@given(st.data(), json_values)
def test_equal_values_spelled_differently_have_the_same_id(data: st.DataObject, value: Any) -> None:
    twin = data.draw(twins(value))
    assert json_equal(value, twin)
    assert content_id(twin) == content_id(value)


@property_test
@given(json_values, json_values)
def test_same_id_iff_equal_json(a: Any, b: Any) -> None:
    assert (content_id(a) == content_id(b)) == json_equal(a, b)


@property_test
@given(small, small)
def test_same_id_iff_equal_json_among_near_misses(a: Any, b: Any) -> None:
    assert (content_id(a) == content_id(b)) == json_equal(a, b)


@property_test
@given(st.data(), small)
def test_same_id_iff_equal_json_for_twins_and_neighbours(data: st.DataObject, a: Any) -> None:
    b = data.draw(twins(a) | small)
    assert (content_id(a) == content_id(b)) == json_equal(a, b)


finite_without_floats = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@property_test
@given(finite_without_floats)
def test_no_insignificant_whitespace_and_sorted_keys(value: Any) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected


def test_content_id_is_sha256_of_the_canonical_bytes() -> None:
    value = {"b": [1, 2.5, None], "a": "x"}
    assert canonical_json(value) == '{"a":"x","b":[1,2.5,null]}'
    assert content_id(value) == hashlib.sha256(b'{"a":"x","b":[1,2.5,null]}').hexdigest()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-0.0, "0"),
        (0.0, "0"),
        (1.0, "1"),
        (-3.0, "-3"),
        (1e16, "10000000000000000"),
        (1e300, str(int(1e300))),
        (0.1, "0.1"),
        (2.5, "2.5"),
        (1.5e-07, "1.5e-07"),
        (2**64, "18446744073709551616"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        ((1, (2,)), "[1,[2]]"),
        ({"b": 1, "a": 2, "B": 3}, '{"B":3,"a":2,"b":1}'),
        ({"\uffff": 1, "\U0001f600": 2, "z": 3}, '{"z":3,"\uffff":1,"\U0001f600":2}'),
    ],
)
def test_numbers_and_containers(value: Any, text: str) -> None:
    assert canonical_json(value) == text


def test_integral_float_is_written_as_the_exact_integer() -> None:
    assert canonical_json(1e300) == str(int(1e300))
    assert content_id(1.0) == content_id(1)
    assert content_id([-0.0]) == content_id([0])


def test_a_boolean_is_not_a_number() -> None:
    assert content_id(True) != content_id(1)
    assert content_id(False) != content_id(0)
    assert content_id({"x": True}) != content_id({"x": 1.0})


def test_unicode_is_kept_unescaped() -> None:
    value = {"é": "日本語 😀 ü", "emoji": "\U0001f600"}
    text = canonical_json(value)
    assert text == '{"emoji":"😀","é":"日本語 😀 ü"}'
    assert "\\u" not in text
    assert canonical_bytes(value) == text.encode("utf-8")


def test_only_what_json_requires_is_escaped() -> None:
    assert canonical_json('quote " backslash \\ newline \n tab \t nul \x00') == (
        '"quote \\" backslash \\\\ newline \\n tab \\t nul \\u0000"'
    )
    assert canonical_json("/") == '"/"'


class Colour(str, enum.Enum):
    RED = "red"


class Count(int, enum.Enum):
    ONE = 1


def test_subclasses_of_str_and_int_are_their_values() -> None:
    class Name(str):
        pass

    assert canonical_json(Name("x")) == '"x"'
    assert canonical_json({Name("k"): Name("v")}) == '{"k":"v"}'
    assert canonical_json(Colour.RED) == '"red"'
    assert canonical_json({Colour.RED: 1}) == '{"red":1}'
    assert canonical_json(Count.ONE) == "1"
    assert content_id(Colour.RED) == content_id("red")


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (float("nan"), "$"),
        ({"a": [1, {"b": float("nan")}]}, "$.a[1].b"),
        ([0, float("inf")], "$[1]"),
        ({"x": {"y": -math.inf}}, "$.x.y"),
        ({"a": {1: "one"}}, "$.a"),
        ({"a": {None: "none"}}, "$.a"),
        ({"a": {("t",): 1}}, "$.a"),
        ({"a": [{1, 2}]}, "$.a[0]"),
        ({"k": frozenset()}, "$.k"),
        ({"k": b"bytes"}, "$.k"),
        ({"k": object()}, "$.k"),
        ({"k": [1, 2, {"deep": [None, {3}]}]}, "$.k[2].deep[1]"),
    ],
)
def test_values_json_cannot_hold_are_refused_with_their_path(value: Any, path: str) -> None:
    with pytest.raises(CanonicalJSONError) as caught:
        canonical_json(value)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")
    assert isinstance(caught.value, ValueError)
    with pytest.raises(CanonicalJSONError):
        content_id(value)


def test_lone_surrogates_and_self_containing_values_are_refused() -> None:
    with pytest.raises(CanonicalJSONError):
        canonical_json({"s": "\ud800"})
    with pytest.raises(CanonicalJSONError):
        canonical_json(_self_containing())


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}'])
def test_loads_refuses_non_numbers(text: str) -> None:
    with pytest.raises(CanonicalJSONError):
        loads(text)


def test_loads_reads_any_json_text() -> None:
    assert loads('{ "b" : [1, 2.5], "a": "é" }') == {"a": "é", "b": [1, 2.5]}
    assert loads(b'{"a":1}') == {"a": 1}


@pytest.mark.parametrize(("text", "why"), [
    ("NaN", "NaN is not a JSON number"),
    ('{"a": [-Infinity]}', "-Infinity is not a JSON number"),
    ('{"a": 1e400}', "1e400 does not fit a double"),
    ('[-1.5e999]', "-1.5e999 does not fit a double"),
    ('{"k": 1, "k": 2}', "key 'k' given twice in one object"),
    ('[{"x": {"k": 1, "k": 1}}]', "key 'k' given twice in one object"),
])
def test_strict_loads_refuses_what_readers_read_differently(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("+", r"\+")):
        strict_loads(text)


def test_strict_loads_reads_plain_json_and_takes_a_stricter_key_check() -> None:
    assert strict_loads('{"b": [1, 2.5e300], "a": {"a": null}}') == {"a": {"a": None}, "b": [1, 2.5e300]}

    def no_empty_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if any(not key for key, _ in pairs):
            raise ValueError("empty key")
        return dict(pairs)

    with pytest.raises(ValueError, match="empty key"):
        strict_loads('{"": 1}', no_empty_keys)
    with pytest.raises(RecursionError):
        strict_loads("[" * 100_000 + "]" * 100_000)


# -- the fast writer (orjson) must give exactly the reference writer's text ------------

from loopledger import canonical as canonical_module  # noqa: E402

# Strings full of what a float token is made of, to tempt the float rewrite
# into strings.
tricky_text = st.text(alphabet=':,[]{}."\\-+eE0123456789 \n\x00é', max_size=12)
tricky_values = st.recursive(
    scalars | tricky_text | st.floats(allow_nan=False, allow_infinity=False, width=32),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=6) | tricky_text, children, max_size=5),
    max_leaves=30,
)


def _both(value: Any) -> tuple[str | None, str]:
    return canonical_module._fast(value), canonical_module._reference(value)


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@settings(derandomize=True, deadline=None, max_examples=600)
@given(st.lists(tricky_values, max_size=3) | st.dictionaries(tricky_text, tricky_values, max_size=4))
def test_the_fast_writer_gives_the_reference_text_or_nothing(value: Any) -> None:
    fast, reference = _both(value)
    assert fast is None or fast == reference
    assert canonical_json(value) == reference


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
def test_the_fast_writer_escapes_every_code_point_as_the_reference_does() -> None:
    for start in range(0, 0x110000, 0x800):
        chars = [chr(c) for c in range(start, start + 0x800) if not 0xD800 <= c <= 0xDFFF]
        if chars:
            fast, reference = _both(chars)
            assert fast == reference


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.0, "b": [-0.0, 1e16, 1e300, 1e-05, 1.5e-07, 5e-324, 0.1, 2.5, -3.0]},
        {"s": 'x:1.5,[2e5 "1.0" \\", 3.0'},
        [{"": 1.0}, "", 0.5, {"x": ""}],
        {"n": [9223372036854775807, -9223372036854775808, 18446744073709551615]},
    ],
)
def test_the_fast_writer_handles_floats_and_strings_that_look_like_them(value: Any) -> None:
    fast, reference = _both(value)
    assert fast == reference


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@settings(derandomize=True, deadline=None, max_examples=2000)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_orjson_writes_every_float_as_the_fast_writer_expects(value: float) -> None:
    """The fast writer finds float tokens by a fraction or a signed exponent."""
    import re

    text = canonical_module.orjson.dumps(value).decode()
    assert re.fullmatch(r"-?[0-9]+(\.[0-9]+)?(e[+-][0-9]+)?", text)
    assert "." in text or "e+" in text or "e-" in text
    assert canonical_module._fast([value]) == canonical_module._reference([value])


class _Plain(enum.Enum):
    ONE = 1


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [float("nan")]}, "$.a[0]"),
        ([_Plain.ONE], "$[0]"),
        ({"u": __import__("uuid").UUID(int=1)}, "$.u"),
        ({"d": __import__("datetime").date(2020, 1, 1)}, "$.d"),
    ],
)
def test_what_the_fast_writer_would_accept_is_still_refused(value: Any, path: str) -> None:
    with pytest.raises(CanonicalJSONError) as caught:
        canonical_json(value)
    assert caught.value.path == path


# Plain values: what orjson writes as the reference does once floats are
# rewritten. The fast writer must keep its text for them (not only be right
# when it answers): ints within 64 bits, strings without lone surrogates.
plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.text()
    | tricky_text
)
plain_values = st.recursive(
    plain_scalars,
    lambda children: st.lists(children, max_size=5) | st.lists(children, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=6) | tricky_text, children, max_size=5),
    max_leaves=30,
)
plain_with_floats = st.recursive(
    plain_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=6) | tricky_text, children, max_size=5),
    max_leaves=30,
)


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@settings(derandomize=True, deadline=None, max_examples=600)
@given(st.lists(plain_values, max_size=3) | st.dictionaries(tricky_text, plain_values, max_size=4))
def test_the_fast_writer_keeps_its_text_for_plain_values_tuples_included(value: Any) -> None:
    fast, reference = _both(value)
    assert fast == reference


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@settings(derandomize=True, deadline=None, max_examples=600)
@given(st.lists(plain_with_floats, max_size=3) | st.dictionaries(tricky_text, plain_with_floats, max_size=4))
def test_the_fast_writer_keeps_its_text_for_plain_values_with_floats(value: Any) -> None:
    fast, reference = _both(value)
    assert fast == reference


class _Coded(str, enum.Enum):
    """A str enum whose value is not its text: orjson writes the value, the reference the text."""

    def __new__(cls, text: str, code: int) -> _Coded:
        member = str.__new__(cls, text)
        member._value_ = code
        return member

    ALPHA = ("alpha", 1)


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@pytest.mark.parametrize(
    ("value", "text"),
    [
        ([_Coded.ALPHA], '["alpha"]'),
        ({"a": [{"b": (_Coded.ALPHA, 1.0)}]}, '{"a":[{"b":["alpha",1]}]}'),
        ({"c": Colour.RED, "n": Count.ONE}, '{"c":"red","n":1}'),
        ({"t": (1, "x", (None, True))}, '{"t":[1,"x",[null,true]]}'),
    ],
)
def test_enum_members_and_tuples_deep_inside_give_the_reference_text(value: Any, text: str) -> None:
    assert canonical_json(value) == text
    fast, reference = _both(value)
    assert reference == text
    assert fast is None or fast == text


@pytest.mark.skipif(canonical_module.orjson is None, reason="orjson is not installed")
@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, (2, float("inf"))]}, "$.a[1][1]"),
        ({"f": __import__("orjson").Fragment(b"1")}, "$.f"),
        ([[{"u": __import__("uuid").UUID(int=2)}]], "$[0][0].u"),
    ],
)
def test_what_orjson_writes_deep_inside_and_the_reference_refuses_is_refused(value: Any, path: str) -> None:
    assert canonical_module._fast(value) is None
    with pytest.raises(CanonicalJSONError) as caught:
        canonical_json(value)
    assert caught.value.path == path
