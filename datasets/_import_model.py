"""What every importer produces: a source-neutral conversation.

Each format module (``_import_tau``, ``_import_openai``) reads its files into
:class:`Conversation` objects and nothing else; ``_import_writer`` turns a
conversation into journal commits. Keeping the middle plain means a format's
quirks are handled once, where the format is read, and the journal side
never guesses about a source.

Errors::

    BadInput (loopledger.engine)
    └── ImportInputError      a file, record and reason; ``loopledger import`` exits 2

The mappings every format shares live here too: a tool catalogue to the
validators' ``ToolSpec`` shape, a tool result to an outcome with a
normalised error code, and a successful result to evidence.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any, overload

import orjson

from loopledger.canonical import Canonical, is_unicode
from loopledger.engine import BadInput


class ImportInputError(BadInput):
    """An input file that cannot be imported. ``record`` names the record
    (``record 12``, ``line 3``, ``simulations[4]``), ``reason`` what was
    expected."""

    code = "import_input"

    def __init__(self, file: str, record: str | None, reason: str) -> None:
        super().__init__(f"{file}: {record}" if record else file, reason)
        self.file = file
        self.record = record


# --- checking the source's fields ----------------------------------------------------
#
# Every value an importer stores is checked here, where it is read, so a bad
# field is named in the source's own terms (``line 3.metadata.reward``), never
# found later as a stored value that cannot be written. ``where`` is the
# field's path in its file; each check returns the value as it is stored.


def kind(value: Any) -> str:
    """A JSON value's kind, as an error message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


#: What a JSON value nested beyond the parser's depth (about a thousand levels) is.
#: How deep a value the importer stores may nest (arguments, metadata, a
#: tool's schema): stored inside the artifacts' own nesting, deeper values
#: could not be written as canonical JSON. Real traces nest a few levels.
MAX_DEPTH = 200
TOO_DEEP = f"nested too deeply to read; expected JSON nested at most {MAX_DEPTH} levels, as a trace holds it"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: A field the record does not have, as ``record.get(key, MISSING)`` reads
#: it: :func:`bad` says "missing" for it, where ``None`` is a written null.
MISSING: Any = _Missing()


def bad(file: str, where: str, expected: str, value: Any) -> ImportInputError:
    """``<file>: <where>: expected <expected>, got <kind of value>`` (or
    ``missing; expected ...`` for :data:`MISSING`)."""
    if value is MISSING:
        return ImportInputError(file, where, f"missing; expected {expected}")
    return ImportInputError(file, where, f"expected {expected}, got {kind(value)}")


def text(value: Any, file: str, where: str) -> str:
    """A string that can be stored (JSON read by a lenient parser can hold
    lone surrogates, which are not Unicode text)."""
    if not isinstance(value, str):
        raise bad(file, where, "a string", value)
    if not is_unicode(value):
        raise ImportInputError(file, where, "not valid Unicode text (a lone surrogate escape)")
    return value


def optional_text(value: Any, file: str, where: str) -> str | None:
    return None if value is None else text(value, file, where)


#: What times are counted from, for those without a zone (read as UTC) and
#: those with one, and in what unit: the trace tables'.
_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def optional_time(value: Any, file: str, where: str) -> int | None:
    """An ISO-8601 time as microseconds since the epoch. A time without a
    zone is read as UTC; one with an offset is converted."""
    if value is None:
        return None
    written = text(value, file, where)
    try:
        moment = datetime.fromisoformat(written)
    except ValueError:
        raise ImportInputError(file, where, f"expected an ISO-8601 time, got {written[:64]!r}") from None
    # (The engine's to_us would take an aware time: making one costs more
    # than parsing it, and tau2's times, one per message, have no zone.)
    return (moment - (_EPOCH if moment.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND


def fingerprint(record: Any) -> str:
    """A record's content id: sha256 of its JSON with sorted keys (so the
    same record reformatted keeps its id)."""
    try:
        data = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits, which json reads
        data = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest()


#: A source name: it becomes the runs' tenant and the start of their ids.
SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


def identifier(value: Any, file: str, where: str) -> str:
    """An id: a string or an integer (tau-bench's task ids are integers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise bad(file, where, "a string or an integer", value)
    return text(value, file, where)


#: The largest value an Int64 column holds.
MAX_INT64 = (1 << 63) - 1


def integer(value: Any, file: str, where: str, *, minimum: int = 0) -> int:
    """A whole number in ``[minimum, 2**63)`` (what an Int64 column holds)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(file, where, "an integer", value)
    if value < minimum or value > MAX_INT64:
        raise ImportInputError(file, where, f"expected an integer >= {minimum}, got {value}")
    return value


def number(value: Any, file: str, where: str, *, minimum: float | None = None) -> float:
    """A finite number (JSON has no NaN or infinities; Python's json reads them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(file, where, "a number", value)
    result = float(value)
    if not math.isfinite(result):
        raise ImportInputError(file, where, f"expected a finite number, got {result!r}")
    if minimum is not None and result < minimum:
        raise ImportInputError(file, where, f"expected a number >= {minimum:g}, got {value}")
    return result


def optional_number(value: Any, file: str, where: str) -> float | None:
    return None if value is None else number(value, file, where)


def mapping(value: Any, file: str, where: str, expected: str = "an object") -> dict[str, Any]:
    """An object; null or absent is an empty one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(file, where, expected, value)
    return value


def plain(value: Any, file: str, where: str, depth: int = 0, root: str | None = None) -> Any:
    """Free-form JSON the importer stores as it is (arguments, metadata, a
    tool's schema): every number finite, every string Unicode text, nested
    at most :data:`MAX_DEPTH` levels (``root``: the field it began at)."""
    root = where if root is None else root
    if isinstance(value, str):
        return text(value, file, where)
    if isinstance(value, float):
        return number(value, file, where)
    if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
        # The field where it began, not the two hundred keys below it.
        raise ImportInputError(file, root, f"nested more than {MAX_DEPTH} levels deep; expected JSON nested at "
                                           f"most {MAX_DEPTH} levels, as a trace holds it")
    if isinstance(value, dict):
        for key, item in value.items():
            text(key, file, f"{where} (a key)")
            plain(item, file, f"{where}.{key}", depth + 1, root)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            plain(item, file, f"{where}[{i}]", depth + 1, root)
    return value


@dataclass(frozen=True)
class ToolCall:
    """A call as the source wrote it. ``arguments`` when they parsed as an
    object, else ``raw_arguments`` (the text received)."""

    call_id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer. ``error`` is the source's own flag (tau2), None when
    the source has none and the content decides."""

    content: str
    error: bool | None = None
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Message:
    """One message of the transcript, OpenAI-shaped.

    ``requestor`` is ``user`` for tau2's tool calls made by the simulated
    user (and their results): they are kept in the transcript, marked, and
    never become the agent's operations."""

    role: str  # system | user | assistant | tool
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    result: ToolResult | None = None  # role tool
    requestor: str = "assistant"
    #: Usage and price as the source gives them; None where it does not say
    #: (tau-bench and ToolBench never do), never a guessed 0.
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    #: When the source says the message was made (:func:`optional_time`), None if it does not.
    time: int | None = None
    #: ToolBench's ``Finish`` pseudo-tool: the agent's answer (a text item after ``content``)
    #: and how it finished (``give_answer``, ``give_up_and_restart``); None for other messages.
    answer: str | None = None
    finish: str | None = None

    def context_form(self) -> dict[str, Any]:
        """The message as a context artifact holds it (plain JSON, small:
        provider ``raw_data`` and the like are left out)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.call_id, "name": c.name,
                 **({"arguments": c.arguments} if c.arguments is not None else {"raw_arguments": c.raw_arguments})}
                for c in self.tool_calls
            ]
        if self.result is not None:
            out["tool_call_id"] = self.result.call_id
            if self.result.name:
                out["name"] = self.result.name
            if self.result.error is not None:
                out["error"] = self.result.error
        if self.requestor != "assistant":
            out["requestor"] = self.requestor
        if self.finish is not None:
            out["finish"] = {"return_type": self.finish, "final_answer": self.answer}
        return out


@dataclass(frozen=True)
class Conversation:
    """One run of an external agent, ready to be written as a journal run."""

    source: str  # the format: tau-bench, tau2, openai-jsonl, toolbench
    file: str  # the file's name (kept in the run's spec; never part of its id)
    record: str  # where in the file: "record 3", "simulations[12]", "line 7" (never part of the run's id)
    source_id: str  # the source's own name of the run (tau2's simulation id, openai-jsonl's metadata.id, ...)
    task_id: str
    model: str
    system_prompt: str  # the policy/system text; its hash is the prompt_version
    messages: tuple[Message, ...]
    tools: Canonical  # ToolSpec dicts, serialised once per catalogue
    reward: float | None
    #: How the source says the run ended: ``completed``, ``max_steps``, ...
    termination: str = "completed"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: The record's content id (:func:`fingerprint`).
    content: str = ""
    #: When the source says the run started and ended (:func:`optional_time`), None if it does not.
    started_at: int | None = None
    ended_at: int | None = None
    #: The importer's format when ``source`` names something else (openai-jsonl's ``metadata.source``).
    format: str = ""
    #: What identifies the run (docs/importers.md): ``id:<id>`` where the format has a real run id
    #: (tau2's simulation UUID), else empty: the record's content (``sha256:<content>``).
    identity: str = ""
    #: The source id earlier versions put in the run id with the file's name (tau-bench's
    #: ``task:trial:index``, openai-jsonl's ``line N``); empty: ``source_id``.
    legacy_source_id: str = ""

    def __post_init__(self) -> None:
        # Each message's usage was checked where it was read; the run's
        # totals (its runs row) must fit the tables too.
        for name, what in (("tokens_in", "prompt tokens"), ("tokens_out", "completion tokens")):
            total = sum(getattr(m, name) or 0 for m in self.messages)
            if total > MAX_INT64:
                raise ImportInputError(self.file, self.record, f"the run's {what} add up to {total}, beyond what a "
                                                               f"trace holds (at most {MAX_INT64}); expected real usage")
        cost = sum(m.cost_usd or 0.0 for m in self.messages)  # as the tables add it up
        if not math.isfinite(cost):
            raise ImportInputError(self.file, self.record, "the run's costs add up past the largest number a trace "
                                                           "holds; expected real prices")

    @cached_property
    def run_id(self) -> str:
        # Deterministic, so importing the same record again finds the run
        # already there instead of duplicating it, and independent of where
        # the record lies: neither the file's name (a gzipped copy, a renamed
        # file) nor the record's position (a record added in front) changes it.
        return self._id_of(f"{self.source}|{self.identity or 'sha256:' + self.content}")

    @property
    def legacy_run_ids(self) -> tuple[str, str]:
        """The ids earlier versions gave this run (from the file's name, the
        record's position and, later, its content): a trace folder holding
        one imported the run already."""
        old = self.legacy_source_id or self.source_id
        return (self._id_of(f"{self.source}|{self.file}|{old}|{self.content}"),
                self._id_of(f"{self.source}|{self.file}|{old}"))

    def _id_of(self, key: str) -> str:
        return f"{self.source}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    @property
    def prompt_version(self) -> str:
        return "sha256:" + hashlib.sha256(self.system_prompt.encode()).hexdigest()[:12]


class Runs(Sequence[Conversation]):
    """A file's runs, each converted from its record (and checked) when it is
    asked for: a process that imports part of a file (see ``_import_run``)
    converts that part only. Asking twice converts twice. ``invalid``: runs
    the file holds that its source marks as not usable (ToolBench's
    ``valid_data: false``), skipped and counted apart. ``recognised``: the
    file is plainly the format's own even when it holds no run (a tau2
    results file of a run that simulated nothing); an empty set of runs is
    then no sign of a wrong format."""

    def __init__(self, count: int, convert: Callable[[int], Conversation], invalid: int = 0,
                 recognised: bool = False) -> None:
        self._count = count
        self._convert = convert
        self.invalid = invalid
        self.recognised = recognised

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Conversation: ...

    @overload
    def __getitem__(self, index: slice) -> list[Conversation]: ...

    def __getitem__(self, index: int | slice) -> Conversation | list[Conversation]:
        if isinstance(index, slice):
            return [self._convert(i) for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return self._convert(index)


# --- tool catalogues ----------------------------------------------------------------


def tool_specs(entries: Sequence[Any], read_only: Mapping[str, bool] | None = None,
               file: str = "tools", where: str = "") -> list[dict[str, Any]]:
    """OpenAI ``tools`` entries (``{"type": "function", "function": {...}}``)
    or legacy ``functions`` entries (``{name, parameters}``) → ToolSpec dicts.
    ``read_only``: tool name → True for tools that only read (tau2's
    ``tool_types``), used by the permission checks. ``where``: the list's
    path in ``file``."""
    specs = []
    for i, entry in enumerate(entries):
        # Named where it is: an OpenAI tool's fields are under its ``function``.
        at = f"{where}[{i}].function" if isinstance(entry, dict) and "function" in entry else f"{where}[{i}]"
        fn = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise ImportInputError(file, at if isinstance(fn, dict) else f"{where}[{i}]",
                                   "a tool needs a name (OpenAI tools or functions format)")
        name = text(fn["name"], file, f"{at}.name")
        schema = fn.get("parameters")
        if schema is not None and not isinstance(schema, dict):
            raise bad(file, f"{at}.parameters", "a JSON Schema object", schema)
        schema = plain(schema, file, f"{at}.parameters") or {"type": "object"}
        specs.append({"name": name, "version": None, "schema": _standard_schema(schema),
                      "read_only": bool((read_only or {}).get(name, False))})
    return specs


def _standard_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """ToolBench schemas list ``optional`` beside ``required``: not JSON
    Schema; dropped so the schema validator reads a standard schema."""
    if "optional" in schema and isinstance(schema.get("optional"), list):
        return {k: v for k, v in schema.items() if k != "optional"}
    return schema


def read_only_map(tool_types: Any, file: str = "tools", where: str = "tool_types") -> dict[str, bool]:
    """tau2's ``tool_types`` (name → ``read``/``write``/``generic``)."""
    kinds = mapping(tool_types, file, where, "an object mapping tool names to read, write or generic")
    for name, kind_name in kinds.items():
        # Sources add their own types (tau-bench's ``think``): any string is
        # taken, and only ``read`` marks a tool read-only.
        if not isinstance(kind_name, str):
            raise bad(file, f"{where}.{name}", "read, write or generic", kind_name)
    return {name: kind_name.lower() == "read" for name, kind_name in kinds.items()}


# --- outcomes, error codes, evidence ------------------------------------------------

#: Error text → normalised code, first match wins (docs/importers.md lists them).
#: Ordered from specific to general: "Tool x not found" is an unknown tool,
#: not a missing record.
ERROR_CODES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (code, re.compile(pattern, re.IGNORECASE))
    for code, pattern in (
        ("UNKNOWN_TOOL", r"unknown tool|tool .* not found|no such function|not a valid tool"),
        ("INVALID_ARGUMENTS", r"validation error|invalid|missing .*argument|required|unexpected keyword"
                              r"|argument|not a valid|must be"),
        ("TIMEOUT", r"time(d)? ?out"),
        ("INSUFFICIENT_FUNDS", r"not enough balance|balance is not enough|insufficient"),
        ("UNAVAILABLE", r"not available|not enough seats|sold out|no seats|unavailable"),
        ("PAYMENT_MISMATCH", r"does not add up|amount .* (mismatch|incorrect)"),
        ("NOT_FOUND", r"not found|does not exist|no such"),
        ("NOT_PERMITTED", r"cannot|can't|not allowed|not permitted|only .* can|is not eligible|already"),
        ("RATE_LIMIT", r"rate limit|too many requests"),
        ("PROVIDER_ERROR", r"message error|http|connection|server error|status code"),
        ("EXECUTION_ERROR", r"executing|exception|traceback"),
    )
)
GENERIC_ERROR = "TOOL_ERROR"


def error_code(text: str) -> str:
    """The normalised code of an error message (``TOOL_ERROR`` when no rule matches)."""
    body = text[len("Error:"):] if text.startswith("Error:") else text
    for code, pattern in ERROR_CODES:
        if pattern.search(body):
            return code
    return GENERIC_ERROR


#: Arguments that name what a call is about, in order of preference.
SUBJECT_KEYS = ("reservation_id", "order_id", "user_id", "flight_number", "customer_id", "line_id",
                "phone_number", "id", "query")


def evidence_subject(arguments: Mapping[str, Any] | None) -> str | None:
    """The subject of a successful call's evidence: a known id argument,
    else the first ``*_id`` argument, else the first string argument."""
    if not arguments:
        return None
    for key in SUBJECT_KEYS:
        value = arguments.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    for key, value in arguments.items():
        if key.endswith("_id") and isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    for value in arguments.values():
        if isinstance(value, str):
            return value[:200]
    return None


@dataclass(frozen=True)
class Outcome:
    """A tool result as the engine records it."""

    outcome: str  # success | validation_failed | unknown_outcome
    status: str  # succeeded | failed | unknown
    error_code: str | None
    evidence: tuple[dict[str, Any], ...]


#: A call the transcript never answered (the run ended first).
NO_RESULT = Outcome("unknown_outcome", "unknown", "NO_RESULT", ())


def outcome_of(call: ToolCall, result: ToolResult) -> Outcome:
    """The source's ``error`` flag decides when it has one; otherwise a
    result whose text starts with ``Error`` (tau-bench), or a ToolBench
    result whose ``error`` field is not empty, is a failure."""
    failed = result.error
    text = result.content
    message = text
    if failed is None:
        toolbench = _toolbench_error(text)
        failed = text.lstrip().startswith("Error") or toolbench is not None
        message = toolbench or text
    if failed:
        return Outcome("validation_failed", "failed", error_code(message), ())
    subject = evidence_subject(call.arguments)
    return Outcome("success", "succeeded", None, ({"kind": call.name, "subject": subject},))


#: The start of a ToolBench result, ``{"error": ...``, whatever the spacing.
_TOOLBENCH_RESULT = re.compile(r'\s*\{\s*"error"\s*:')


def _toolbench_error(text: str) -> str | None:
    """ToolBench results are ``{"error": ..., "response": ...}``: the
    failure's message when ``error`` is not empty, else None. Not empty: a
    non-empty string, or any other value but null, false, 0, ``{}`` and
    ``[]`` (``{"code": 5}`` is a failure too, its message that JSON)."""
    if not text.startswith('{"error": ') and not _TOOLBENCH_RESULT.match(text):
        return None
    if text.startswith('{"error": ""'):
        return None  # ToolBench's success, by far the most common: not parsed
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None  # not a ToolBench result: the text is the message
    error = value.get("error") if isinstance(value, dict) else None
    if not error:
        return None
    return error if isinstance(error, str) else json.dumps(error, sort_keys=True, ensure_ascii=False)
