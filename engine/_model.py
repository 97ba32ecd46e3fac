"""Model adapters: typed stream events in, a candidate out.

MODEL_RUNNING only *collects*. An adapter turns a provider's stream into the
events below; :func:`collect` assembles them into candidate items. The
finish reason is what the stream says, or ``incomplete`` when it ended
without one, or ``error`` when it broke with an error: only ``stop`` and
``tool_calls`` are trusted finishes that may move to VALIDATING. Tool-call
arguments are assembled from their deltas and parsed only once the stream
is complete, so a half-received call can never reach a tool.

The scripted model (:class:`ScriptedModel`) is the embedded default: it
plays a scenario's ``model:`` entries, faulty forms included. Provider
adapters (``openai:MODEL``, ``anthropic:MODEL``) live in ``_openai`` and
``_anthropic``; ``_routes`` picks one for a run's ``model_route``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from loopledger.canonical import canonical_json, is_unicode, strict_loads, unique_keys
from loopledger.validators._model import split_tool_name

from ._errors import ModelTimeout
from ._scenario import ModelEntry, Usage as UsageSpec

TRUSTED_FINISHES = frozenset({"stop", "tool_calls"})
#: A scripted entry that gives no usage.
_NO_USAGE = UsageSpec()


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call; pieces of one call share ``index``."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ItemEvent:
    """A structured item delivered whole (a claim or a plan)."""

    item: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    #: Every input token of the call, cached ones included.
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    #: The part of ``tokens_in`` served from the provider's prompt cache.
    cached_tokens_in: int = 0


@dataclass(frozen=True)
class Finish:
    reason: str  # stop | tool_calls | length | content_filter


@dataclass(frozen=True)
class StreamError:
    message: str
    code: str = "model_error"
    #: False when a new attempt on the same context cannot help (a bad
    #: request, bad credentials): the run fails at once.
    retryable: bool = True
    #: How long the provider asked to wait before the next attempt.
    retry_after_s: float | None = None
    #: The stream had begun and broke: the attempt is ``incomplete``, not
    #: an answer the provider refused.
    incomplete: bool = False


StreamEvent = Union[TextDelta, ToolCallDelta, ItemEvent, Usage, Finish, StreamError]


@dataclass(frozen=True)
class ModelRequest:
    """What one model attempt is given: the frozen context and where it is."""

    run_id: str
    step: int
    attempt: int
    #: 0-based index of this attempt among all the run's model attempts.
    attempt_index: int
    prompt_version: str
    context: dict[str, Any]
    #: Builds the whole conversation (the context chain's messages, oldest
    #: first). Called only by adapters that send it, so the scripted model
    #: never pays for walking the chain.
    conversation: Callable[[], list[dict[str, Any]]] | None = None
    #: Seconds left of the run's deadline when this attempt begins (None:
    #: no deadline). The context's own ``budget`` was frozen when the step
    #: began: a retry in the same step has less time than it says.
    time_left_s: float | None = None
    #: Tokens left of the run's ``max_tokens`` when this attempt begins
    #: (None: no such budget); as for the deadline, the context's figure is
    #: the one of the step's first attempt.
    tokens_left: int | None = None

    def messages(self) -> list[dict[str, Any]]:
        if self.conversation is None:
            return list(self.context.get("messages", []))
        return self.conversation()


class ModelAdapter(Protocol):
    route: str

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]: ...


def within(seconds: float, open_stream: Callable[[], Any], *, provider: str) -> Iterator[Any]:
    """The items of the SDK stream (an iterable with ``close()``) that
    ``open_stream()`` opens, for ``seconds`` of wall time in all, the opening
    included; past that, :class:`ModelTimeout`.

    A vendor SDK's timeout bounds each read, so a server that sends a little
    now and then would keep a call going for ever. Here the SDK works in a
    thread of its own and hands its items over as they come, while the
    caller waits no longer than the time left. When the time is up, or the
    caller stops reading, the thread closes the stream at its next item, or
    when its next read times out: ``open_stream`` must set the SDK's own
    timeout, so that thread ends too. Closing is left to the thread because
    an SDK stream is not to be used by two threads at once.
    """
    end = time.monotonic() + seconds
    handed: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    stop = threading.Event()

    def pump() -> None:
        try:
            with closing(open_stream()) as stream:
                for item in stream:
                    if stop.is_set():
                        return
                    handed.put(("item", item))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            handed.put(("raise", exc))
        else:
            handed.put(("end", None))

    threading.Thread(target=pump, name="loopledger-model-call", daemon=True).start()
    try:
        while True:
            left = end - time.monotonic()
            try:
                if left <= 0:
                    raise queue.Empty
                kind, value = handed.get(timeout=left)
            except queue.Empty:
                raise ModelTimeout(f"no complete answer within {seconds:g}s", provider=provider) from None
            if kind == "end":
                return
            if kind == "raise":
                raise value
            yield value
    finally:
        stop.set()


class ScriptExhausted(Exception):
    """The scripted model has no entry left for this attempt."""


@dataclass
class Collected:
    """A candidate assembled from one attempt's stream."""

    items: list[dict[str, Any]]
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    error: StreamError | None = None

    @property
    def trusted(self) -> bool:
        return self.finish_reason in TRUSTED_FINISHES


def _clean(value: Any) -> Any:
    """``value`` with every string made storable: a NUL character, which
    PostgreSQL's text cannot hold, and unpaired surrogates, which have no
    UTF-8 form, become U+FFFD. What a model sends is cleaned once, here,
    so every record of it (items, operations, messages) holds the same
    text on every journal."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        if not is_unicode(value):
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def collect(events: Iterator[StreamEvent]) -> Collected:
    """Assemble items from a stream. Text deltas join into one text item;
    tool calls are parsed only after the stream ended, in index order."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    structured: list[dict[str, Any]] = []
    usage = Usage()
    finish: str | None = None
    error: StreamError | None = None
    for event in events:
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCallDelta):
            call = calls.setdefault(event.index, {"call_id": None, "name": "", "arguments": []})
            call["call_id"] = call["call_id"] or event.call_id
            call["name"] += event.name or ""
            call["arguments"].append(event.arguments)
        elif isinstance(event, ItemEvent):
            structured.append(dict(event.item))
        elif isinstance(event, Usage):
            usage = Usage(
                usage.tokens_in + event.tokens_in,
                usage.tokens_out + event.tokens_out,
                usage.cost_usd + event.cost_usd,
                usage.cached_tokens_in + event.cached_tokens_in,
            )
        elif isinstance(event, Finish):
            finish = event.reason
            break
        elif isinstance(event, StreamError):
            error = event
            break
    items: list[dict[str, Any]] = []
    if text:
        items.append({"type": "text", "text": "".join(text)})
    for index in sorted(calls):
        call = calls[index]
        raw = "".join(call["arguments"])
        # A version the model wrote into the name (``deploy.service@v1``) is
        # the item's version: the name is the tool's, as in the operations.
        # A name with more than one ``@`` is kept whole: no tool has it.
        name, version = (split_tool_name(call["name"], None) if call["name"] and call["name"].count("@") == 1
                         else (call["name"], None))
        item: dict[str, Any] = {"type": "tool_call", "call_id": call["call_id"] or f"call_{index}",
                                "name": name, "version": version}
        parsed = _parse_object(raw)
        if parsed is None:
            item["raw_arguments"] = raw
        else:
            item["arguments"] = parsed
        items.append(item)
    items.extend(structured)
    items = _clean(items)
    if error is not None:
        reason = "incomplete" if error.incomplete else "error"
    else:
        reason = finish or "incomplete"
    return Collected(items, reason, usage, error)


def _parse_object(raw: str) -> dict[str, Any] | None:
    """The arguments as a JSON object, or None (they are kept as
    ``raw_arguments`` then, for a repair) when they are not one a journal can
    keep: not JSON or not an object; ``NaN`` or ``Infinity``, which Python's
    reader takes; a number too large for a double (``1e400``, read as
    infinity); a key given twice in one object (readers disagree on which
    value counts); nesting too deep to walk."""
    try:
        value = strict_loads(raw, _unique_clean) if raw.strip() else {}
        if not isinstance(value, dict):
            return None
        canonical_json(_clean(value))  # its strings are made storable with the rest of the candidate
    except (ValueError, RecursionError):  # CanonicalJSONError is a ValueError
        return None
    return value


def _unique_clean(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys stay distinct once made storable (a NUL or a
    lone surrogate becomes U+FFFD: ``k\\u0000`` and ``k\\ud800`` would be
    one key), else ValueError."""
    return unique_keys([(_clean(key), value) for key, value in pairs])


class ScriptedModel:
    """Plays a scenario's entries: the N-th model attempt of a run gets entry N.

    Indexing by the run's attempt count (from the journal) rather than by an
    in-memory cursor makes the script survive a crash: a resumed run asks
    for the same entry again.
    """

    route = "scripted"

    def __init__(self, entries: Sequence[ModelEntry]) -> None:
        self.entries = list(entries)

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        if request.attempt_index >= len(self.entries):
            raise ScriptExhausted(
                f"the script has {len(self.entries)} entries; attempt {request.attempt_index + 1} needs one more"
            )
        return _play(self.entries[request.attempt_index], request)


def _given_usage(entry: ModelEntry) -> Iterator[StreamEvent]:
    """A broken attempt's usage, when its entry states one: providers may
    report usage before a stream breaks (Anthropic's input tokens come with
    its first event), and what was spent counts against the budgets. An
    entry that states none reports none, as a cut stream does not."""
    given = entry.usage
    if given is not None:
        yield Usage(given.tokens_in or 0, given.tokens_out or 0, float(given.cost_usd or 0.0))


def _play(entry: ModelEntry, request: ModelRequest) -> Iterator[StreamEvent]:
    if entry.error:
        yield from _given_usage(entry)
        yield StreamError(entry.error)
        return
    words = 0
    for text in (entry.text, entry.final):
        if text:
            yield TextDelta(text)
            words += len(text.split())
    for index, call in enumerate(entry.tool_calls):
        raw = entry.raw_arguments if entry.raw_arguments is not None else call.raw_arguments
        if raw is None:
            raw = json.dumps(call.arguments or {}, sort_keys=True)
        call_id = call.id or f"call_{request.step}_{request.attempt}_{index + 1}"
        if entry.stream == "truncated":
            # The stream breaks in the middle of the arguments: no finish ever comes.
            yield ToolCallDelta(index, call_id, call.name, raw[: max(1, len(raw) // 2)])
            yield from _given_usage(entry)
            return
        # Arguments arrive in pieces, as providers send them.
        yield ToolCallDelta(index, call_id, call.name, "")
        for start in range(0, len(raw), 16):
            yield ToolCallDelta(index, None, None, raw[start : start + 16])
        words += len(raw) // 4
    if entry.stream == "truncated":
        yield from _given_usage(entry)
        return
    for claim in entry.claims:
        yield ItemEvent({"type": "claim", "text": claim.text, "evidence": list(claim.evidence)})
    if entry.plan is not None:
        yield ItemEvent({"type": "plan", "steps": list(entry.plan)})
    given = entry.usage or _NO_USAGE  # what the entry does not say is made up, plausibly
    yield Usage(
        100 + 10 * request.step if given.tokens_in is None else given.tokens_in,
        max(words, 1) if given.tokens_out is None else given.tokens_out,
        0.0 if given.cost_usd is None else float(given.cost_usd),
    )
    yield Finish(entry.finish_reason or ("tool_calls" if entry.tool_calls else "stop"))
