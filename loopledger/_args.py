"""Checks of the public functions' arguments that every package shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def as_path(value: Any) -> Path | None:
    """``value`` as a path when it is one (a non-empty ``str``, or an
    ``os.PathLike`` of one), else None: each caller raises its own error,
    naming its argument."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    return Path(text) if isinstance(text, str) and text else None
