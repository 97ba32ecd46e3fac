"""Recorded text shown on a terminal: as written, but never as control.

A model's words, a tool's arguments, an imported trace or a person's note
may hold control characters; printed raw, an escape sequence would drive
the reader's terminal (colours, its title, worse). They are shown as
``\\xNN`` (``\\u00NN`` for C1), newlines and tabs kept.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written
    out as an escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def plain_cells(*cells: Any) -> list[Any]:
    """Table cells for rich shown as written, never read as markup (recorded
    text may hold ``[/x]``, which rich even fails on), control characters
    written out; None is an empty cell, and a cell already a rich ``Text``
    (styled by the caller) is kept."""
    from rich.text import Text

    return [cell if isinstance(cell, Text) else Text(visible("" if cell is None else str(cell))) for cell in cells]
