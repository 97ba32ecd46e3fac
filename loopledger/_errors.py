"""What every error root of loopledger shares: it crosses a process
boundary whole (a worker's error reaches the caller as it was raised)."""

from __future__ import annotations

from typing import Any


class PicklableError(Exception):
    """An error rebuilt from its message and attributes when unpickled, not
    by calling its constructor again: constructors here take structured
    arguments (``where``, ``reason``, ...), which ``Exception`` does not keep
    in ``args``, so the default pickling could not rebuild them."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def _rebuild(cls: type[PicklableError], message: str, state: dict[str, Any]) -> PicklableError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error
