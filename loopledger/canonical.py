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

__all__ = ["CanonicalJSONError", "canonical_json", "canonical_bytes", "content_id", "loads"]

_encode_string = json.encoder.encode_basestring  # type: ignore[attr-defined]


class CanonicalJSONError(ValueError):
    """The value cannot be written as canonical JSON; ``path`` names where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _number(value: float, path: str) -> str:
    if math.isnan(value) or math.isinf(value):
        raise CanonicalJSONError(path, f"{value!r} is not a JSON number")
    if value.is_integer():
        # The exact integer, whatever the magnitude, so that a float and an
        # int that compare equal also serialise equally.
        return str(int(value))
    return repr(value)


def _write(value: Any, out: list[str], path: str) -> None:
    # Order matters: bool is a subclass of int.
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_encode_string(value))
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_number(value, path))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key in sorted(value):
            if not isinstance(key, str):
                raise CanonicalJSONError(path, f"object key {key!r} is not a string")
            if not first:
                out.append(",")
            first = False
            out.append(_encode_string(key))
            out.append(":")
            _write(value[key], out, f"{path}.{key}")
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out, f"{path}[{index}]")
        out.append("]")
    else:
        raise CanonicalJSONError(path, f"{type(value).__name__} is not a JSON value")


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``."""
    out: list[str] = []
    _write(value, out, "$")
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
