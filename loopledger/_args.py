"""Checks of the public functions' arguments that every package shares."""

from __future__ import annotations

import os
import stat
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any


def as_path(value: Any) -> Path | None:
    """``value`` as a path when it is one (a non-empty ``str``, or an
    ``os.PathLike`` of one), else None: each caller raises its own error,
    naming its argument."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    return Path(text) if isinstance(text, str) and text else None


def not_a_file(path: Path, expected: str) -> str:
    """Why ``path``, given where a file or a folder was expected, is
    neither: missing, a dangling link, unreadable, or something else (a
    device such as ``/dev/null``, a named pipe, a socket)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a symbolic link to no file or folder" if path.is_symlink() else "no such file or folder"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "of another kind")
    return f"exists but is {kind}, not a regular file; expected {expected}"


class UnreadableEntry(Exception):
    """Something under a searched folder that cannot be read: a folder
    without permission, a link to nothing. Searching on without it would
    quietly leave its files out."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def files_under(folder: Path, patterns: tuple[str, ...], expected: str) -> list[Path]:
    """The files under ``folder`` (at any depth) matching any of
    ``patterns``, sorted, leaving out hidden ones: a name starting with
    ``.``, or inside such a folder (an editor's lock or backup file,
    ``.git``, ``.venv``). Links to folders are not followed.
    :class:`UnreadableEntry` for a folder that cannot be listed, or a
    matching name that is not a readable file (a link to nothing, a pipe):
    ``expected`` says what it should have been."""

    def unreadable(exc: OSError) -> None:
        raise UnreadableEntry(Path(exc.filename or folder), f"cannot read: {exc.strerror or exc}")

    found = []
    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or not any(fnmatchcase(name, p) for p in patterns):
                continue
            path = Path(dirpath, name)
            if not path.is_file():
                raise UnreadableEntry(path, not_a_file(path, expected))
            found.append(path)
    return sorted(found)
