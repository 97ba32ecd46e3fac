"""JSON Schema (draft 2020-12) as loopledger applies it: the ``jsonschema``
library, with its regular expressions bounded in time.

A schema's ``pattern`` may come from outside (a model's ``ask_user``
question, an imported tool registry) and be one that backtracks without
end on some text (``(a|a)*$`` against forty ``a`` and a ``!``): Python's
``re`` would hang the run, the reply or the replay. Here ``pattern`` and
``patternProperties`` match with the ``regex`` module under a timeout; a
match that does not finish in :data:`PATTERN_TIMEOUT_S` is a validation
error saying so. Everything else, messages included, is the library's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

#: Seconds one match of a pattern may take.
PATTERN_TIMEOUT_S = 1.0


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``text``; None when it
    could not tell in time."""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
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


#: Draft 2020-12 with bounded patterns (use it where ``Draft202012Validator`` would be).
BoundedValidator = validators.extend(Draft202012Validator, {"pattern": _pattern,
                                                            "patternProperties": _pattern_properties})


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
