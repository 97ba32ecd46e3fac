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

from ._import_model import (
    SOURCE_NAME,
    Conversation,
    ImportInputError,
    Runs,
    bad,
    fingerprint,
    identifier,
    mapping,
    optional_number,
    optional_text,
    plain,
    tool_specs,
)
from ._import_tau import load_catalogue, openai_message, read_json

#: ``metadata`` keys with a meaning, and what each must be (docs/importers.md).
_META_TEXT = ("model", "source", "termination")


def read_openai_jsonl(path: Path, tools: Path | None = None) -> Runs:
    file = str(path)
    shared = load_catalogue(tools)[0] if tools is not None else None
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as Windows tools write, is dropped
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, UnicodeDecodeError) and exc.object[:2] == b"\x1f\x8b":
            raise ImportInputError(file, None, "a gzip file; expected JSON lines as plain UTF-8 text "
                                               "(gunzip it first)") from None
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
        meta = mapping(record.get("metadata"), file, f"{where}.metadata")
        run_id = meta.get("id")
        run_id = None if run_id is None else identifier(run_id, file, f"{where}.metadata.id")
        task_id = meta.get("task_id")
        task_id = None if task_id is None else identifier(task_id, file, f"{where}.metadata.task_id")
        named = {key: optional_text(meta.get(key), file, f"{where}.metadata.{key}") for key in _META_TEXT}
        if named["source"] is not None and not SOURCE_NAME.match(named["source"]):
            raise ImportInputError(file, f"{where}.metadata.source",
                                   f"expected a name of letters, digits, '_', '.', ':' or '-' (at most 64, starting "
                                   f"with a letter or digit): it becomes the runs' tenant; got {named['source']!r}")
        reward = optional_number(meta.get("reward"), file, f"{where}.metadata.reward")
        extra = {k: plain(v, file, f"{where}.metadata.{k}") for k, v in meta.items() if k != "reward"}
        messages = [openai_message(m, f"{where}.messages[{i}]", file) for i, m in enumerate(record["messages"])]
        key = "tools" if record.get("tools") not in (None, []) else "functions"
        entries = record.get(key)
        if entries is not None and not isinstance(entries, list):
            raise bad(file, f"{where}.{key}", "a list of tools", entries)
        catalogue = Canonical(tool_specs(entries, None, file, f"{where}.{key}")) if entries else shared
        if catalogue is None:
            catalogue = Canonical([])
        return Conversation(
            source=named["source"] or "openai-jsonl", format="openai-jsonl", file=path.name, record=where,
            content=fingerprint(record),
            source_id=run_id or where, task_id=task_id or f"{path.stem}/{number}",
            model=named["model"] or "unknown",
            system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
            messages=tuple(messages), tools=catalogue, reward=reward,
            termination=named["termination"] or "completed", metadata=extra,
        )

    return Runs(len(lines), convert)


def read_toolbench(path: Path, tools: Path | None = None) -> list[Conversation]:
    file = str(path)
    data = read_json(path)
    answer = data.get("answer_generation") if isinstance(data, dict) else None
    if isinstance(answer, dict) and "valid_data" in answer and not isinstance(answer["valid_data"], bool):
        raise bad(file, "answer_generation.valid_data", "true or false", answer["valid_data"])
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
    finish_type = optional_text(answer.get("finish_type"), file, "answer_generation.finish_type")
    query = optional_text(answer.get("query"), file, "answer_generation.query")
    win = data.get("win")
    if win is not None and not isinstance(win, bool):
        raise bad(file, "win", "true or false", win)
    functions = answer.get("function")
    if functions is not None and not isinstance(functions, list):
        raise bad(file, "answer_generation.function", "a list of tools", functions)
    messages = [openai_message(m, f"train_messages[-1][{i}]", file) for i, m in enumerate(path_messages)]
    catalogue = load_catalogue(tools)[0] if tools is not None else Canonical(
        tool_specs(functions or [], None, file, "answer_generation.function"))
    return [Conversation(
        source="toolbench", file=path.name, record="answer_generation", source_id=path.parent.name + "/" + path.name,
        content=fingerprint(data),
        task_id=f"{path.parent.name}/{path.stem.split('_')[0]}", model="gpt-3.5-turbo",
        system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
        messages=tuple(messages), tools=catalogue,
        reward=None if win is None else float(win),
        termination="completed" if finish_type == "give_answer" else "gave_up",
        metadata={"finish_type": finish_type, "query": query},
    )]
