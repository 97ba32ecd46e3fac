"""JSON Schema (draft 2020-12) as loopledger applies it: the ``jsonschema``
library, with its regular expressions bounded in time.

A schema's ``pattern`` may come from outside (a model's ``ask_user``
question, an imported tool registry) and be one that backtracks without
end on some text (``(a|a)*$`` against forty ``a`` and a ``!``): Python's
``re`` would hang the run, the reply or the replay. Here every keyword that
matches a pattern (``pattern``, ``patternProperties``,
``additionalProperties`` beside ``patternProperties``, and
``unevaluatedProperties``, which looks through the applicators for them)
matches with the ``regex`` module under a timeout; a match that does not
finish in :data:`PATTERN_TIMEOUT_S` is a validation error saying so.
Everything else, messages included, is the library's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema import _keywords as library_keywords
from jsonschema.exceptions import ValidationError

#: Seconds one match of a pattern may take.
PATTERN_TIMEOUT_S = 1.0


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``text``; None when it
    could not tell in time. (``concurrent=False``: ``regex`` otherwise gives
    up the interpreter lock for each match of a built-in string, and takes it
    back only when another busy thread lets go of it, some milliseconds
    later. The price: a pattern that runs away holds the lock, and stops the
    process's other threads, until its timeout; a match of microseconds, the
    common case, no longer waits for a switch.)"""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S, concurrent=False) is not None
    except TimeoutError:
        return None


def _unfinished(text: str, pattern: str) -> ValidationError:
    return ValidationError(f"{text[:80]!r} could not be matched against {pattern!r} within {PATTERN_TIMEOUT_S} s "
                           "(the pattern backtracks without end on it)")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = _search(pattern, instance)
    if found is None:
        yield _unfinished(instance, pattern)
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                        schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            found = _search(pattern, key)
            if found is None:
                yield _unfinished(key, pattern)
            elif found:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """The library's ``additionalProperties``, with the property names
    matched against ``patternProperties`` (joined into one pattern, as the
    library does) under the timeout."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    joined = "|".join(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in properties:
            continue
        found = _search(joined, key) if joined else False
        if found is None:
            yield _unfinished(key, joined)
        elif not found:
            extras.append(key)
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif not additional and extras:
        names = sorted(extras, key=str)
        if "patternProperties" in schema:
            verb = "does" if len(names) == 1 else "do"
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{', '.join(repr(each) for each in names)} {verb} not match any of the regexes: "
                                  f"{patterns}")
        else:
            listed = ", ".join(repr(each) for each in names)
            yield ValidationError(f"Additional properties are not allowed ({listed} "
                                  f"{'was' if len(names) == 1 else 'were'} unexpected)")


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any,
                            schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    """The library's ``unevaluatedProperties``, once every pattern it will
    try on this object's names (``patternProperties`` here and in the
    schemas applied in place: ``$ref``, ``allOf``, ``if`` and their kin) has
    been matched under the timeout. A name that cannot be matched in time is
    an error, and the library is not asked."""
    if not validator.is_type(instance, "object"):
        return
    for pattern in _in_place_patterns(validator, schema):
        for key in instance:
            if _search(pattern, key) is None:
                yield _unfinished(key, pattern)
                return
    yield from library_keywords.unevaluatedProperties(validator, unevaluated, instance, schema)


_IN_PLACE = ("allOf", "anyOf", "oneOf", "if", "then", "else", "not", "dependentSchemas", "$ref", "$dynamicRef")


def _in_place_patterns(validator: Any, schema: Any) -> set[str]:
    """The ``patternProperties`` patterns of ``schema`` and of every schema
    applied to the same instance, references followed once each."""
    patterns: set[str] = set()
    seen: set[int] = set()
    todo = [schema]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        patterns.update(p for p in node.get("patternProperties", {}) if isinstance(p, str))
        for keyword in _IN_PLACE:
            value = node.get(keyword)
            if keyword in ("$ref", "$dynamicRef") and isinstance(value, str):
                try:
                    todo.append(validator._resolver.lookup(value).contents)
                except Exception:  # noqa: BLE001 - the library reports an unresolvable reference itself
                    pass
            elif isinstance(value, list):
                todo.extend(value)
            elif keyword == "dependentSchemas" and isinstance(value, dict):
                todo.extend(value.values())
            elif isinstance(value, dict):
                todo.append(value)
    return patterns


#: Draft 2020-12 with bounded patterns (use it where ``Draft202012Validator`` would be).
BoundedValidator = validators.extend(Draft202012Validator, {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
})


def unusable(schema: Any) -> str | None:
    """Why ``schema`` cannot judge anything (None when it can): not a 2020-12
    schema, a pattern that is not a regular expression, or a ``$ref`` that
    resolves to nothing here (no schema is fetched from elsewhere)."""
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    except SchemaError as exc:
        return exc.message
    if schema is False or (isinstance(schema, dict) and schema.get("not") in ({}, True)):
        return "it accepts no value at all"
    for where, keyword, value in _keywords(schema, "$"):
        if keyword in ("pattern", "patternProperties"):
            for pattern in (value if keyword == "patternProperties" else {value: None}):
                try:
                    regex.compile(pattern)
                except regex.error as exc:
                    return f"{where}: {pattern!r} is not a regular expression ({exc})"
        elif keyword == "$ref":
            try:
                _resolver(schema).lookup(value)
            except Exception as exc:  # noqa: BLE001 - referencing's Unresolvable and its kin
                return f"{where}: $ref {value!r} resolves to nothing here ({type(exc).__name__})"
    return None


def _resolver(schema: Any) -> Any:
    """Resolves references as validation does: from the schema itself (its
    root), and the metaschemas ``jsonschema`` ships; nothing is fetched."""
    from jsonschema_specifications import REGISTRY
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(schema)
    base = root.id() or ""
    return REGISTRY.with_resource(base, root).resolver(base_uri=base)


def _keywords(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """(path, keyword, value) of every ``pattern``, ``patternProperties``
    and ``$ref`` in a schema, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("pattern", "$ref") and isinstance(value, str):
                yield where, key, value
            elif key == "patternProperties" and isinstance(value, dict):
                yield where, key, value
            yield from _keywords(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _keywords(value, f"{where}[{i}]")
