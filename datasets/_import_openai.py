"""OpenAI chat JSONL and ToolBench answers → conversations.

``openai-jsonl`` (docs/importers.md): one conversation per line,
``{"messages": [...], "tools": [...]?, "metadata": {...}?}``. Messages are
OpenAI chat messages: ``tool_calls`` with JSON-string arguments and
``tool`` results, or the legacy ``function_call`` with ``function``
results. ``metadata`` may name ``id``, ``task_id``, ``model``, ``reward``,
``source`` and ``termination``.

``toolbench``: ToolBench's answer files (``answer_generation`` with
``train_messages`` in the legacy ``function_call`` shape and the tool list
in ``function``); the last message path is the run, ``win`` its reward.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopledger.canonical import Canonical

from ._import_model import Conversation, ImportInputError, Runs, tool_specs
from ._import_tau import load_catalogue, openai_message, read_json


def read_openai_jsonl(path: Path, tools: Path | None = None) -> Runs:
    file = str(path)
    shared = load_catalogue(tools)[0] if tools is not None else None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportInputError(file, None, f"cannot read as UTF-8 text: {exc}") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]

    def convert(index: int) -> Conversation:
        number, line = lines[index]
        where = f"line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ImportInputError(file, where, f"not a JSON object ({exc}); truncated, or not JSONL?") from None
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            raise ImportInputError(file, where, "expected an object with a 'messages' list")
        meta = record.get("metadata") or {}
        if not isinstance(meta, dict):
            raise ImportInputError(file, f"{where}.metadata", "expected an object")
        messages = [openai_message(m, f"{where}.messages[{i}]", file) for i, m in enumerate(record["messages"])]
        entries = record.get("tools") or record.get("functions")
        if entries is not None and not isinstance(entries, list):
            raise ImportInputError(file, f"{where}.tools", "expected a list of tools")
        catalogue = Canonical(tool_specs(entries, None, f"{file}: {where}.tools")) if entries else shared
        if catalogue is None:
            catalogue = Canonical([])
        reward = meta.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise ImportInputError(file, f"{where}.metadata.reward", "expected a number")
        return Conversation(
            source=str(meta.get("source") or "openai-jsonl"), file=path.name, record=where,
            source_id=str(meta.get("id") or where), task_id=str(meta.get("task_id") or f"{path.stem}/{number}"),
            model=str(meta.get("model") or "unknown"),
            system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
            messages=tuple(messages), tools=catalogue,
            reward=float(reward) if reward is not None else None,
            termination=str(meta.get("termination") or "completed"),
            metadata={k: v for k, v in meta.items() if k not in ("reward",)},
        )

    return Runs(len(lines), convert)


def read_toolbench(path: Path, tools: Path | None = None) -> list[Conversation]:
    file = str(path)
    data = read_json(path)
    answer = data.get("answer_generation") if isinstance(data, dict) else None
    if isinstance(answer, dict) and answer.get("valid_data") is False and "train_messages" not in answer:
        # ToolBench marks answers it could not turn into a message path
        # (2 of its 15 examples): nothing the agent decided is recorded.
        return []
    if not isinstance(answer, dict) or not isinstance(answer.get("train_messages"), list) \
            or not answer["train_messages"]:
        raise ImportInputError(file, None, "expected a ToolBench answer file with answer_generation.train_messages")
    # train_messages holds the message path of each expansion of the
    # search; the last one is the path the answer came from.
    path_messages = answer["train_messages"][-1]
    if not isinstance(path_messages, list):
        raise ImportInputError(file, "answer_generation.train_messages[-1]", "expected a list of messages")
    messages = [openai_message(m, f"train_messages[-1][{i}]", file) for i, m in enumerate(path_messages)]
    catalogue = load_catalogue(tools)[0] if tools is not None else Canonical(
        tool_specs(answer.get("function") or [], None, f"{file}: answer_generation.function"))
    win = data.get("win")
    return [Conversation(
        source="toolbench", file=path.name, record="answer_generation", source_id=path.parent.name + "/" + path.name,
        task_id=f"{path.parent.name}/{path.stem.split('_')[0]}", model="gpt-3.5-turbo",
        system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
        messages=tuple(messages), tools=catalogue,
        reward=None if win is None else float(bool(win)),
        termination="completed" if answer.get("finish_type") == "give_answer" else "gave_up",
        metadata={"finish_type": answer.get("finish_type"), "query": answer.get("query")},
    )]

