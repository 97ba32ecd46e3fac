"""The engine's clock. ``LOOPLEDGER_NOW`` (ISO-8601) pins it, so expiry and
deadlines can be tested without waiting."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

from ._errors import BadInput


def now() -> datetime:
    pinned = os.environ.get("LOOPLEDGER_NOW")
    if pinned:
        try:
            value = datetime.fromisoformat(pinned)
        except ValueError as exc:
            raise BadInput("LOOPLEDGER_NOW", f"expected an ISO-8601 time, got {pinned!r}") from exc
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.now(timezone.utc)


def pinned() -> bool:
    """Whether ``LOOPLEDGER_NOW`` holds the clock still: then no time passes
    for the engine, and nothing that waits on time (background work) ends."""
    return bool(os.environ.get("LOOPLEDGER_NOW"))


def now_us() -> int:
    """Microseconds since the Unix epoch, the journal's time unit."""
    if pinned():
        return to_us(now())
    return time.time_ns() // 1000


def to_us(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, tz=timezone.utc)
