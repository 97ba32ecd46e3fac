"""tau-bench and tau2-bench result files → conversations.

tau-bench (``historical_trajectories/*.json``): one JSON array of
``{task_id, trial, reward, info, traj}``; ``traj`` is an OpenAI chat list
whose tool-call arguments are JSON strings and whose errors are results
starting with ``Error:``. Quirk: some runs reuse a ``tool_call_id`` for
different calls, so results are matched to the calls of the assistant
message right before them, by position (``pair_results``), never by id
over the whole run.

tau2 (``Results`` JSON, often gzipped): ``{info, tasks, simulations}``;
arguments are objects, results carry an ``error`` flag and a
``requestor``. The simulated user's own tool calls (telecom: the user's
phone) sit in the same transcript: they are kept, marked ``requestor:
user``, and never become the agent's operations.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from loopledger.canonical import Canonical

from ._import_model import (
    Conversation,
    ImportInputError,
    Message,
    Runs,
    ToolCall,
    ToolResult,
    read_only_map,
    tool_specs,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})


def read_json(path: Path) -> Any:
    """A JSON file, gzipped or not (by its magic bytes, not its name)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as handle:
            data = handle.read()
        try:
            return orjson.loads(data)  # twice as fast as json
        except orjson.JSONDecodeError:
            return json.loads(data)  # what orjson refuses and json reads (integers beyond 64 bits), or json's message
    except (OSError, EOFError) as exc:
        # A truncated gzip stream raises EOFError; a missing file OSError.
        raise ImportInputError(str(path), None, f"cannot read: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportInputError(str(path), None, f"not valid JSON ({exc}); truncated or another format?") from None


def load_catalogue(path: Path) -> tuple[Canonical, dict[str, bool]]:
    """A tool file: ``{"tools": [...], "tool_types": {...}}`` or a bare list."""
    data = read_json(path)
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ImportInputError(str(path), None, "expected a list of tools or an object with 'tools'")
    read_only = read_only_map(data.get("tool_types")) if isinstance(data, dict) else {}
    return Canonical(tool_specs(entries, read_only, str(path))), read_only


def _catalogue_near(path: Path, domain: str, explicit: Path | None) -> Canonical:
    """``--tools FILE``, else ``tools/<domain>_tools.json`` beside the
    folder holding the trajectories (the layout of the external data)."""
    if explicit is not None:
        return load_catalogue(explicit)[0]
    for folder in (path.parent, path.parent.parent):
        candidate = folder / "tools" / f"{domain}_tools.json"
        if candidate.is_file():
            return load_catalogue(candidate)[0]
    raise ImportInputError(str(path), None, f"no tool catalogue for domain {domain!r}: expected "
                                            f"tools/{domain}_tools.json beside the file's folder, or --tools FILE")


def pair_results(calls: tuple[ToolCall, ...], results: list[ToolResult]) -> list[ToolResult | None]:
    """Each call's result among the tool messages that follow its assistant
    message. By id when the ids tell the calls apart and every result names
    one of them; otherwise by position (tau-bench reuses ids). A call with
    no result gets None."""
    ids = [c.call_id for c in calls]
    if len(set(ids)) == len(ids) and results and all(r.call_id in ids for r in results) \
            and len({r.call_id for r in results}) == len(results):
        by_id = {r.call_id: r for r in results}
        return [by_id.get(i) for i in ids]
    return [results[i] if i < len(results) else None for i in range(len(calls))]


def _text(value: Any, where: str, file: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    raise ImportInputError(file, where, f"content must be a string, not {type(value).__name__}")


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as an object when they are one, else the text received."""
    if isinstance(raw, dict):
        return raw, None
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return None, raw
        return (value, None) if isinstance(value, dict) else (None, raw)
    return None, json.dumps(raw)


def openai_message(m: Any, where: str, file: str, *, tau2: bool = False) -> Message:
    """One OpenAI chat message (tau-bench, tau2 and openai-jsonl share it;
    tau2 puts ``name``/``arguments`` on the call itself and ``id`` on the
    result; the legacy ``function_call``/``function`` role is read too)."""
    if not isinstance(m, dict):
        raise ImportInputError(file, where, "a message must be an object")
    role = m.get("role")
    if role == "function":  # legacy: a function's result
        role = "tool"
    if role not in ROLES:
        raise ImportInputError(file, where, f"unknown role {role!r}; expected one of {sorted(ROLES)}")
    content = _text(m.get("content"), where, file)
    requestor = m.get("requestor") or ("user" if role == "user" else "assistant")
    usage = m.get("usage") if isinstance(m.get("usage"), dict) else {}
    tokens = {"tokens_in": int(usage.get("prompt_tokens") or 0), "tokens_out": int(usage.get("completion_tokens") or 0),
              "cost_usd": float(m.get("cost") or 0.0) if role == "assistant" else 0.0}
    if role == "tool":
        call_id = m.get("tool_call_id") or m.get("id")
        error = m.get("error") if isinstance(m.get("error"), bool) else None
        result = ToolResult(content=content or "", error=error, call_id=call_id, name=m.get("name"))
        return Message("tool", content, result=result, requestor=requestor)
    calls = []
    raw_calls = m.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ImportInputError(file, where, "tool_calls must be a list")
    for i, call in enumerate(raw_calls):
        fn = call.get("function") if isinstance(call, dict) and not tau2 else call
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ImportInputError(file, f"{where}.tool_calls[{i}]", "a tool call needs a function name")
        arguments, raw = _arguments(fn.get("arguments", {}))
        calls.append(ToolCall(str(call.get("id") or f"call-{i + 1}"), fn["name"], arguments, raw))
    legacy = m.get("function_call")
    if isinstance(legacy, dict):
        if not isinstance(legacy.get("name"), str):
            raise ImportInputError(file, f"{where}.function_call", "a function call needs a name")
        arguments, raw = _arguments(legacy.get("arguments", {}))
        # The legacy format has no call ids: the result is the next
        # ``function`` message, so a positional id is exact.
        calls.append(ToolCall(f"{where}.function_call", legacy["name"], arguments, raw))
    return Message(role, content, tuple(calls), requestor=requestor if role == "user" else "assistant", **tokens)


# --- tau-bench -----------------------------------------------------------------------


def read_tau_bench(path: Path, tools: Path | None = None) -> Runs:
    data = read_json(path)
    file = str(path)
    if not isinstance(data, list):
        raise ImportInputError(file, None, "expected a tau-bench trajectory file: a JSON array of "
                                           "{task_id, trial, reward, info, traj}")
    # gpt-4o-airline.json: the model, then the domain.
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    model, _, domain = stem.rpartition("-")
    # Read when the first record is converted, once.
    read_catalogue = cache(lambda: _catalogue_near(path, domain or "airline", tools))

    def convert(index: int) -> Conversation:
        record = data[index]
        where = f"record {index}"
        if not isinstance(record, dict) or not isinstance(record.get("traj"), list):
            raise ImportInputError(file, where, "expected {task_id, trial, reward, info, traj} with traj a list")
        messages = [openai_message(m, f"{where}.traj[{i}]", file) for i, m in enumerate(record["traj"])]
        catalogue = read_catalogue()
        system = next((m.content or "" for m in messages if m.role == "system"), "")
        last = messages[-1] if messages else None
        stopped = last is not None and last.role == "user" and "###STOP###" in (last.content or "")
        reward = record.get("reward")
        if reward is not None and not isinstance(reward, (int, float)):
            raise ImportInputError(file, f"{where}.reward", "expected a number")
        info = record.get("info") if isinstance(record.get("info"), dict) else {}
        task = info.get("task") if isinstance(info.get("task"), dict) else {}
        return Conversation(
            source="tau-bench", file=path.name, record=where,
            source_id=f"{record.get('task_id')}:{record.get('trial')}:{index}",
            task_id=f"{domain or 'tau-bench'}/{record.get('task_id')}", model=model or "unknown",
            system_prompt=system, messages=tuple(messages), tools=catalogue,
            reward=float(reward) if reward is not None else None,
            # tau-bench records no termination; a transcript that ends on a
            # tool result instead of the user's ###STOP### ran out of steps.
            termination="user_stop" if stopped else "max_steps",
            metadata={"trial": record.get("trial"), "domain": domain, "user_id": task.get("user_id"),
                      "termination_inferred": True},
        )

    return Runs(len(data), convert)


# --- tau2 ----------------------------------------------------------------------------


def _tau2_catalogues(path: Path, domain: str, explicit: Path | None) -> Canonical:
    if explicit is not None:
        return load_catalogue(explicit)[0]
    # Policy variants (airline_tighter_policy, airline-relaxed) use the
    # base domain's tools; telecom-workflow the telecom ones.
    base = domain.replace("-", "_").split("_")[0]
    return _catalogue_near(path, base, None)


def read_tau2(path: Path, tools: Path | None = None) -> Runs:
    data = read_json(path)
    file = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise ImportInputError(file, None, "expected a tau2 Results file: an object with 'info', 'tasks' "
                                           "and a 'simulations' list")
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    env = info.get("environment_info") if isinstance(info.get("environment_info"), dict) else {}
    agent = info.get("agent_info") if isinstance(info.get("agent_info"), dict) else {}
    domain = str(env.get("domain_name") or "unknown")
    policy = str(env.get("policy") or "")
    model = str(agent.get("llm") or "unknown")
    tasks = {str(t.get("id")): t for t in data.get("tasks") or () if isinstance(t, dict)}
    simulations = data["simulations"]
    # Read when the first simulation is converted, once.
    read_catalogue = cache(lambda: _tau2_catalogues(path, domain, tools))

    def convert(index: int) -> Conversation:
        sim = simulations[index]
        where = f"simulations[{index}]"
        if not isinstance(sim, dict) or not isinstance(sim.get("messages"), list) or "id" not in sim:
            raise ImportInputError(file, where, "expected a simulation with 'id' and a 'messages' list")
        messages = [openai_message(m, f"{where}.messages[{i}]", file, tau2=True)
                    for i, m in enumerate(sim["messages"])]
        catalogue = read_catalogue()
        reward_info = sim.get("reward_info") if isinstance(sim.get("reward_info"), dict) else {}
        reward = reward_info.get("reward")
        if reward is not None and not isinstance(reward, (int, float)):
            raise ImportInputError(file, f"{where}.reward_info.reward", "expected a number")
        task_id = str(sim.get("task_id"))
        return Conversation(
            source="tau2", file=path.name, record=where, source_id=str(sim["id"]),
            task_id=f"{domain}/{task_id}", model=model,
            # The agent's system prompt is tau2's fixed wrapper around the
            # domain policy: the policy is what varies between files.
            system_prompt=policy, messages=(Message("system", policy),) + tuple(messages), tools=catalogue,
            reward=float(reward) if reward is not None else None,
            termination=str(sim.get("termination_reason") or "completed"),
            metadata={"trial": sim.get("trial"), "domain": domain, "start_time": sim.get("start_time"),
                      "task_known": task_id in tasks},
        )

    return Runs(len(simulations), convert)


def expand(paths: list[Path], patterns: tuple[str, ...]) -> Iterator[Path]:
    """Files as given; a folder gives its files matching ``patterns``, sorted."""
    for path in paths:
        if path.is_dir():
            found = sorted(p for pattern in patterns for p in path.rglob(pattern) if p.is_file())
            if not found:
                raise ImportInputError(str(path), None, f"no {' or '.join(patterns)} file in this folder")
            yield from found
        elif path.is_file():
            yield path
        else:
            raise ImportInputError(os.fspath(path), None, "no such file or folder")


def catalogue_from(mapping: Mapping[str, Any], file: str) -> Canonical:
    """An inline catalogue (openai-jsonl ``tools``, ToolBench ``function``)."""
    entries = mapping.get("tools") or mapping.get("functions") or []
    return Canonical(tool_specs(entries, None, file))
