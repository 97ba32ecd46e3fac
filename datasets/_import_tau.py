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
import zlib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from loopledger._args import UnreadableEntry, files_under, not_a_file
from loopledger.canonical import Canonical, CanonicalJSONError, strict_loads

from ._import_model import (
    MISSING,
    TOO_DEEP,
    Conversation,
    ImportInputError,
    Message,
    Runs,
    ToolCall,
    ToolResult,
    bad,
    fingerprint,
    identifier,
    kind,
    integer,
    mapping,
    number,
    optional_number,
    optional_text,
    optional_time,
    plain,
    read_only_map,
    text,
    tool_specs,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})
#: Roles read as another: the legacy ``function`` result is a tool's, and
#: OpenAI's ``developer`` messages (its newer name for system instructions)
#: are the system's.
ROLE_ALIASES = {"function": "tool", "developer": "system"}
#: Who made a tau2 tool call (and so whose result it is).
REQUESTORS = frozenset({"assistant", "user"})


def read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped when it is a gzip file (by its magic bytes,
    not its name), without a leading UTF-8 byte-order mark (as Windows tools
    write). A truncated gzip stream or an unreadable file is bad input."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as handle:
            data = handle.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # Truncated (EOFError), its deflate data or header broken.
        raise ImportInputError(str(path), None, f"cannot read: a broken gzip stream ({exc}); expected a whole gzip "
                                                "file, or the file uncompressed") from None
    except OSError as exc:
        raise ImportInputError(str(path), None, f"cannot read: {exc}") from None
    return data.removeprefix(b"\xef\xbb\xbf")


def read_json(path: Path, expected: str) -> Any:
    """A JSON file, gzipped or not; ``expected``: what it holds, said when it is empty."""
    data = read_bytes(path)
    if not data.strip():
        raise ImportInputError(str(path), None, f"the file is empty; expected {expected}")
    try:
        try:
            return orjson.loads(data)  # twice as fast as json
        except orjson.JSONDecodeError:
            return json.loads(data)  # what orjson refuses and json reads (integers beyond 64 bits), or json's message
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportInputError(str(path), None, f"not valid JSON ({exc}); truncated or another format?") from None
    except RecursionError:
        raise ImportInputError(str(path), None, TOO_DEEP) from None


def load_catalogue(path: Path) -> tuple[Canonical, dict[str, bool]]:
    """A tool file: ``{"tools": [...], "tool_types": {...}}`` or a bare list."""
    data = read_json(path, "a JSON tool file (a list of tools, or an object with 'tools')")
    file = str(path)
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ImportInputError(file, None, "expected a list of tools or an object with 'tools'")
    read_only = read_only_map(data.get("tool_types"), file) if isinstance(data, dict) else {}
    specs = tool_specs(entries, read_only, file, "tools" if isinstance(data, dict) else "")
    try:
        return Canonical(specs), read_only
    except CanonicalJSONError as exc:
        # The catalogue's own fault, named as such (not the trace file's that asked for it).
        raise ImportInputError(file, None, f"a value cannot be stored as JSON ({exc})") from None


def _catalogue_near(path: Path, domain: str, explicit: Path | None) -> Canonical:
    """``--tools FILE``, else ``tools/<domain>_tools.json`` beside the
    folder holding the trajectories (the layout of the external data)."""
    if explicit is not None:
        return load_catalogue(explicit)[0]
    folder_of_file = path.absolute().parent  # "file.json" and "." name folders too
    for folder in (folder_of_file, folder_of_file.parent):
        candidate = folder / "tools" / f"{domain}_tools.json"
        if candidate.is_file():
            return load_catalogue(candidate)[0]
    raise ImportInputError(str(path), None, f"no tool catalogue for domain {domain!r}: expected "
                                            f"tools/{domain}_tools.json beside the file's folder, or --tools FILE")


def pair_results(calls: tuple[ToolCall, ...], results: list[ToolResult]) -> list[ToolResult | None]:
    """Each call's result among the tool messages that follow its assistant
    message. By id when the ids tell the calls apart and every result names
    one of them; otherwise by position (tau-bench reuses ids). Where some
    result names no call of the message, the others that each name a call
    of their own keep it, and the rest go by position to the calls left. A
    call with no result gets None."""
    ids = [c.call_id for c in calls]
    if len(set(ids)) == len(ids) and results and all(r.call_id in ids for r in results) \
            and len({r.call_id for r in results}) == len(results):
        by_id = {r.call_id: r for r in results}
        return [by_id.get(i) for i in ids]
    if len(set(ids)) == len(ids) and any(r.call_id not in ids for r in results):
        paired: list[ToolResult | None] = [None] * len(calls)
        rest = []
        for r in results:
            n = ids.index(r.call_id) if r.call_id in ids else None
            if n is not None and paired[n] is None:
                paired[n] = r
            else:
                rest.append(r)
        for n, r in zip([n for n, p in enumerate(paired) if p is None], rest):
            paired[n] = r
        return paired
    return [results[i] if i < len(results) else None for i in range(len(calls))]


#: What stands in the text for a content part that is not text, by its ``type``.
PLACEHOLDERS = {"image_url": "[image]", "image": "[image]", "input_image": "[image]",
                "input_audio": "[audio]", "audio": "[audio]", "file": "[file]", "input_file": "[file]"}


def _content(value: Any, where: str, file: str) -> str | None:
    """A message's content: a string, null, or a list of content parts,
    joined: a part's ``text`` (a ``refusal`` part's ``refusal``), and for a
    part that holds no text (an image, audio, a file) a placeholder naming
    it, ``[image]``, so that the transcript still shows it was there."""
    if value is None or isinstance(value, str):
        return optional_text(value, file, where)
    if not isinstance(value, list):
        raise bad(file, where, "a string, a list of content parts or null", value)
    texts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict):
            raise bad(file, f"{where}[{i}]", "a content part (an object)", part)
        kind_of = part.get("type")
        if kind_of is not None and not isinstance(kind_of, str):
            raise bad(file, f"{where}[{i}].type", "a content part type (a string)", kind_of)
        if part.get("text") is not None:
            texts.append(text(part["text"], file, f"{where}[{i}].text"))
        elif kind_of == "refusal" and part.get("refusal") is not None:
            texts.append(text(part["refusal"], file, f"{where}[{i}].refusal"))
        elif kind_of is not None and kind_of != "text":
            texts.append(PLACEHOLDERS.get(kind_of) or f"[{kind_of}]")
    return "".join(texts)


def _arguments(raw: Any, where: str, file: str) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as an object when they are one (an object, or a JSON string
    holding one), else the text received: what the model wrote, kept as it
    is when it is not a JSON object (NaN and infinities are not JSON; a key
    given twice in one object means two things)."""
    if isinstance(raw, dict):
        return plain(raw, file, where), None
    if not isinstance(raw, str):
        raise bad(file, where, "a JSON string or an object", raw)
    raw = text(raw, file, where)
    try:
        value = strict_loads(raw)
        if not isinstance(value, dict):
            return None, raw
        return plain(value, file, where), None
    except RecursionError:
        raise ImportInputError(file, where, TOO_DEEP) from None
    except (ValueError, ImportInputError):
        return None, raw  # not JSON, or JSON that cannot be stored (a lone surrogate escape)


def _call_id(value: Any, where: str, file: str) -> str | None:
    return None if value is None else text(value, file, where)


def openai_message(m: Any, where: str, file: str, *, tau2: bool = False, position: int = 0) -> Message:
    """One OpenAI chat message (tau-bench, tau2 and openai-jsonl share it;
    tau2 puts ``name``/``arguments`` (and its ``requestor``) on the call
    itself and ``id`` on the result, and has a ``timestamp``; the legacy
    ``function_call``/``function`` role is read too, and ``developer`` as
    ``system``). ``position``: the message's index in its transcript (the
    legacy call's id).
    Every field read is checked (docs/importers.md, "What is checked")."""
    if not isinstance(m, dict):
        raise bad(file, where, "a message (an object)", m)
    role = m.get("role")
    if isinstance(role, str):
        role = ROLE_ALIASES.get(role, role)
    if not isinstance(role, str) or role not in ROLES:
        roles = sorted(ROLES | ROLE_ALIASES.keys())
        if "role" not in m:
            raise ImportInputError(file, f"{where}.role", f"missing; expected one of {roles}")
        shown = repr(role) if role is None or isinstance(role, str) else kind(role)
        raise ImportInputError(file, f"{where}.role", f"unknown role {shown}; expected one of {roles}")
    content = _content(m.get("content"), f"{where}.content", file)
    requestor = m.get("requestor")
    if requestor is not None and (not isinstance(requestor, str) or requestor not in REQUESTORS):
        got = repr(requestor) if isinstance(requestor, str) else kind(requestor)
        raise ImportInputError(file, f"{where}.requestor", f"expected 'assistant' or 'user', got {got}")
    requestor = requestor or ("user" if role == "user" else "assistant")
    time = optional_time(m.get("timestamp"), file, f"{where}.timestamp") if tau2 else None
    if role == "tool":
        call_id = _call_id(m.get("tool_call_id"), f"{where}.tool_call_id", file) \
            or _call_id(m.get("id"), f"{where}.id", file)
        error = m.get("error")
        if error is not None and not isinstance(error, bool):
            raise bad(file, f"{where}.error", "true or false", error)
        result = ToolResult(content=content or "", error=error, call_id=call_id,
                            name=optional_text(m.get("name"), file, f"{where}.name"))
        return Message("tool", content, result=result, requestor=requestor, time=time)
    tokens: dict[str, Any] = {}
    if role == "assistant":
        refusal = optional_text(m.get("refusal"), file, f"{where}.refusal")
        if refusal:
            # OpenAI's refusal: what the model said instead of an answer, its text.
            content = f"{content}\n\n{refusal}" if content and content.strip() else refusal
        usage = mapping(m.get("usage"), file, f"{where}.usage")
        # Chat Completions' names, else the Responses API's and Anthropic's.
        took = "prompt_tokens" if "prompt_tokens" in usage else "input_tokens"
        gave = "completion_tokens" if "completion_tokens" in usage else "output_tokens"
        prompt, completion, cost = usage.get(took), usage.get(gave), m.get("cost")
        tokens = {"tokens_in": None if prompt is None else integer(prompt, file, f"{where}.usage.{took}"),
                  "tokens_out": None if completion is None else integer(completion, file, f"{where}.usage.{gave}"),
                  "cost_usd": None if cost is None else number(cost, file, f"{where}.cost", minimum=0)}
    calls = []
    raw_calls = m.get("tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise bad(file, f"{where}.tool_calls", "a list of tool calls", raw_calls)
    for i, call in enumerate(raw_calls or ()):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict):
            raise bad(file, at, "a tool call (an object)", call)
        fn = call if tau2 else call.get("function", MISSING)
        fn_at = at if tau2 else f"{at}.function"
        if not isinstance(fn, dict):
            raise bad(file, fn_at, "an object with name and arguments", fn)
        if not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise ImportInputError(file, f"{fn_at}.name", "a tool call needs a function name (a non-empty string)")
        if tau2 and call.get("requestor") is not None:
            # Whose call it is: the message's side (a user's call on the
            # agent's message would make it an operation of the agent).
            side = "user" if role == "user" else "assistant"
            if call["requestor"] != side:
                got = repr(call["requestor"]) if isinstance(call["requestor"], str) else kind(call["requestor"])
                raise ImportInputError(file, f"{at}.requestor",
                                       f"expected {side!r} (the call is on {'an' if role[0] in 'aeiou' else 'a'} "
                                       f"{role} message), got {got}")
        arguments, raw = _arguments(fn.get("arguments", {}), f"{fn_at}.arguments", file)
        call_id = _call_id(call.get("id"), f"{at}.id", file)
        calls.append(ToolCall(call_id or f"call-{i + 1}", text(fn["name"], file, f"{fn_at}.name"), arguments, raw))
    legacy = m.get("function_call")
    if legacy is not None:
        at = f"{where}.function_call"
        if not isinstance(legacy, dict):
            raise bad(file, at, "an object with name and arguments", legacy)
        if not isinstance(legacy.get("name"), str) or not legacy["name"].strip():
            raise ImportInputError(file, f"{at}.name", "a function call needs a name (a non-empty string)")
        arguments, raw = _arguments(legacy.get("arguments", {}), f"{at}.arguments", file)
        # The legacy format has no call ids: the result is the next
        # ``function`` message, so an id from the message's place in its
        # transcript is exact (and stays the same wherever the record lies).
        calls.append(ToolCall(f"function_call-{position}", text(legacy["name"], file, f"{at}.name"), arguments,
                              raw))
    return Message(role, content, tuple(calls), requestor=requestor if role == "user" else "assistant", time=time,
                   **tokens)


# --- tau-bench -----------------------------------------------------------------------

#: tau-bench's ``terminate_tools``: a call to one ends the episode (the agent
#: handed the user over), as the user's ``###STOP###`` does.
TERMINATE_TOOLS = frozenset({"transfer_to_human_agents"})


def _tau_bench_termination(messages: list[Message]) -> str:
    """How a tau-bench episode ended, which the source does not record: the
    user's ``###STOP###`` (``user_stop``), the result of a terminate tool
    the agent called last (``agent_stop``), else the step limit cut it
    (``max_steps``: a transcript that ends anywhere else, on another tool's
    result, a user's message or the agent's text)."""
    if not messages:
        return "max_steps"
    last = messages[-1]
    if last.role == "user":
        return "user_stop" if "###STOP###" in (last.content or "") else "max_steps"
    at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    if last.role == "tool" and at is not None and all(m.role == "tool" for m in messages[at + 1:]) \
            and any(c.name in TERMINATE_TOOLS for c in messages[at].tool_calls):
        return "agent_stop"
    return "max_steps"


def _task_and_trial(record: dict[str, Any], file: str, where: str) -> tuple[str, int | None]:
    """A record's required ``task_id`` and optional ``trial``, checked."""
    if record.get("task_id") is None:
        raise ImportInputError(file, f"{where}.task_id", "missing; expected a string or an integer")
    task_id = identifier(record["task_id"], file, f"{where}.task_id")
    trial = record.get("trial")
    if trial is not None:
        integer(trial, file, f"{where}.trial")
    return task_id, trial


def read_tau_bench(path: Path, tools: Path | None = None, name: str | None = None) -> Runs:
    """A tau-bench trajectory file's runs (``name`` unused: its records name their tasks)."""
    data = read_json(path, "a JSON list of tau-bench records")
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
        where = f"record {index + 1}"  # counted from 1, as openai-jsonl's lines are
        if not isinstance(record, dict):
            raise bad(file, where, "a record {task_id, trial, reward, info, traj} (an object)", record)
        if not isinstance(record.get("traj"), list):
            raise bad(file, f"{where}.traj", "a list of messages", record.get("traj", MISSING))
        task_id, trial = _task_and_trial(record, file, where)
        reward = optional_number(record.get("reward"), file, f"{where}.reward")
        info = mapping(record.get("info"), file, f"{where}.info")
        task = mapping(info.get("task"), file, f"{where}.info.task")
        user_id = optional_text(task.get("user_id"), file, f"{where}.info.task.user_id")
        messages = [openai_message(m, f"{where}.traj[{i}]", file, position=i) for i, m in enumerate(record["traj"])]
        catalogue = read_catalogue()
        system = next((m.content or "" for m in messages if m.role == "system"), "")
        return Conversation(
            # No run id in the source: the run is its record's content, with
            # the model and domain its file's name gives it (identical records
            # of two models are two runs).
            source="tau-bench", file=path.name, record=where, source_id=f"{task_id}:{trial}",
            legacy_source_id=f"{task_id}:{trial}:{index}",
            content=fingerprint({"model": model, "domain": domain, "record": record}),
            task_id=f"{domain or 'tau-bench'}/{task_id}", model=model or "unknown",
            system_prompt=system, messages=tuple(messages), tools=catalogue,
            reward=reward,
            termination=_tau_bench_termination(messages),
            metadata={"trial": trial, "domain": domain, "user_id": user_id, "termination_inferred": True},
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


def read_tau2(path: Path, tools: Path | None = None, name: str | None = None) -> Runs:
    """A tau2 results file's runs (``name`` unused: its simulations name their tasks)."""
    data = read_json(path, "a tau2 results object with 'simulations'")
    file = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise ImportInputError(file, None, "expected a tau2 Results file: an object with 'info', 'tasks' "
                                           "and a 'simulations' list")
    info = mapping(data.get("info"), file, "info")
    env = mapping(info.get("environment_info"), file, "info.environment_info")
    agent = mapping(info.get("agent_info"), file, "info.agent_info")
    domain = optional_text(env.get("domain_name"), file, "info.environment_info.domain_name") or "unknown"
    policy = optional_text(env.get("policy"), file, "info.environment_info.policy") or ""
    model = optional_text(agent.get("llm"), file, "info.agent_info.llm") or "unknown"
    raw_tasks = data.get("tasks")
    if raw_tasks is not None and not isinstance(raw_tasks, list):
        raise bad(file, "tasks", "a list of tasks", raw_tasks)
    tasks = set()
    for i, t in enumerate(raw_tasks or ()):
        if not isinstance(t, dict):
            raise bad(file, f"tasks[{i}]", "a task (an object)", t)
        if t.get("id") is not None:
            tasks.add(identifier(t["id"], file, f"tasks[{i}].id"))
    simulations = data["simulations"]
    # Read when the first simulation is converted, once.
    read_catalogue = cache(lambda: _tau2_catalogues(path, domain, tools))

    def convert(index: int) -> Conversation:
        sim = simulations[index]
        where = f"simulations[{index}]"
        if not isinstance(sim, dict) or not isinstance(sim.get("messages"), list) or sim.get("id") is None:
            raise ImportInputError(file, where, "expected a simulation with 'id' and a 'messages' list")
        sim_id = identifier(sim["id"], file, f"{where}.id")
        task_id, trial = _task_and_trial(sim, file, where)
        termination = optional_text(sim.get("termination_reason"), file, f"{where}.termination_reason")
        start_time = sim.get("start_time")  # also kept as written, in the run's metadata
        started_at = optional_time(start_time, file, f"{where}.start_time")
        ended_at = optional_time(sim.get("end_time"), file, f"{where}.end_time")
        reward_info = mapping(sim.get("reward_info"), file, f"{where}.reward_info")
        reward = optional_number(reward_info.get("reward"), file, f"{where}.reward_info.reward")
        messages = [openai_message(m, f"{where}.messages[{i}]", file, tau2=True, position=i)
                    for i, m in enumerate(sim["messages"])]
        catalogue = read_catalogue()
        return Conversation(
            # tau2 names each simulation with a UUID: that is the run.
            source="tau2", file=path.name, record=where, source_id=sim_id, identity=f"id:{sim_id}",
            content=fingerprint(sim),
            task_id=f"{domain}/{task_id}", model=model,
            # The agent's system prompt is tau2's fixed wrapper around the
            # domain policy: the policy is what varies between files.
            system_prompt=policy, messages=(Message("system", policy),) + tuple(messages), tools=catalogue,
            reward=reward,
            termination=termination or "completed",
            metadata={"trial": trial, "domain": domain, "start_time": start_time, "task_known": task_id in tasks},
            started_at=started_at, ended_at=ended_at,
        )

    # tau2 writes results files with no simulation (a run stopped before its
    # first): with its 'info', such a file is tau2's own, and holds no run.
    return Runs(len(simulations), convert, recognised=isinstance(data.get("info"), dict))


def catalogue_in_tools(path: Path, folder: Path) -> bool:
    """A tool catalogue where tau-bench and tau2 look for one
    (``tools/<domain>_tools.json`` under the folder walked): not a trace."""
    parts = path.relative_to(folder).parts
    return len(parts) >= 2 and parts[-2] == "tools" and path.name.endswith("_tools.json")


def expand(paths: list[Path], patterns: tuple[str, ...],
           skip: Callable[[Path, Path], bool] | None = None) -> Iterator[tuple[Path, str]]:
    """Files as given; a folder gives its files matching ``patterns``,
    sorted, leaving out hidden ones (a name starting with ``.``, or inside
    such a folder: an editor's backup, ``.git``), and those ``skip(file,
    folder)`` names. Each file comes with its name in the import: its path
    below the folder given (``d1/chats.jsonl``), or its own name."""
    for path in paths:
        if path.is_dir():
            try:
                found = files_under(path, patterns, "a trace file")
            except UnreadableEntry as exc:
                raise ImportInputError(str(exc.path), None, exc.why) from None
            if skip is not None:
                found = [f for f in found if not skip(f, path)]
            if not found:
                raise ImportInputError(str(path), None, f"no {' or '.join(patterns)} file in this folder")
            yield from ((f, f.relative_to(path).as_posix()) for f in found)
        elif path.is_file():
            yield path, path.name
        else:
            raise ImportInputError(os.fspath(path), None, not_a_file(path, "a trace file or a folder of them"))
