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

Two writers, one output. The reference writer is the pure-Python one below.
When ``orjson`` is installed, :func:`canonical_json` first tries it and
keeps its text only when that text is provably the reference writer's:

* orjson sorts keys by code point, writes no whitespace, escapes exactly the
  characters ``json.encoder.encode_basestring`` escapes (checked for every
  code point by the tests), writes ints as Python does, and tuples, like
  lists, as arrays;
* it refuses what the reference refuses except a few types: subclasses of
  str, int, dict and list, dataclasses and datetimes are handed to a
  ``default`` hook that refuses them too, so they take the reference path;
  it refuses keys that are not exactly str;
* what it accepts and the reference refuses or writes otherwise (NaN and
  infinities, which it writes as ``null``; enum members; UUIDs; orjson
  fragments) is found by a walk of the value's containers after orjson
  has written it: the text is kept only when every value in them is a
  str, int, bool, None, finite float, dict, list or tuple (exact types).
  The walk looks at each value once, not at each byte: a long string
  costs it no more than a short one;
* floats are the one difference of form: orjson writes ``1.0``, ``1e-05``
  as ``1.0``, ``0.00001``. Its float text is the shortest round-trip one,
  so when the walk found a float, every float token outside strings is
  parsed back to the exact same float and rewritten by the reference rule;
  that text is then kept only when parsing it gives a value equal to the
  input (a tuple reads back as a list, which is not equal: such values
  take the reference path).

Anything else takes the reference path, which also makes every error.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; the reference writer suffices
    orjson = None  # type: ignore[assignment]

__all__ = ["Canonical", "CanonicalJSONError", "canonical_json", "canonical_bytes", "content_id", "is_unicode",
           "loads"]

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


#: Finding float tokens cheaply (``re`` scans a byte at a time, several
#: times slower than these C loops), in ``data`` read through this table:
#: digits as ``0``, signs as ``+``, ``.`` as itself, exponents as ``e``,
#: anything else as a space. orjson writes a float with a fraction
#: (``0.0``) or a signed exponent (``0e+0``, ``0e-0``), so every float token
#: is a run between spaces holding ``0.`` or ``0e+``; outside strings nothing
#: else does. One inside a string (``"v1.2"``) is told apart by the parity of
#: the quotes before it.
_TOKEN_TABLE = bytes(
    ord("0") if chr(b) in "0123456789" else ord("+") if chr(b) in "+-" else ord(".") if chr(b) == "."
    else ord("e") if chr(b) in "eE" else ord(" ") for b in range(256)
)
#: What precedes a value in orjson's text.
_VALUE_START = frozenset(b":,[")
if orjson is not None:
    _FAST_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                     | orjson.OPT_PASSTHROUGH_DATETIME)
    _fast_dumps = orjson.dumps
    _fast_loads = orjson.loads
_FastError = (TypeError, ValueError)  # orjson.JSONEncodeError is a TypeError
#: The scalar types whose orjson text is the reference writer's.
_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})
_isfinite = math.isfinite


def _refuse_in_fast_path(value: Any) -> Any:
    raise TypeError("left to the reference writer")


def _next_float(shape: bytes, at: int) -> int:
    """Where the next float token may be, from ``at``; -1 if nowhere."""
    dot = shape.find(b"0.", at)
    exponent = shape.find(b"0e+", at, dot if dot >= 0 else len(shape))
    return exponent if exponent >= 0 else dot


def _rewrite_floats(data: bytes, shape: bytes, found: int) -> bytes:
    """orjson's text with every float token outside strings written by the
    reference rule (orjson's float text reads back as the exact float).
    ``shape`` is ``data`` read through ``_TOKEN_TABLE``; ``found``, the first
    possible float token in it."""
    # Escaped backslashes and quotes are masked (same length), so every quote
    # left delimits a string.
    masked = data.replace(b"\\\\", b"  ").replace(b'\\"', b"  ") if b"\\" in data else data
    out: list[bytes] = []
    done = counted = inside = 0
    while found >= 0:
        start = shape.rfind(b" ", 0, found) + 1
        # Outside strings a number starts a value, after ":", "," or "[".
        if data[start - 1] in _VALUE_START:
            inside ^= masked.count(b'"', counted, start) & 1
            counted = start
        else:
            inside = 1
        if inside:
            # In a string ("v1.2"): go on after its closing quote.
            counted = masked.find(b'"', start) + 1
            inside = 0
            found = _next_float(shape, counted)
            continue
        end = shape.find(b" ", found)
        if end < 0:
            end = len(shape)
        out.append(data[done:start])
        out.append(_number(float(data[start:end])).encode("ascii"))
        done = end
        found = _next_float(shape, end)
    if not out:
        return data
    out.append(data[done:])
    return b"".join(out)


class _NotPlain(Exception):
    """A value orjson wrote that the reference writer refuses or writes otherwise."""


def _holds_floats(container: Any) -> bool:
    """Whether the dict, list or tuple ``container`` holds a float, at any
    depth; :class:`_NotPlain` when it holds anything but str, int, bool,
    None, finite floats and (exactly) dicts, lists and tuples. Its keys are
    not looked at: orjson refuses every key that is not exactly a str."""
    floats = False
    for item in container.values() if type(container) is dict else container:
        kind = type(item)
        if kind in _PLAIN_SCALARS:
            continue
        if kind is dict or kind is list or kind is tuple:
            if _holds_floats(item):
                floats = True
        elif kind is float and _isfinite(item):
            floats = True
        else:
            raise _NotPlain
    return floats


def _fast(value: Any) -> str | None:
    """orjson's text when it is exactly the reference writer's, else None."""
    try:
        data = _fast_dumps(value, default=_refuse_in_fast_path, option=_FAST_OPTIONS)
    except _FastError:
        return None
    try:
        floats = _holds_floats(value)
    except (_NotPlain, RecursionError):
        return None
    if floats:
        shape = data.translate(_TOKEN_TABLE)
        found = _next_float(shape, 0)
        if found >= 0:
            data = _rewrite_floats(data, shape, found)
        try:
            if _fast_loads(data) != value:
                return None
        except _FastError:  # pragma: no cover - orjson reads what it writes
            return None
    return data.decode("utf-8")


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value``."""
    kind = type(value)
    if (kind is dict or kind is list) and orjson is not None:
        if not value:
            return "{}" if kind is dict else "[]"
        text = _fast(value)
        if text is not None:
            return text
    return _reference(value)


def _reference(value: Any) -> str:
    """The reference writer: the definition of the canonical form."""
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


def is_unicode(text: str) -> bool:
    """Whether ``text`` is Unicode text, one with a UTF-8 form: a Python
    string can hold lone surrogates (``\\uD800`` escapes in JSON or YAML),
    which no journal, Parquet file or canonical JSON text can."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def canonical_bytes(value: Any) -> bytes:
    """The UTF-8 bytes of :func:`canonical_json`."""
    return canonical_json(value).encode("utf-8")


def content_id(value: Any) -> str:
    """sha256 (hex) of the canonical bytes: the id of an artifact or a hash of arguments."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads`` that refuses a key given
    twice in one object (ValueError): Python keeps the last value silently,
    another reader may keep the first, so such text means two things."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key!r} given twice in one object")
            seen.add(key)
    return value


def loads(text: str | bytes) -> Any:
    """Parse JSON text (canonical or not), refusing NaN and infinities."""
    return json.loads(text, parse_constant=_not_a_number)


def strict_loads(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] = unique_keys) -> Any:
    """JSON text as every reader reads it, else ValueError: ``NaN`` and
    ``Infinity`` (Python's reader takes them), a number too large for a
    double (``1e400`` would be read as infinity), a key given twice in one
    object (``object_pairs_hook`` may check more). Nesting too deep to read
    raises RecursionError."""
    return json.loads(text, parse_constant=_not_a_number, parse_float=_finite, object_pairs_hook=object_pairs_hook)


def _not_a_number(constant: str) -> Any:
    raise CanonicalJSONError("$", f"{constant} is not a JSON number")


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise CanonicalJSONError("$", f"{token} does not fit a double")
    return value
