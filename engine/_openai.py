"""``openai:MODEL``: the Chat Completions API, streamed, through the official
``openai`` SDK (the ``[openai]`` extra). Any OpenAI-compatible server
(vLLM, llama.cpp's server, Ollama) works through ``OPENAI_BASE_URL``.

The SDK's own retries are off (``max_retries=0``): every call is one
recorded attempt and the engine decides about the next one. The SDK's
timeout bounds each read; ``within`` bounds the whole call. Streams are
read with ``stream_options.include_usage``, so the last chunk (after the
one with ``finish_reason``) carries the usage; the finish is therefore
yielded only when the stream has ended.

Finish reasons: ``stop`` and ``tool_calls`` (``function_call`` from older
servers, whose one call comes in ``function_call`` deltas) as they are;
``length``; ``content_filter``, and a ``refusal`` delta makes the finish
``content_filter`` whatever the chunk says. A finish
this table does not know fails the attempt (``unknown_finish``) rather than
being taken for a success. A stop signal that contradicts the items is
passed on unchanged: the ``structure`` validator calls it a protocol error.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from ._conversation import ToolNames, Turn, claims_in, offered_tools, turns
from ._errors import (
    ModelAuthError,
    ModelBadRequest,
    ModelConnectionError,
    ModelError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
)
from ._model import Finish, ItemEvent, ModelRequest, StreamError, StreamEvent, TextDelta, Usage, within
from ._pricing import cost_usd
from ._vendor import BY_STATUS, CallAssembler, Rule, call_timeout, resolve_table, stream_error, translate

FINISH = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

#: Every exception class the SDK exports, by name (see tests/engine/test_model_openai.py).
ERROR_RULES: dict[str, Rule] = {
    "OpenAIError": Rule(ModelError, "provider_error", retryable=False),
    "APIError": BY_STATUS,  # an ``error`` object inside the stream: its type decides
    "APIStatusError": BY_STATUS,
    "APIConnectionError": Rule(ModelConnectionError),
    "APITimeoutError": Rule(ModelTimeout),
    "APIResponseValidationError": Rule(ModelResponseError),
    "BadRequestError": Rule(ModelBadRequest),
    "NotFoundError": Rule(ModelBadRequest, "not_found"),
    "UnprocessableEntityError": Rule(ModelBadRequest),
    "ConflictError": Rule(ModelServerError, "conflict"),
    "AuthenticationError": Rule(ModelAuthError),
    "PermissionDeniedError": Rule(ModelAuthError, "permission_denied"),
    "RateLimitError": Rule(ModelRateLimited),
    "InternalServerError": Rule(ModelServerError),
    # Raised by the SDK's parse helpers, which this adapter does not use.
    "LengthFinishReasonError": Rule(ModelResponseError, "length"),
    "ContentFilterFinishReasonError": Rule(ModelResponseError, "content_filter", retryable=False),
    # Realtime and webhook helpers: not used here, mapped so nothing escapes untyped.
    "WebSocketConnectionClosedError": Rule(ModelConnectionError),
    "WebSocketQueueFullError": Rule(ModelConnectionError),
    "InvalidWebhookSignatureError": Rule(ModelBadRequest, "webhook_signature"),
    # Workload identity: the token behind the credentials could not be had.
    "SubjectTokenProviderError": Rule(ModelAuthError, "credentials"),
}


@lru_cache(maxsize=1)
def error_table() -> dict[type, Rule]:
    import openai
    from openai import _exceptions  # some classes are not re-exported at the top level

    return {**resolve_table(_exceptions, ERROR_RULES), **resolve_table(openai, ERROR_RULES)}


def translate_error(exc: BaseException) -> ModelError:
    return translate(exc, provider="openai", table=error_table())


class OpenAIModel:
    """One client per route, shared by the runs (the SDK client is thread-safe)."""

    def __init__(self, model: str, *, api_key: str, base_url: str | None, timeout_s: float,
                 max_output_tokens: int | None = None) -> None:
        import openai

        self.model = model
        self.route = f"openai:{model}"
        self.timeout_s = timeout_s
        self._api_key = api_key
        self.max_output_tokens = max_output_tokens
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)

    def request_body(self, request: ModelRequest) -> tuple[dict[str, Any], ToolNames]:
        tools, names = offered_tools(request.context)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_messages(turns(request.messages()), names),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.schema}}
                for t in tools
            ]
        if self.max_output_tokens:
            body["max_completion_tokens"] = self.max_output_tokens
        return body, names

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        body, names = self.request_body(request)
        calls = CallAssembler(names.registry)
        began = False
        finish: str | None = None
        refusal = False
        usage: Any = None
        said: list[str] = []  # the answer's text, for the claims it states
        timeout = call_timeout(request, self.timeout_s)

        def open_stream() -> Any:
            nonlocal began
            chunks = self.client.chat.completions.create(**body, timeout=timeout)
            began = True
            return chunks

        chunks = 0
        try:
            for chunk in within(timeout, open_stream, provider="openai"):
                chunks += 1
                usage = getattr(chunk, "usage", None) or usage
                for choice in chunk.choices or ():
                    if choice.index != 0:  # n=1 is asked for; other choices are ignored
                        continue
                    delta = choice.delta
                    if delta is not None:
                        if delta.content:
                            said.append(delta.content)
                            yield TextDelta(delta.content)
                        if getattr(delta, "refusal", None):
                            refusal = True
                            yield TextDelta(delta.refusal)
                        for call in delta.tool_calls or ():
                            fn = call.function
                            yield calls.piece(call.index, call.id, fn.name if fn else None,
                                              fn.arguments if fn else None)
                        legacy = getattr(delta, "function_call", None)
                        if legacy is not None:
                            # An older server's one call (``function_call``
                            # deltas), its id made up when the candidate is formed.
                            yield calls.piece("function_call", None, legacy.name, legacy.arguments)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        except Exception as exc:  # noqa: BLE001 - every vendor error becomes a typed one here
            yield from calls.names()
            if usage is not None:
                yield self._usage(usage)
            yield stream_error(translate_error(exc), began=began, secret=self._api_key)
            return
        yield from calls.names()
        if usage is not None:
            yield self._usage(usage)
        if finish is None and chunks == 0:
            # An answer with no stream events at all: most often a compatible
            # server that ignores ``stream: true`` and sends one JSON body.
            yield StreamError("the server's answer held no stream events; does it stream (stream: true was asked)?",
                              "bad_response")
            return
        if finish is None:
            return  # the stream ended without a finish: an incomplete attempt
        if refusal:
            yield Finish("content_filter")
        elif finish in FINISH:
            if FINISH[finish] == "stop":
                for claim in claims_in("".join(said)):
                    yield ItemEvent(claim)
            yield Finish(FINISH[finish])
        else:
            yield StreamError(f"unknown finish_reason {finish!r}", "unknown_finish", retryable=False)

    def _usage(self, usage: Any) -> Usage:
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
        return Usage(tokens_in, tokens_out, cost_usd(self.model, tokens_in, tokens_out, cached), cached)


def to_messages(conversation: list[Turn], names: ToolNames) -> list[dict[str, Any]]:
    """Neutral turns as Chat Completions messages; tool results by ``tool_call_id``."""
    out: list[dict[str, Any]] = []
    for turn in conversation:
        if turn.role in ("system", "user"):
            out.append({"role": turn.role, "content": turn.text})
        elif turn.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
            if turn.calls:
                message["tool_calls"] = [
                    {"id": c.call_id, "type": "function",
                     "function": {"name": names.provider(c.name), "arguments": c.arguments_json()}}
                    for c in turn.calls
                ]
            elif not turn.text:
                message["content"] = ""
            out.append(message)
        elif turn.role == "tool":
            out.append({"role": "tool", "tool_call_id": turn.call_id, "content": turn.text})
    return out
