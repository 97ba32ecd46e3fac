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

Patterns are matched as given (:func:`glob_matches`); :func:`canonical_glob`
writes one the way a person means it (``/payments/``, ``payments`` and
``./payments/**`` are all ``payments/**``). Scenario files normalise their
``forbidden_paths`` with it when they are loaded, so the contract a run
records (and a replay reads) already holds the canonical patterns.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ._errors import PathRejected

__all__ = ["canonical_glob", "canonical_workspace_path", "glob_matches"]

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


def _is_glob(segment: str) -> bool:
    return "*" in segment or "?" in segment


def canonical_glob(pattern: str) -> str:
    """Return the canonical form of a workspace path pattern, or raise
    :class:`PathRejected`.

    Read like a path: a leading ``/`` or ``./`` means the workspace root,
    empty and ``.`` segments go, ``..`` takes back the segment before it.
    A trailing ``/`` means the folder and everything under it (``dir/`` is
    ``dir/**``), and so does a pattern without glob characters, as in
    ``.gitignore``: ``payments`` names a file or a folder and everything
    under it (``payments/**``, which covers ``payments`` itself). A pattern
    with ``*`` or ``?`` otherwise stays as written (``*.env`` is top-level
    files only). The root itself (``/``, ``.``) is ``**``. The result is a
    fixed point. Rejected: a non-string, an empty pattern, a NUL byte, a
    backslash, a drive letter, a ``..`` that climbs above the root or over a
    segment with glob characters: none could ever match a canonical path.
    """
    if not isinstance(pattern, str):
        raise PathRejected(repr(pattern), "not a string")
    pat = pattern.strip()
    if pat == "":
        raise PathRejected(pattern, "empty pattern")
    if "\x00" in pat:
        raise PathRejected(pattern, "contains a NUL byte")
    if "\\" in pat:
        raise PathRejected(pattern, "contains a backslash; workspace paths are separated by '/'")
    if _DRIVE.match(pat):
        raise PathRejected(pattern, "a drive letter; workspace paths are relative to the root")
    folder = pat.endswith("/")
    parts: list[str] = []
    for segment in pat.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                raise PathRejected(pattern, "escapes the workspace root")
            if _is_glob(parts[-1]):
                raise PathRejected(pattern, f"'..' after {parts[-1]!r}, a segment with glob characters")
            parts.pop()
        else:
            parts.append(segment)
    if not parts:
        return "**"
    if (folder or not any(_is_glob(part) for part in parts)) and parts[-1] != "**":
        parts.append("**")
    return "/".join(parts)


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

    The pattern is matched as given, except that a leading ``./`` is
    dropped (``./payments/**`` is ``payments/**``): ``payments/``,
    ``payments`` and ``/payments/**`` match no file under ``payments``
    here. :func:`canonical_glob` writes such patterns as they are meant; a
    change here would change recorded decisions on replay.
    """
    pat = pattern.strip()
    while pat.startswith("./"):
        pat = pat[2:]
    return _glob_regex(pat).match(canonical_path) is not None
