"""Canonical JSON and content ids.

Everything loopledger hashes (artifacts, canonical tool arguments, suite
versions) goes through :func:`canonical_json`, so that equal content always
gives equal bytes and therefore the same id, in any process and on any
machine:

* object keys sorted by code point, no insignificant whitespace;
* strings emitted as UTF-8, not ``\\uXXXX`` escapes (only the characters JSON
  requires to be escaped are escaped);
* numbers: an integral float is written as the exact integer it holds
  (``1.0`` and ``1`` are the same JSON number, and ``-0.0`` is ``0``); other
  floats use Python's shortest round-trip repr;
  NaN and infinities are refused, since JSON has no such numbers;
* tuples are arrays; booleans stay booleans (``true`` is not ``1``).

Anything else (sets, bytes, objects, non-string keys) is refused with
:class:`CanonicalJSONError` rather than guessed at.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

__all__ = ["Canonical", "CanonicalJSONError", "canonical_json", "canonical_bytes", "content_id", "loads"]

_encode_string = json.encoder.encode_basestring  # type: ignore[attr-defined]


class CanonicalJSONError(ValueError):
    """The value cannot be written as canonical JSON; ``path`` names where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class Canonical:
    """A value whose canonical JSON is computed once and then reused wherever
    the value is embedded (a tool registry snapshot in every context, say).
    It serialises exactly as the plain value would."""

    __slots__ = ("value", "text")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.text = canonical_json(value)


class _Refused(Exception):
    """Raised deep inside the writer; the public error, with its path, is
    made once at the top so the hot path carries no path strings."""

    def __init__(self, culprit: Any, reason: str) -> None:
        self.culprit = culprit
        self.reason = reason


def _number(value: float) -> str:
    if value != value or value in (math.inf, -math.inf):
        raise _Refused(value, f"{value!r} is not a JSON number")
    if value.is_integer():
        # The exact integer, whatever the magnitude, so that a float and an
        # int that compare equal also serialise equally.
        return int.__repr__(int(value))
    return float.__repr__(value)


def _write(value: Any, out: list[str]) -> None:
    # Exact-type checks first: they are the common case and much cheaper than
    # an isinstance chain. Subclasses (str enums, int flags) take the slow path.
    kind = type(value)
    if kind is str:
        out.append(_encode_string(value))
    elif kind is dict:
        _write_object(value, out)
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is list or kind is tuple:
        _write_array(value, out)
    elif kind is float:
        out.append(_number(value))
    elif kind is Canonical:
        out.append(value.text)
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_encode_string(str.__str__(value)))  # the string itself, not a subclass's __str__
    elif isinstance(value, int):
        out.append(int.__repr__(int(value)))
    elif isinstance(value, float):
        out.append(_number(float(value)))
    elif isinstance(value, dict):
        _write_object(value, out)
    elif isinstance(value, (list, tuple)):
        _write_array(value, out)
    else:
        raise _Refused(value, f"{type(value).__name__} is not a JSON value")


def _write_object(value: dict[Any, Any], out: list[str]) -> None:
    for key in value:
        if not isinstance(key, str):
            raise _Refused(value, f"object key {key!r} is not a string")
    out.append("{")
    first = True
    for key in sorted(value):
        if first:
            first = False
        else:
            out.append(",")
        out.append(_encode_string(str.__str__(key)))
        out.append(":")
        _write(value[key], out)
    out.append("}")


def _write_array(value: list[Any] | tuple[Any, ...], out: list[str]) -> None:
    out.append("[")
    first = True
    for item in value:
        if first:
            first = False
        else:
            out.append(",")
        _write(item, out)
    out.append("]")


def _path_to(root: Any, culprit: Any, path: str = "$") -> str | None:
    """Where ``culprit`` sits inside ``root`` (by identity), for the error message."""
    if root is culprit:
        return path
    if isinstance(root, dict):
        for key, item in root.items():
            found = _path_to(item, culprit, f"{path}.{key}")
            if found:
                return found
    elif isinstance(root, (list, tuple)):
        for index, item in enumerate(root):
            found = _path_to(item, culprit, f"{path}[{index}]")
            if found:
                return found
    return None


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``."""
    out: list[str] = []
    try:
        _write(value, out)
    except _Refused as refused:
        path = _path_to(value, refused.culprit) or "$"
        raise CanonicalJSONError(path, refused.reason) from None
    except RecursionError:
        raise CanonicalJSONError("$", "nested too deeply (or contains itself)") from None
    text = "".join(out)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise CanonicalJSONError("$", f"string is not valid Unicode ({exc.reason})") from exc
    return text


def canonical_bytes(value: Any) -> bytes:
    """The UTF-8 bytes of :func:`canonical_json`."""
    return canonical_json(value).encode("utf-8")


def content_id(value: Any) -> str:
    """sha256 (hex) of the canonical bytes: the id of an artifact or a hash of arguments."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def loads(text: str | bytes) -> Any:
    """Parse JSON text (canonical or not), refusing NaN and infinities."""

    def _refuse(constant: str) -> Any:
        raise CanonicalJSONError("$", f"{constant} is not a JSON number")

    return json.loads(text, parse_constant=_refuse)
