"""Checks of validator and detector params, done once when a suite is built
(never per candidate), each raising :class:`ParamError` naming the param."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._errors import ParamError


def int_param(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParamError(name, f"an integer >= {minimum}", value)
    return value


def bool_param(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParamError(name, "true or false", value)
    return value


def str_list_param(name: str, value: Any, allowed: Iterable[str] | None = None) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ParamError(name, "a list of strings", value)
    if allowed is not None:
        allowed = tuple(allowed)
        for v in value:
            if v not in allowed:
                raise ParamError(name, f"names from {', '.join(allowed)}", v)
    return tuple(value)


def choice_param(name: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ParamError(name, f"one of {', '.join(allowed)}", value)
    return value
