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
