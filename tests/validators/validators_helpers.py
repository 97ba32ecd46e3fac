"""Builders for DecisionInputs over the demo tool registry (CONTRACT 'Scenario files')."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from loopledger.validators import DecisionInput

_STR = {"type": "string", "minLength": 1}

DEMO_TOOLS: list[dict[str, Any]] = [
    {"name": "workspace.read_file", "version": "v1", "read_only": True, "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR}, "required": ["path"], "additionalProperties": False}},
    {"name": "workspace.write_file", "version": "v1", "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR, "content": {"type": "string"}},
                "required": ["path", "content"], "additionalProperties": False}},
    {"name": "workspace.list", "version": "v1", "read_only": True, "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR}, "required": ["path"], "additionalProperties": False}},
    {"name": "orders.get_order", "version": "v1", "read_only": True, "resources": {"order_id": "order"},
     "schema": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"}},
                "required": ["order_id"], "additionalProperties": False}},
    {"name": "payments.refund", "version": "v1", "resources": {"order_id": "order"},
     "schema": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                                                 "amount": {"type": "number", "exclusiveMinimum": 0}},
                "required": ["order_id", "amount"], "additionalProperties": False}},
    {"name": "reports.export", "version": "v1",
     "schema": {"type": "object", "properties": {"query": _STR, "delay_s": {"type": "number", "minimum": 0}},
                "required": ["query"]}},
    {"name": "deploy.service", "version": "v2", "requires_approval": True,
     "schema": {"type": "object", "properties": {"service": _STR, "version": _STR},
                "required": ["service", "version"]}},
    {"name": "ask_user", "version": "v1",
     "schema": {"type": "object", "properties": {"question": _STR, "schema": {"type": "object"}}, "required": ["question"]}},
]


def call(name: str, arguments: dict[str, Any] | None = None, *, call_id: str = "c1", raw: str | None = None,
         version: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "tool_call", "call_id": call_id, "name": name, "version": version}
    if raw is not None:
        item["raw_arguments"] = raw
    else:
        item["arguments"] = arguments if arguments is not None else {}
    return item


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def claim(value: str, *evidence: str) -> dict[str, Any]:
    return {"type": "claim", "text": value, "evidence": list(evidence)}


def make_input(
    items: list[dict[str, Any]],
    *,
    finish_reason: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    contract: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    facts: dict[str, Any] | None = None,
    tenant: str | None = "acme",
    proposal: list[dict[str, Any]] | None = None,
    step: int = 1,
) -> DecisionInput:
    if finish_reason is None:
        finish_reason = "tool_calls" if any(i["type"] == "tool_call" for i in items) else "stop"
    return DecisionInput.model_validate(
        {
            "run_id": "run-1",
            "step": step,
            "attempt": 1,
            "candidate": {"items": items, "finish_reason": finish_reason},
            "context": {
                "tools": DEMO_TOOLS if tools is None else tools,
                "contract": contract or {},
                "policy": policy or {},
                "tenant": tenant,
            },
            "proposal": proposal or [],
            "facts": facts or {},
        }
    )



def steps_of_another_thread_during(work: Callable[[], Any]) -> int:
    """How many times a busy thread went round its loop while ``work`` ran:
    some tens of thousands (the switches between Python's own bytecodes)
    when ``work`` kept the interpreter lock through a second's match,
    millions when it let go of it. (A match that lets go of the lock waits, after each match, for
    the engine's other busy threads to let go of it in turn.)"""
    steps, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            steps[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    while steps[0] == 0:
        pass
    try:
        before = steps[0]
        work()
        return steps[0] - before
    finally:
        stop.set()
        spinner.join()
