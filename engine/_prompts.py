"""System prompt versions: one file per version, ``NAME.md``.

The bundled versions are package data (``prompts/NAME.md``); a data
directory may add its own in ``<home>/prompts/NAME.md``, which come first
(a file there named like a bundled version is the one used in that home).
A version's name picks the file; its identity is the SHA-256 of the file's
bytes, recorded beside the name on every context and candidate, so two runs
that both say ``v2`` can still be told apart when the file was edited in
between (or came from another home). A run reads its prompt once, at its
first step, and later steps carry that step's hash forward: editing a file
never changes a run midway.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ._errors import BadInput

#: The version used when a run names one that has no file (runs created
#: before prompt files existed, or by tools that do not pick one).
FALLBACK = "v1"

#: A version's name: it goes into run ids (``<scenario>.<version>.<hex>``),
#: so no dot, and nothing a file name could not hold.
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")


@dataclass(frozen=True)
class Prompt:
    version: str
    #: The system message sent to the model (the file without surrounding whitespace).
    text: str
    #: sha256 of the file's bytes, hex.
    sha256: str


def _folder() -> resources.abc.Traversable:
    return resources.files("loopledger.engine").joinpath("prompts")


def _names(files: Iterable[Any]) -> set[str]:
    return {f.name[:-3] for f in files if f.name.endswith(".md") and VERSION_NAME.match(f.name[:-3])}


def versions(own: Path | None = None) -> list[str]:
    """The prompt versions that have a file (bundled, or in ``own``), sorted."""
    names = _names(_folder().iterdir())
    if own is not None and own.is_dir():
        names |= _names(p for p in own.iterdir() if p.is_file())
    return sorted(names)


def _prompt(version: str, data: bytes) -> Prompt:
    return Prompt(version, data.decode("utf-8").strip(), hashlib.sha256(data).hexdigest())


@lru_cache(maxsize=64)
def _bundled(version: str) -> Prompt | None:
    path = _folder().joinpath(f"{version}.md")
    return _prompt(version, path.read_bytes()) if path.is_file() else None


def _read(version: str, own: Path | None = None) -> Prompt | None:
    if not isinstance(version, str) or not VERSION_NAME.match(version):
        return None
    if own is not None:
        path = own / f"{version}.md"
        if path.is_file():
            # Read each time: a home's files are the user's to edit between runs.
            data = path.read_bytes()
            try:
                return _prompt(version, data)
            except UnicodeDecodeError as exc:
                raise BadInput(str(path), f"expected UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return _bundled(version)


def load_prompt(version: str, own: Path | None = None) -> Prompt:
    """The prompt file of ``version`` (``own``, the home's prompt folder,
    first), or the fallback's (whose hash then says which text was sent)."""
    return _read(version, own) or _read(FALLBACK) or Prompt(version, "", hashlib.sha256(b"").hexdigest())


def check_prompt_version(version: str, own: Path | None = None) -> Prompt:
    """``--prompt-version`` must name a file, bundled or in ``own``."""
    if not isinstance(version, str) or not VERSION_NAME.match(version):
        raise BadInput("--prompt-version", f"expected a name of ASCII letters and digits, '_' and '-' (at most 64), "
                                           f"the name of a file NAME.md; got {version!r} "
                                           f"(known: {', '.join(versions(own))})")
    prompt = _read(version, own)
    if prompt is None:
        where = f" or a file {own / f'{version}.md'}" if own is not None else ""
        raise BadInput("--prompt-version", f"no prompt file for {version!r}; known: {', '.join(versions(own))}; "
                                           f"expected one of those{where}")
    return prompt
