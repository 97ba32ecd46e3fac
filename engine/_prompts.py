"""System prompt versions: one file per version, ``prompts/NAME.md``.

A version's name picks the file; its identity is the SHA-256 of the file's
bytes, recorded beside the name on every context and candidate, so two runs
that both say ``v2`` can still be told apart when the file was edited in
between. A run reads its prompt once, at its first step, and later steps
carry that step's hash forward: editing a file never changes a run midway.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ._errors import BadInput

#: The version used when a run names one that has no file (runs created
#: before prompt files existed, or by tools that do not pick one).
FALLBACK = "v1"


@dataclass(frozen=True)
class Prompt:
    version: str
    #: The system message sent to the model (the file without surrounding whitespace).
    text: str
    #: sha256 of the file's bytes, hex.
    sha256: str


def _folder() -> resources.abc.Traversable:
    return resources.files("loopledger.engine").joinpath("prompts")


def versions() -> list[str]:
    """The prompt versions that have a file, sorted."""
    return sorted(f.name[:-3] for f in _folder().iterdir() if f.name.endswith(".md"))


@lru_cache(maxsize=64)
def _read(version: str) -> Prompt | None:
    if not version or "/" in version or "\\" in version or version.startswith("."):
        return None
    path = _folder().joinpath(f"{version}.md")
    if not path.is_file():
        return None
    data = path.read_bytes()
    return Prompt(version, data.decode("utf-8").strip(), hashlib.sha256(data).hexdigest())


def load_prompt(version: str) -> Prompt:
    """The prompt file of ``version``, or the fallback's (whose hash then
    says which text was sent)."""
    return _read(version) or _read(FALLBACK) or Prompt(version, "", hashlib.sha256(b"").hexdigest())


def check_prompt_version(version: str) -> Prompt:
    """``--prompt-version`` must name a file."""
    prompt = _read(version)
    if prompt is None:
        raise BadInput("--prompt-version", f"no prompt file for {version!r}; known: {', '.join(versions())}")
    return prompt
