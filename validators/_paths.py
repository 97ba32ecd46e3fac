"""Canonical workspace paths and path globs.

Authorisation must judge the path the tool will actually touch, not the
string the model wrote: ``./exports/../payments/config.json`` is
``payments/config.json``, and a policy on ``payments/**`` must see that.
The engine canonicalises with the same function before it dispatches, so the
path that was authorised is the path that is used.

Canonical form: relative to the workspace root, ``/``-separated, no ``.`` or
``..`` segments, no empty segments, no trailing slash; the root itself is
``.``. Purely lexical (no file system access): symlinks are the sandbox's
business, and a validator may not do I/O.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ._errors import PathRejected

__all__ = ["canonical_workspace_path", "glob_matches"]

_DRIVE = re.compile(r"^[A-Za-z]:")


def canonical_workspace_path(path: str) -> str:
    """Return the canonical form of ``path`` or raise :class:`PathRejected`.

    Rejected: a non-string, an empty string, a NUL byte, a backslash (a
    separator on one OS and a file-name character on another, so its meaning
    is ambiguous), an absolute path (``/x``, ``C:x``) and any ``..`` that
    climbs above the root.
    """
    if not isinstance(path, str):
        raise PathRejected(repr(path), "not a string")
    if path == "":
        raise PathRejected(path, "empty path")
    if "\x00" in path:
        raise PathRejected(path, "contains a NUL byte")
    if "\\" in path:
        raise PathRejected(path, "contains a backslash")
    if path.startswith("/") or _DRIVE.match(path):
        raise PathRejected(path, "absolute path; workspace paths are relative to the root")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise PathRejected(path, "escapes the workspace root")
            parts.pop()
        else:
            parts.append(segment)
    return "/".join(parts) if parts else "."


@lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    # `**` spans segments, `*` and `?` stay inside one; `dir/**` also covers
    # `dir` itself, because forbidding a folder's contents while allowing the
    # folder to be replaced would be a hole.
    out: list[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        if pattern.startswith("/**", i) and i + 3 == n:
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_matches(pattern: str, canonical_path: str) -> bool:
    """True when the canonical path matches the glob (``**``, ``*``, ``?``).

    The pattern is canonicalised lexically too (``./payments/**`` is
    ``payments/**``) so that a policy written loosely still applies.
    """
    pat = pattern.strip()
    while pat.startswith("./"):
        pat = pat[2:]
    return _glob_regex(pat).match(canonical_path) is not None
