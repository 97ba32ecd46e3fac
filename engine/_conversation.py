"""The whole conversation of a step, rebuilt from the context chain, and the
provider-neutral shape adapters map onto their wire formats.

A context artifact holds only the messages added since the previous
context, which it links to (``previous_context``): the chain holds the
conversation and storing a step costs the same at step 2 and step 200. A
real model needs all of it, so :func:`conversation` follows the links back
to the first context.

The engine's messages are not a provider's: failed attempts of a step sit
next to the one that counted, rejected tool calls get no result message
(their recorded result, ``_refused.py``, is not one of the model's), and a
background job reports twice under one call id. :func:`turns` turns them
into a strict alternation every provider accepts:

- of consecutive assistant messages only the last is kept: the attempts
  before it broke or failed, and the engine never merges attempts;
- every tool call of an assistant turn is answered right after it, by the
  result recorded for its call id, or by a note that it was not run (it was
  rejected; the feedback that follows says why);
- a result that answers no open call (a background job's completion)
  becomes a user turn that names the call.

Tool names: registries use dotted names (``orders.get_order``); providers
accept ``^[a-zA-Z0-9_-]{1,64}$``. :func:`provider_tool_name` maps ``.`` to
``__`` (and any other character outside the set to ``_``);
:class:`ToolNames` remembers the offered names so the reverse is exact.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: Walking a chain longer than this means the links form a cycle.
MAX_CHAIN = 100_000

_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")


def conversation(context_id: str | None, get_context: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message of the chain ending at ``context_id``, oldest first."""
    chunks: list[list[dict[str, Any]]] = []
    seen: set[str] = set()
    while context_id is not None:
        if context_id in seen or len(seen) >= MAX_CHAIN:
            raise ValueError(f"context chain loops at {context_id}")
        seen.add(context_id)
        body = get_context(context_id)
        chunks.append(list(body.get("messages", ())))
        context_id = body.get("previous_context")
    return [message for chunk in reversed(chunks) for message in chunk]


# -- tool names ----------------------------------------------------------------


def provider_tool_name(name: str) -> str:
    mapped = re.sub(r"[^a-zA-Z0-9_-]", "_", name.replace(".", "__"))
    return mapped[:64] or "_"


@dataclass
class ToolNames:
    """Registry name <-> provider name for the tools offered in one request."""

    to_provider: dict[str, str] = field(default_factory=dict)
    to_registry: dict[str, str] = field(default_factory=dict)

    def add(self, name: str) -> str:
        mapped = provider_tool_name(name)
        if self.to_registry.get(mapped, name) != name:
            raise ValueError(f"tools {self.to_registry[mapped]!r} and {name!r} map to the same name {mapped!r}")
        self.to_provider[name] = mapped
        self.to_registry[mapped] = name
        return mapped

    def provider(self, name: str) -> str:
        return self.to_provider.get(name) or provider_tool_name(name)

    def registry(self, mapped: str) -> str:
        # A name the model made up is passed on as it would map back, so the
        # tool_exists validator names what the model asked for.
        return self.to_registry.get(mapped) or mapped.replace("__", ".")


@dataclass(frozen=True)
class OfferedTool:
    name: str  # the provider's name
    registry_name: str
    version: str
    description: str
    schema: dict[str, Any]


def offered_tools(context: dict[str, Any]) -> tuple[list[OfferedTool], ToolNames]:
    """The enabled tools of the frozen registry snapshot that the contract
    allows, in registry order, with their JSON Schemas."""
    allowed = (context.get("contract") or {}).get("allowed_tools")
    names = ToolNames()
    tools: list[OfferedTool] = []
    for spec in context.get("tools") or ():
        name = spec["name"]
        if not spec.get("enabled", True):
            continue
        if allowed is not None and not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
            continue
        schema = _for_provider(spec.get("schema") or {"type": "object"})
        notes = []
        if spec.get("requires_approval"):
            notes.append("a person must approve each call")
        if name == "ask_user":
            notes.append("asks the user; `schema` is the JSON Schema (2020-12) the answer must fit")
        elif not spec.get("read_only", False):
            notes.append("has side effects")
        description = f"{name} (version {spec.get('version')})" + (f"; {'; '.join(notes)}" if notes else "")
        tools.append(OfferedTool(names.add(name), name, str(spec.get("version")), description, schema))
    return tools, names


#: Keywords whose values are data, not schemas: left exactly as they are.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
#: Keywords whose values map names to schemas (a property may be named ``$ref``).
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _for_provider(schema: Any) -> Any:
    """A tool's JSON Schema as providers take it: no ``$schema``, and no
    ``$ref`` to a schema elsewhere (a provider fetches nothing; the
    engine's own check of the arguments still follows it). Only schema
    keywords are touched: property names and data (``enum``, ``default``,
    ...) are kept as they are."""
    if isinstance(schema, list):
        return [_for_provider(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$schema" or (key == "$ref" and isinstance(value, str) and not value.startswith("#")):
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _for_provider(sub) for name, sub in value.items()}
        else:
            out[key] = _for_provider(value)
    return out


# -- the neutral conversation ---------------------------------------------------------


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str  # registry name
    arguments: dict[str, Any] | None
    raw_arguments: str | None

    def arguments_json(self) -> str:
        if self.arguments is not None:
            return json.dumps(self.arguments, sort_keys=True)
        return self.raw_arguments or "{}"


@dataclass(frozen=True)
class Turn:
    """``system``/``user``: ``text``. ``assistant``: ``text`` and ``calls``.
    ``tool``: ``call_id``, ``text`` (the result, as JSON text), ``error``."""

    role: str
    text: str = ""
    calls: tuple[Call, ...] = ()
    call_id: str = ""
    error: bool = False


NOT_RUN = "This call was not run: it was rejected before dispatch; see the feedback that follows."


def turns(messages: Iterable[dict[str, Any]]) -> list[Turn]:
    """The engine's messages as strictly alternating provider-neutral turns."""
    kept = _last_attempts(list(messages))
    out: list[Turn] = []
    index = 0
    while index < len(kept):
        message = kept[index]
        role = message.get("role")
        index += 1
        if role == "assistant":
            text, calls = _assistant(message.get("items") or [])
            out.append(Turn("assistant", text=text, calls=calls))
            results: dict[str, dict[str, Any]] = {}
            open_ids = {c.call_id for c in calls}
            # Results of this turn's calls, wherever they sit before the next
            # assistant turn; the rest of what follows stays in order.
            rest: list[dict[str, Any]] = []
            while index < len(kept) and kept[index].get("role") != "assistant":
                follower = kept[index]
                if follower.get("role") == "tool" and follower.get("call_id") in open_ids \
                        and follower["call_id"] not in results:
                    results[follower["call_id"]] = follower
                else:
                    rest.append(follower)
                index += 1
            for call in calls:
                result = results.get(call.call_id)
                if result is None:
                    out.append(Turn("tool", call_id=call.call_id, text=NOT_RUN, error=True))
                else:
                    out.append(Turn("tool", call_id=call.call_id, text=_result_text(result),
                                    error=result.get("outcome") not in (None, "success", "background_accepted")))
            out.extend(_plain(m) for m in rest)
        else:
            out.append(_plain(message))
    return _merge_users(out)


def _last_attempts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant" and kept and kept[-1].get("role") == "assistant":
            kept[-1] = message
        else:
            kept.append(message)
    return kept


#: A claim as a provider model states it in its final answer, and as a
#: recorded claim is written back to it (:func:`_assistant`): one line,
#: ``Claim: WHAT (evidence: KIND:SUBJECT, KIND)``, as a list item or in bold
#: too. The evidence part may be missing: a claim that cites nothing.
_CLAIM_LINE = re.compile(
    r"^[ \t]*(?:[-*][ \t]+)?(?:\*\*)?claim:(?:\*\*)?[ \t]*(?P<text>.*?)"
    r"(?:[ \t]*\((?:\*\*)?evidence:(?:\*\*)?[ \t]*(?P<evidence>[^()]*)\))?[ \t]*$",
    re.IGNORECASE | re.MULTILINE)

#: How a model is asked to state its claims (the task message says it).
CLAIM_FORMAT = "Claim: WHAT (evidence: KIND:SUBJECT, ...)"


def claims_in(text: str) -> list[dict[str, Any]]:
    """The claim items a final answer's text states, in order (CONTRACT:
    ``{"type": "claim", "text", "evidence"}``), so that the validators
    check a provider model's claims as they check a script's."""
    claims = []
    for match in _CLAIM_LINE.finditer(text):
        said = match["text"].strip()
        if said:
            evidence = [e.strip().strip("`") for e in (match["evidence"] or "").split(",")]
            claims.append({"type": "claim", "text": said, "evidence": [e for e in evidence if e]})
    return claims


def _assistant(items: list[dict[str, Any]]) -> tuple[str, tuple[Call, ...]]:
    texts: list[str] = []
    calls: list[Call] = []
    # A provider model's claims are lines of its own text already: not written twice.
    stated = {c["text"] for c in claims_in("\n".join(i.get("text", "") for i in items if i.get("type") == "text"))}
    for item in items:
        kind = item.get("type")
        if kind == "text":
            texts.append(item.get("text", ""))
        elif kind == "tool_call":
            # The name as the model wrote it: a version it asked for is part of it.
            name = item.get("name", "")
            if item.get("version"):
                name = f"{name}@{item['version']}"
            calls.append(Call(item.get("call_id") or f"call_{len(calls)}", name,
                              item.get("arguments"), item.get("raw_arguments")))
        elif kind == "claim" and item.get("text") not in stated:
            stated.add(item.get("text"))
            texts.append(f"Claim: {item.get('text', '')} (evidence: {', '.join(item.get('evidence') or [])})")
        elif kind == "plan":
            texts.append("Plan: " + json.dumps(item.get("steps"), sort_keys=True))
    return "\n".join(t for t in texts if t), tuple(calls)


def _result_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    body = {"tool": message.get("tool"), "outcome": message.get("outcome"), "result": content}
    return json.dumps(body, sort_keys=True, default=str)


def _plain(message: dict[str, Any]) -> Turn:
    role = message.get("role")
    if role == "system":
        return Turn("system", text=str(message.get("content", "")))
    if role == "tool":
        # No open call to answer: a background job's completion, or a result
        # of a call from an earlier turn.
        return Turn("user", text=f"Update on tool call {message.get('call_id')}: {_result_text(message)}")
    content = message.get("content", "")
    if isinstance(content, list):  # validator feedback on the last candidate
        lines = [f"- {d.get('validator')}: {d.get('code')} ({d.get('verdict')}): {d.get('message')}"
                 for d in content if isinstance(d, dict)]
        return Turn("user", text="Your last answer was not accepted:\n" + "\n".join(lines))
    return Turn("user", text=content if isinstance(content, str) else json.dumps(content, sort_keys=True))


def _merge_users(out: list[Turn]) -> list[Turn]:
    """Adjacent user turns become one: Anthropic requires alternation and
    OpenAI does not mind."""
    merged: list[Turn] = []
    for turn in out:
        if turn.role == "user" and merged and merged[-1].role == "user":
            merged[-1] = Turn("user", text=merged[-1].text + "\n\n" + turn.text)
        else:
            merged.append(turn)
    return merged
