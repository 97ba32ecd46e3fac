"""Recorded text shown on a terminal: control characters written out."""

from __future__ import annotations

from loopledger._text import visible


def test_control_characters_are_written_out_newlines_and_tabs_kept() -> None:
    assert visible("a\x1b[31mred\x1b[0m\x07") == "a\\x1b[31mred\\x1b[0m\\x07"
    assert visible("line\n\tnext") == "line\n\tnext"
    assert visible("\x00\x7f\x85\x9b") == "\\x00\\x7f\\x85\\x9b"
    assert visible("café ünïcode ✓") == "café ünïcode ✓"
