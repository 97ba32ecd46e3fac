"""The one way the commands make rich's console for what they print.

Tables of runs keep to one line a row when printed into a pipe or a CI log
(rich would cut them at 80 columns), and a reader that goes away (``| head``)
ends the command through ``main()``'s broken-pipe exit (141, as a shell says
of a command SIGPIPE ended), not through rich's own ``SystemExit(1)``, which
``run`` and ``show`` use for a failed check and an unknown run.
"""

from __future__ import annotations

import sys
from typing import Any

_made: list[type] = []


def console(*, wide: bool = True) -> Any:
    """A rich console on stdout; ``wide``: 200 columns when not a terminal."""
    if not _made:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                raise BrokenPipeError

        _made.append(_Console)
    return _made[0](width=None if not wide or sys.stdout.isatty() else 200)
