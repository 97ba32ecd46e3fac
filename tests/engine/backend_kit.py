"""Helpers for the demo backend tests (importable from child processes too)."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

from loopledger.engine._backends import DemoBackend, Fault, ToolOutcome, ToolRequest
from loopledger.engine._tools import demo_tool

_keys = itertools.count(1)


def request(
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str | None = None,
    call: int = 1,
    faults: tuple[Fault, ...] = (),
    tenant: str = "acme",
    run: str = "run-1",
    **extra: Any,
) -> ToolRequest:
    """A request as the engine would send it; a fresh key unless one is given."""
    spec = demo_tool(tool)
    return ToolRequest(
        operation_id=f"{run}.op{next(_keys)}",
        idempotency_key=key or f"key-{next(_keys)}",
        run_id=run,
        tenant=tenant,
        tool=tool,
        version=spec.version if spec else None,
        arguments=arguments,
        call_number=call,
        faults=faults,
        **extra,
    )


def call(backend: DemoBackend, tool: str, arguments: dict[str, Any], **kwargs: Any) -> ToolOutcome:
    return backend.execute(request(tool, arguments, **kwargs))


def raw(home: Path) -> sqlite3.Connection:
    """A plain connection to the backend's database, to count rows."""
    conn = sqlite3.connect(home / "demo_backend.sqlite", isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def crash_child(home: str, tool: str, arguments_json: str, key: str) -> None:
    """Run in a child process: one call whose fault is crash_after_dispatch."""
    import json

    backend = DemoBackend(home)
    fault = Fault(tool, 1, "crash_after_dispatch")
    backend.execute(request(tool, json.loads(arguments_json), key=key, faults=(fault,)))
    raise SystemExit("still alive after crash_after_dispatch")


def race_child(home: str, keys: str) -> None:
    """Run in a child process: write the same keyed files as its siblings."""
    backend = DemoBackend(home)
    for key in keys.split(","):
        outcome = call(backend, "workspace.write_file", {"path": f"race/{key}.txt", "content": key}, key=key)
        assert outcome.outcome == "success", outcome
