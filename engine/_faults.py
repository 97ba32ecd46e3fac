"""Testing hooks that kill the process at chosen points (CONTRACT.md).

``LOOPLEDGER_CRASH_AFTER_COMMITS=N`` kills the process with SIGKILL right
after its N-th journal commit; ``LOOPLEDGER_CRASH_AT=POINT`` at a named
point such as ``after_dispatch`` or ``before_terminal``. SIGKILL, not an
exception: nothing gets to clean up, exactly as in a real crash.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import NoReturn

_lock = threading.Lock()
_commits = 0

#: The named points ``LOOPLEDGER_CRASH_AT`` may name.
CRASH_POINTS = ("after_dispatch", "before_terminal")


def check_hooks() -> None:
    """Refuse a testing hook set to something it cannot mean, before any
    work starts (a bad value found after a commit would stop a run half-way)."""
    from ._clock import now
    from ._errors import BadInput

    limit = os.environ.get("LOOPLEDGER_CRASH_AFTER_COMMITS")
    if limit and not (limit.isdigit() and int(limit) >= 1):
        raise BadInput("LOOPLEDGER_CRASH_AFTER_COMMITS", f"expected a whole number >= 1, got {limit!r}")
    point = os.environ.get("LOOPLEDGER_CRASH_AT")
    if point and point not in CRASH_POINTS:
        raise BadInput("LOOPLEDGER_CRASH_AT", f"expected one of {', '.join(CRASH_POINTS)}, got {point!r}")
    now()  # LOOPLEDGER_NOW must parse


def die() -> NoReturn:
    """Kill this process with SIGKILL, now. Also used by the demo backends'
    ``crash_after_dispatch`` fault, so every injected crash is the same one."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")



def after_commit() -> None:
    """Called by a run store once a commit is durable."""
    global _commits
    limit = os.environ.get("LOOPLEDGER_CRASH_AFTER_COMMITS")
    if not limit:
        return
    with _lock:
        _commits += 1
        if _commits == int(limit):
            die()


def crash_point(name: str) -> None:
    """Die here if ``LOOPLEDGER_CRASH_AT`` names this point."""
    if os.environ.get("LOOPLEDGER_CRASH_AT") == name:
        die()
