"""What the worker processes of replays and imports share: they end with
the process that started them, and the folders they work in are removed by
a later run when the one that made them was killed.

A process killed outright (SIGKILL, out of memory) can neither stop its
pool nor remove its scratch folders. Each pool process asks the kernel to
kill it when its parent ends; each working folder is held under an
``flock`` while its owner lives, and the kernel drops the locks of a dead
process, which is how a later run tells a left-over folder from one in use.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def die_with_parent(parent: int) -> None:
    """A pool process's initializer: end this process when ``parent`` (the
    process that started the pool) ends."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        _watch(parent)  # elsewhere: look every second
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def _watch(parent: int) -> None:
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def remove_if_abandoned(folder: Path, lock: Path) -> bool:
    """Remove ``folder`` when nobody holds the ``flock`` on ``lock`` (a file
    in it, or the folder itself): its owner is gone. False when it is held,
    or the lock cannot be opened (a folder being made has none yet)."""
    import fcntl
    import shutil

    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Still the lock at that path: another sweeper may have removed the
        # folder since it was opened, and its owner made a new one there.
        held, there = os.fstat(fd), os.lstat(lock)
        if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
            os.close(fd)
            return False
    except OSError:
        os.close(fd)
        return False  # held: its owner is alive (or the folder is gone)
    try:
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(fd)
