"""Deterministic reduction of tool results for the model's context.

A tool result is stored whole, as an immutable artifact. What goes back to
the model (and into the operation's event) is :func:`reduce_result`'s
summary: the same result always gives the same summary, so a replay sees
the context the run saw. Every summary carries ``full_artifact``, which the
engine fills with the id of the whole result, and ``reducer``, the rules'
version: changing a rule is a new version, not an edit.

Rules
-----
``tests.run`` (a pytest log): counts from the final summary line (falling
back to counting status lines), the failing tests with the first ``E``
line of each (at most :data:`MAX_FAILURES`), and the last
:data:`TAIL_LINES` lines of the log.

Everything else: kept as is when its canonical JSON is at most
:data:`SMALL_BYTES`; otherwise long strings keep their head and tail and
long lists their first :data:`MAX_ITEMS` items, each cut marked in place.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from loopledger.canonical import canonical_bytes

__all__ = ["REDUCER_VERSION", "reduce_result"]

REDUCER_VERSION = "1"
SMALL_BYTES = 4096
MAX_FAILURES = 20
TAIL_LINES = 20
MAX_ITEMS = 20
_HEAD_CHARS = 512
_TAIL_CHARS = 256

_STATUS_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_FAILURE_HEADING = re.compile(r"^_{3,} (\S+) _{3,}$")
_SHORT_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)(?: - (.*))?$")
_FINAL = re.compile(r"^=+ (.+?) in ([0-9.]+)s(?: \([^)]*\))? =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


def reduce_result(tool: str, result: Any) -> dict[str, Any]:
    """The summary of ``result`` for the model: small, deterministic, with a
    ``full_artifact`` slot (None here) for the id of the whole result."""
    if tool == "tests.run" and isinstance(result, dict) and isinstance(result.get("log"), str):
        return _reduce_test_log(result)
    size = len(canonical_bytes(result))
    if size <= SMALL_BYTES:
        return {"reducer": f"generic/{REDUCER_VERSION}", "tool": tool, "result": result, "truncated": False,
                "full_artifact": None}
    return {"reducer": f"generic/{REDUCER_VERSION}", "tool": tool, "result": _shrink(result), "truncated": True,
            "size_bytes": size, "full_artifact": None}


def _reduce_test_log(result: dict[str, Any]) -> dict[str, Any]:
    log: str = result["log"]
    lines = log.splitlines()
    statuses: dict[str, int] = {}
    failing: list[str] = []
    errors: dict[str, str] = {}
    short: dict[str, str] = {}
    final: str | None = None
    duration: float | None = None
    current: str | None = None
    for line in lines:
        match = _STATUS_LINE.match(line)
        if match:
            status = match.group(2)
            statuses[status] = statuses.get(status, 0) + 1
            if status in ("FAILED", "ERROR"):
                failing.append(match.group(1))
            continue
        heading = _FAILURE_HEADING.match(line)
        if heading:
            current = heading.group(1)
            continue
        if current is not None and line.startswith("E ") and current not in errors:
            errors[current] = line[1:].strip()
            continue
        short_match = _SHORT_FAILED.match(line)
        if short_match:
            short[short_match.group(1)] = (short_match.group(2) or "").strip()
            continue
        final_match = _FINAL.match(line)
        if final_match:
            final, duration = final_match.group(1), float(final_match.group(2))

    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if final is not None:
        for number, word in _COUNT.findall(final):
            key = "errors" if word.startswith("error") else word
            if key in counts:
                counts[key] = int(number)
    else:  # a log cut short: count what is there
        counts = {"passed": statuses.get("PASSED", 0), "failed": statuses.get("FAILED", 0),
                  "skipped": statuses.get("SKIPPED", 0), "errors": statuses.get("ERROR", 0)}
    for node in short:
        if node not in failing:
            failing.append(node)

    failures = []
    for node in failing[:MAX_FAILURES]:
        name = node.rsplit("::", 1)[-1]
        failures.append({"test": node, "error": errors.get(name) or short.get(node) or ""})
    return {
        "reducer": f"tests.run/{REDUCER_VERSION}",
        "tool": "tests.run",
        "suite": result.get("suite"),
        "summary": {**counts, "total": sum(counts.values()), "duration_s": duration},
        "failures": failures,
        "failures_omitted": max(len(failing) - MAX_FAILURES, 0),
        "last_lines": lines[-TAIL_LINES:],
        "log_lines": len(lines),
        "log_sha256": hashlib.sha256(log.encode("utf-8", "surrogatepass")).hexdigest(),
        "full_artifact": None,
    }


def _shrink(value: Any) -> Any:
    if isinstance(value, str):
        if len(value) <= _HEAD_CHARS + _TAIL_CHARS:
            return value
        omitted = len(value) - _HEAD_CHARS - _TAIL_CHARS
        return f"{value[:_HEAD_CHARS]}\n[... {omitted} characters omitted ...]\n{value[-_TAIL_CHARS:]}"
    if isinstance(value, dict):
        return {key: _shrink(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        kept = [_shrink(item) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[... {len(value) - MAX_ITEMS} more items omitted ...]")
        return kept
    return value
