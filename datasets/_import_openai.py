"""OpenAI chat JSONL and ToolBench answers → conversations.

``openai-jsonl`` (docs/importers.md): one conversation per line,
``{"messages": [...], "tools": [...]?, "metadata": {...}?}``, plain or
gzipped. Messages are OpenAI chat messages: ``tool_calls`` with JSON-string
arguments and ``tool`` results, or the legacy ``function_call`` with
``function`` results. ``metadata`` may name ``id``, ``task_id``, ``model``,
``reward``, ``source`` and ``termination``.

``toolbench``: ToolBench's answer files (``answer_generation`` with
``train_messages`` in the legacy ``function_call`` shape and the tool list
in ``function``); the last message path is the run, ``win`` its reward, and
its ``Finish`` pseudo-tool call the agent's final answer (not a tool call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopledger.canonical import Canonical

from ._import_model import (
    MISSING,
    SOURCE_NAME,
    TOO_DEEP,
    Conversation,
    ImportInputError,
    Message,
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
from ._import_tau import load_catalogue, openai_message, read_bytes, read_json

#: ``metadata`` keys with a meaning, and what each must be (docs/importers.md).
_META_TEXT = ("model", "source", "termination")


def _stem(name: str) -> str:
    """``chats`` for ``chats.jsonl`` and ``chats.jsonl.gz``; ``d1/chats`` for ``d1/chats.jsonl``."""
    return name.removesuffix(".gz").removesuffix(".jsonl")


def _json_line(line: bytes, file: str, where: str) -> Any:
    """One line's JSON value; bad input naming the line when it is not UTF-8
    or not JSON."""
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportInputError(file, where, f"not UTF-8 text (byte 0x{line[exc.start]:02x} at column "
                                            f"{exc.start + 1}); expected JSON lines in UTF-8") from None
    try:
        # json, not orjson: it reads integers beyond 64 bits as integers,
        # and NaN, infinities and lone surrogate escapes, which the checks
        # then refuse naming the field.
        return json.loads(decoded)
    except ValueError as exc:
        raise ImportInputError(file, where, f"not a JSON object ({exc}); truncated, or not JSONL?") from None
    except RecursionError:
        raise ImportInputError(file, where, TOO_DEEP) from None


def read_openai_jsonl(path: Path, tools: Path | None = None, name: str | None = None) -> Runs:
    """A JSONL file's runs, one per line. ``name``: the file's name in the
    import (its path below the folder given), which the default task ids
    start with, so that ``d1/chats.jsonl`` and ``d2/chats.jsonl`` do not
    share them."""
    file = str(path)
    shared = load_catalogue(tools)[0] if tools is not None else None
    # Lines are cut at "\n" only: a JSON string may hold U+2028 and the like,
    # which text's splitlines would cut at.
    lines = [(number, line) for number, line in enumerate(read_bytes(path).split(b"\n"), start=1) if line.strip()]
    stem = _stem(name or path.name)

    def convert(index: int) -> Conversation:
        number, line = lines[index]
        where = f"line {number}"
        record = _json_line(line, file, where)
        if not isinstance(record, dict):
            raise bad(file, where, "an object with a 'messages' list", record)
        if not isinstance(record.get("messages"), list):
            raise bad(file, f"{where}.messages", "a list of messages", record.get("messages", MISSING))
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
        messages = [openai_message(m, f"{where}.messages[{i}]", file, position=i)
                    for i, m in enumerate(record["messages"])]
        if shared is not None:
            # --tools is the catalogue of every file, whatever a line says
            # (as it is for the other formats); the line's own is not read.
            catalogue = shared
        else:
            key = "tools" if record.get("tools") not in (None, []) else "functions"
            entries = record.get(key)
            if entries is not None and not isinstance(entries, list):
                raise bad(file, f"{where}.{key}", "a list of tools", entries)
            catalogue = Canonical(tool_specs(entries or [], None, file, f"{where}.{key}"))
        return Conversation(
            # The run is its line's content: neither the line's number nor the file's name.
            source=named["source"] or "openai-jsonl", format="openai-jsonl", file=path.name, record=where,
            content=fingerprint(record), source_id=run_id or "", legacy_source_id=run_id or where,
            task_id=task_id or f"{stem}/{number}",
            model=named["model"] or "unknown",
            system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
            messages=tuple(messages), tools=catalogue, reward=reward,
            termination=named["termination"] or "completed", metadata=extra,
        )

    return Runs(len(lines), convert)


#: ToolBench's pseudo-tool that ends a run: ``{return_type, final_answer}``.
FINISH = "Finish"


def _finished(message: Message) -> Message:
    """ToolBench's ``Finish`` call is the agent's final answer, not a tool
    call: nothing executes it and no result follows. Its ``final_answer``
    becomes the message's answer (a text item); ``give_up_and_restart``
    leaves none. A Finish whose arguments are not a JSON object cannot be
    read as either and stays a call."""
    if len(message.tool_calls) != 1 or message.tool_calls[0].name != FINISH \
            or message.tool_calls[0].arguments is None:
        return message
    arguments = message.tool_calls[0].arguments
    answer = arguments.get("final_answer")
    return_type = arguments.get("return_type")
    return Message(message.role, message.content, (), requestor=message.requestor,
                   answer=answer if isinstance(answer, str) and answer.strip() else None,
                   finish=return_type if isinstance(return_type, str) else "")


def read_toolbench(path: Path, tools: Path | None = None, name: str | None = None) -> Runs:
    """A ToolBench answer file's run (``name`` unused: its task id is its folder and query number)."""
    file = str(path)
    data = read_json(path, "a ToolBench answer object with 'answer_generation'")
    answer = data.get("answer_generation") if isinstance(data, dict) else None
    if isinstance(answer, dict) and "valid_data" in answer and not isinstance(answer["valid_data"], bool):
        raise bad(file, "answer_generation.valid_data", "true or false", answer["valid_data"])
    if isinstance(answer, dict) and answer.get("valid_data") is False:
        # ToolBench marks answers it could not turn into a message path
        # (2 of its 15 examples) as not valid: skipped, whatever else the
        # file holds, and counted apart.
        return Runs(0, lambda index: None, invalid=1)  # type: ignore[arg-type,return-value]
    if not isinstance(answer, dict) or not isinstance(answer.get("train_messages"), list) \
            or not answer["train_messages"]:
        raise ImportInputError(file, None, "expected a ToolBench answer file with answer_generation.train_messages")
    # train_messages holds the message path of each expansion of the
    # search; the last one is the path the answer came from.
    last = len(answer["train_messages"]) - 1
    where = f"answer_generation.train_messages[{last}]"
    path_messages = answer["train_messages"][last]
    if not isinstance(path_messages, list):
        raise bad(file, where, "a list of messages", path_messages)
    finish_type = optional_text(answer.get("finish_type"), file, "answer_generation.finish_type")
    query = optional_text(answer.get("query"), file, "answer_generation.query")
    win = data.get("win")
    if win is not None and not isinstance(win, bool):
        raise bad(file, "win", "true or false", win)
    functions = answer.get("function")
    if functions is not None and not isinstance(functions, list):
        raise bad(file, "answer_generation.function", "a list of tools", functions)
    messages = [_finished(openai_message(m, f"{where}[{i}]", file, position=i)) for i, m in enumerate(path_messages)]
    catalogue = load_catalogue(tools)[0] if tools is not None else Canonical(
        tool_specs(functions or [], None, file, "answer_generation.function"))
    conversation = Conversation(
        # No run id in the source: the run is the file's content.
        source="toolbench", file=path.name, record="answer_generation", source_id=path.parent.name + "/" + path.name,
        content=fingerprint(data),
        task_id=f"{path.parent.name}/{path.name.split('_')[0].split('.')[0]}", model="gpt-3.5-turbo",
        system_prompt=next((m.content or "" for m in messages if m.role == "system"), ""),
        messages=tuple(messages), tools=catalogue,
        reward=None if win is None else float(win),
        termination="completed" if finish_type == "give_answer" else "gave_up",
        metadata={"finish_type": finish_type, "query": query},
    )
    return Runs(1, lambda index: conversation)
