"""validators_default_suite: microseconds per candidate for the default suite.

Candidates are realistic: tool calls generated from real tool schemas (the
project's demo tools, plus every OpenAI-format tool file found under
``$LOOPLEDGER_EXTERNAL_DATA`` when it is set, e.g. the tau-bench and tau2
tool catalogues), about one in five with a wrong argument, final answers
with claims, and run histories of up to eight steps. Each candidate's
context holds the whole registry snapshot.

value:    µs per candidate for ``Suite.evaluate`` (fresh DecisionInput objects
          each round, so no per-input cache carries over; the schema
          compile cache is warm, as it is in a live worker).
baseline: µs per candidate for ``json.loads`` of the same DecisionInput JSON
          (candidate + context + run facts).
goal:     ratio <= 8.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import quick_flag, report  # noqa: E402

from loopledger.validators import DecisionInput, StepRecord, load_suite  # noqa: E402

_STR = {"type": "string", "minLength": 1}
DEMO_TOOLS: list[dict[str, Any]] = [
    {"name": "workspace.read_file", "version": "v1", "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR}, "required": ["path"], "additionalProperties": False}},
    {"name": "workspace.write_file", "version": "v1", "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR, "content": {"type": "string"}},
                "required": ["path", "content"], "additionalProperties": False}},
    {"name": "workspace.list", "version": "v1", "resources": {"path": "workspace_path"},
     "schema": {"type": "object", "properties": {"path": _STR}, "required": ["path"], "additionalProperties": False}},
    {"name": "orders.get_order", "version": "v1", "resources": {"order_id": "order"},
     "schema": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"}},
                "required": ["order_id"], "additionalProperties": False}},
    {"name": "orders.update_address", "version": "v1", "resources": {"order_id": "order"},
     "schema": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                                                 "address": {"type": "object", "properties": {"street": _STR, "city": _STR, "zip": _STR},
                                                             "required": ["street", "city", "zip"]},
                                                 "expected_version": {"type": "integer", "minimum": 0}},
                "required": ["order_id", "address", "expected_version"], "additionalProperties": False}},
    {"name": "payments.refund", "version": "v1", "resources": {"order_id": "order"},
     "schema": {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                                                 "amount": {"type": "number", "exclusiveMinimum": 0}},
                "required": ["order_id", "amount"], "additionalProperties": False}},
    {"name": "reports.export", "version": "v1",
     "schema": {"type": "object", "properties": {"query": _STR, "delay_s": {"type": "number", "minimum": 0}}, "required": ["query"]}},
    {"name": "tests.run", "version": "v1",
     "schema": {"type": "object", "properties": {"suite": {"enum": ["unit", "contract"]}}, "required": ["suite"]}},
    {"name": "deploy.service", "version": "v2", "requires_approval": True,
     "schema": {"type": "object", "properties": {"service": _STR, "version": _STR}, "required": ["service", "version"]}},
    {"name": "ask_user", "version": "v1",
     "schema": {"type": "object", "properties": {"question": _STR, "schema": {"type": "object"}}, "required": ["question"]}},
]


def external_tools() -> list[dict[str, Any]]:
    root = os.environ.get("LOOPLEDGER_EXTERNAL_DATA")
    if not root:
        return []
    out = []
    for path in sorted(Path(root).glob("**/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entries = data.get("tools") if isinstance(data, dict) else data
        for entry in entries if isinstance(entries, list) else []:
            fn = entry.get("function") if isinstance(entry, dict) else None
            if isinstance(fn, dict) and "name" in fn:
                out.append({"name": f"{path.parent.parent.name}.{path.stem}.{fn['name']}",
                            "version": None, "schema": fn.get("parameters") or {"type": "object"}})
    return out


def sample(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value valid for common schemas (enough for realistic arguments)."""
    if not isinstance(schema, dict):
        return "x"
    if "enum" in schema:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return sample(schema[key][0], rng, depth)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object" and depth < 4:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return {k: sample(v, rng, depth + 1) for k, v in props.items() if k in required or rng.random() < 0.4}
    if kind == "array":
        return [sample(schema.get("items", {}), rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(1, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if schema.get("pattern") == "^ORD-[0-9]{4}$":
        return f"ORD-{rng.randint(1001, 1050)}"
    return rng.choice(["exports/report.csv", "src/app.py", "ORD-1042", "acme", "summer sale", "user@example"])


def make_candidates(n: int, tools: list[dict[str, Any]], rng: random.Random) -> list[str]:
    texts = []
    for i in range(n):
        history = [StepRecord(f"run-{i}", s + 1, states=("READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING"),
                              calls=(f"orders.get_order:{rng.randrange(16**8):08x}",),
                              errors=("RATE_LIMIT",) if rng.random() < 0.1 else (),
                              new_evidence=int(rng.random() < 0.6)).to_dict()
                   for s in range(rng.randint(0, 8))]
        if rng.random() < 0.75:
            tool = rng.choice(tools)
            args = sample(tool["schema"], rng)
            if rng.random() < 0.2 and isinstance(args, dict) and args:
                args[next(iter(args))] = 12345  # a wrong type somewhere
            items = [{"type": "text", "text": "Let me look that up."},
                     {"type": "tool_call", "call_id": f"call_{i}", "name": tool["name"], "version": None, "arguments": args}]
            finish = "tool_calls"
        else:
            items = [{"type": "text", "text": f"Refund of 25.00 issued for ORD-{1000 + i % 50}. Contact support if needed."},
                     {"type": "claim", "text": "refund issued", "evidence": ["refund_confirmed"]}]
            finish = "stop"
        inp = {
            "run_id": f"run-{i}", "step": len(history) + 1, "attempt": 1,
            "candidate": {"items": items, "finish_reason": finish},
            "context": {
                "messages": [{"role": "system", "content": "You are a support agent."},
                             {"role": "user", "content": "Please refund order ORD-1042 in full."}],
                "tools": tools, "tenant": "acme",
                "policy": {"approval_required": ["deploy.service"]},
                "contract": {"goal": "Refund order ORD-1042 in full", "required_evidence": ["refund_confirmed"],
                             "forbidden_paths": ["payments/**"], "wait_ttl_s": 86400},
                "budget": {"steps": 8, "tool_calls": 6, "tokens": 20000},
            },
            "facts": {"evidence": [{"kind": "order_found", "subject": "ORD-1042", "operation_id": "op-1"}]
                      + ([{"kind": "refund_confirmed", "subject": "ORD-1042", "operation_id": "op-2"}] if rng.random() < 0.7 else []),
                      "operations": [{"operation_id": "op-1", "tool": "orders.get_order", "outcome": "success"}],
                      "history": history},
        }
        texts.append(DecisionInput.model_validate(inp).to_json())
    return texts


def main() -> None:
    quick = quick_flag()
    n = 300 if quick else 3000
    rounds = 2 if quick else 5
    rng = random.Random(1)
    tools = DEMO_TOOLS + external_tools()
    texts = make_candidates(n, tools, rng)
    suite = load_suite("default")

    best_base = float("inf")
    best_suite = float("inf")
    verdicts: dict[str, int] = {}
    for _ in range(rounds):
        start = time.perf_counter()
        for t in texts:
            json.loads(t)
        best_base = min(best_base, time.perf_counter() - start)
        inputs = [DecisionInput.from_json(t) for t in texts]  # fresh objects: no cached derivations
        start = time.perf_counter()
        results = [suite.evaluate(inp) for inp in inputs]
        best_suite = min(best_suite, time.perf_counter() - start)
    for r in results:
        verdicts[r.verdict.value] = verdicts.get(r.verdict.value, 0) + 1
    inputs = [DecisionInput.from_json(t) for t in texts[: max(1, n // 5)]]
    start = time.perf_counter()
    for t in texts[: len(inputs)]:
        suite.evaluate(DecisionInput.from_json(t))
    with_parse = (time.perf_counter() - start) / len(inputs) * 1e6
    print(f"tools in registry: {len(tools)}; mean candidate JSON: {sum(map(len, texts)) // n} bytes; verdicts: {verdicts}")
    report(
        "validators_default_suite",
        value=best_suite / n * 1e6,
        unit="us/candidate",
        baseline=best_base / n * 1e6,
        goal=8,
        n=n,
        tools=len(tools),
        us_with_from_json=round(with_parse, 2),
    )


if __name__ == "__main__":
    main()
