"""Shared output of the benchmarks (format in CONTRACT.md, 'Benchmarks').

A benchmark measures its own figure and, in the same run, a bare baseline
for the same work, then calls :func:`report`, which prints one JSON object
as the last line of its output.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any


def report(
    name: str,
    *,
    value: float | None,
    unit: str,
    baseline: float | None,
    goal: float,
    n: int,
    higher_is_better: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """Print the result line. ``goal`` bounds ``ratio``: at most ``goal``, or at
    least ``goal`` when ``higher_is_better``. ``baseline`` None: it could not
    be measured (say why in ``extra``); ``baseline`` and ``ratio`` are then
    null and the goal is not met; ``value`` None: nothing could be measured
    (the data is missing: say what in ``extra``). The line is strict JSON
    (no NaN, no Infinity)."""
    ratio = value / baseline if baseline and value is not None else None
    met = ratio is not None and (ratio >= goal if higher_is_better else ratio <= goal)
    line = {
        "name": name,
        "value": round(value, 6) if value is not None else None,
        "unit": unit,
        "baseline": round(baseline, 6) if baseline else None,
        "ratio": round(ratio, 4) if ratio is not None else None,
        "goal": goal,
        "goal_direction": ">=" if higher_is_better else "<=",
        "met": met,
        "n": n,
        **extra,
    }
    print(json.dumps(line, allow_nan=False), flush=True)
    return line


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` (noise only adds time)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def quick_flag() -> bool:
    return "--quick" in sys.argv[1:]
