"""``anthropic:MODEL``: the Messages API, streamed, through the official
``anthropic`` SDK (the ``[anthropic]`` extra); ``ANTHROPIC_BASE_URL`` points
it elsewhere.

The SDK's own retries are off (``max_retries=0``): the engine owns retries.
The SDK's timeout bounds each read; ``within`` bounds the whole call.
A stream is trusted only when ``message_stop`` arrived after a
``message_delta`` with a ``stop_reason``: a stream that ends before it is an
incomplete attempt. Stop reasons: ``end_turn`` and ``stop_sequence`` ->
``stop``; ``tool_use`` -> ``tool_calls``; ``max_tokens`` and
``model_context_window_exceeded`` -> ``length``; ``refusal`` ->
``content_filter``; ``pause_turn`` (a server-side tool paused the turn) ->
no finish, so the engine asks again; anything else fails the attempt
(``unknown_finish``). An ``error`` event inside the stream is translated
like an HTTP error of the same ``type`` (``overloaded_error`` is a
retryable server error).

Usage: ``input_tokens`` of ``message_start`` excludes the cache, so
``tokens_in`` adds ``cache_read_input_tokens`` (also reported as
``cached_tokens_in``) and ``cache_creation_input_tokens``;
``output_tokens`` is cumulative, the last ``message_delta`` has the total.
"""

from __future__ import annotations

import json
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
from ._vendor import (BY_STATUS, SPEND_LIMIT, CallAssembler, Rule, call_timeout, resolve_table, stream_error,
                      translate)

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
    "pause_turn": None,
}

#: Every exception class the SDK exports, by name; subclasses a newer SDK
#: adds are mapped through their nearest listed base.
ERROR_RULES: dict[str, Rule] = {
    "AnthropicError": Rule(ModelError, "provider_error", retryable=False),
    "APIError": BY_STATUS,
    "APIStatusError": BY_STATUS,  # also an ``error`` event inside a 200 stream
    "APIConnectionError": Rule(ModelConnectionError),
    "APITimeoutError": Rule(ModelTimeout),
    "APIResponseValidationError": Rule(ModelResponseError),
    "APIWebhookValidationError": Rule(ModelBadRequest, "webhook_validation"),
    "BadRequestError": Rule(ModelBadRequest),
    "NotFoundError": Rule(ModelBadRequest, "not_found"),
    "UnprocessableEntityError": Rule(ModelBadRequest),
    "ContentTooLargeError": Rule(ModelBadRequest, "request_too_large"),
    "RequestTooLargeError": Rule(ModelBadRequest, "request_too_large"),
    "RequestHeaderFieldsTooLargeError": Rule(ModelBadRequest, "request_too_large"),
    "PreconditionFailedError": Rule(ModelBadRequest, "precondition_failed"),
    "AuthenticationError": Rule(ModelAuthError),
    "PermissionDeniedError": Rule(ModelAuthError, "permission_denied"),
    "PaymentRequiredError": Rule(ModelAuthError, "billing"),
    "CredentialsError": Rule(ModelAuthError, "credentials"),
    "WorkloadIdentityError": Rule(ModelAuthError, "credentials"),
    "RateLimitError": Rule(ModelRateLimited),
    # Spend limits do not lift within a run's deadline: waiting cannot help
    # (the body's error code says so too, for an SDK without these classes).
    "ContractSpendLimitReachedError": SPEND_LIMIT,
    "EnforcedSpendLimitReachedError": SPEND_LIMIT,
    "LinkedOrganizationSpendLimitReachedError": SPEND_LIMIT,
    "RequestTimeoutError": Rule(ModelTimeout),
    "DeadlineExceededError": Rule(ModelTimeout),
    "GatewayTimeoutError": Rule(ModelTimeout),
    "ClientClosedRequestError": Rule(ModelConnectionError),
    "ConflictError": Rule(ModelServerError, "conflict"),
    "InternalServerError": Rule(ModelServerError),
    "ServiceUnavailableError": Rule(ModelServerError, "unavailable"),
    "OverloadedError": Rule(ModelServerError, "overloaded"),
    "HTTPNotImplementedError": Rule(ModelBadRequest, "not_implemented"),
    # The SDK's marker for "retry me" from middleware; the engine retries instead.
    "RetryableError": Rule(ModelServerError, "retryable"),
}


@lru_cache(maxsize=1)
def error_table() -> dict[type, Rule]:
    import anthropic

    table = resolve_table(anthropic, ERROR_RULES)
    try:  # not re-exported at the top level by every version
        from anthropic.lib.credentials import _workload
    except ImportError:
        return table
    table.update(resolve_table(_workload, {"WorkloadIdentityError": ERROR_RULES["WorkloadIdentityError"]}))
    return table


def translate_error(exc: BaseException) -> ModelError:
    return translate(exc, provider="anthropic", table=error_table())


class AnthropicModel:
    def __init__(self, model: str, *, api_key: str, base_url: str | None, timeout_s: float,
                 max_output_tokens: int) -> None:
        import anthropic

        self.model = model
        self.route = f"anthropic:{model}"
        self.timeout_s = timeout_s
        self._api_key = api_key
        self.max_output_tokens = max_output_tokens
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s)

    def request_body(self, request: ModelRequest) -> tuple[dict[str, Any], ToolNames]:
        tools, names = offered_tools(request.context)
        system, messages = to_messages(turns(request.messages()), names)
        # What is left of the run's tokens now (a retry in the step has had
        # its earlier attempts counted), else the step's frozen figure.
        budget = request.tokens_left
        if budget is None:
            budget = (request.context.get("budget") or {}).get("tokens")
        limit = self.max_output_tokens
        if isinstance(budget, (int, float)) and budget > 0:
            limit = max(min(limit, int(budget)), 1)
        body: dict[str, Any] = {"model": self.model, "max_tokens": limit, "messages": messages, "stream": True}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.schema}
                             for t in tools]
        return body, names

    def stream(self, request: ModelRequest) -> Iterator[StreamEvent]:
        body, names = self.request_body(request)
        calls = CallAssembler(names.registry)
        began = False
        stop_reason: str | None = None
        stopped = False
        usage: dict[str, int] = {}
        # Tool inputs sent whole in content_block_start (no input_json_delta follows).
        whole_inputs: dict[int, Any] = {}
        said: list[str] = []  # the answer's text, for the claims it states
        timeout = call_timeout(request, self.timeout_s)

        def open_stream() -> Any:
            nonlocal began
            events = self.client.messages.create(**body, timeout=timeout)
            began = True
            return events

        try:
            for event in within(timeout, open_stream, provider="anthropic"):
                kind = getattr(event, "type", None)
                if kind == "message_start":
                    _add_usage(usage, getattr(event.message, "usage", None))
                elif kind == "content_block_start":
                    block = event.content_block
                    if block.type == "text" and getattr(block, "text", ""):
                        said.append(block.text)
                        yield TextDelta(block.text)
                    elif block.type == "tool_use":
                        yield calls.piece(event.index, block.id, block.name, "")
                        if getattr(block, "input", None):
                            whole_inputs[event.index] = block.input
                elif kind == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        said.append(delta.text)
                        yield TextDelta(delta.text)
                    elif delta.type == "input_json_delta":
                        whole_inputs.pop(event.index, None)
                        yield calls.piece(event.index, None, None, delta.partial_json)
                    # thinking and signature deltas are not part of the candidate
                elif kind == "content_block_stop":
                    if event.index in whole_inputs:
                        yield calls.piece(event.index, None, None, json.dumps(whole_inputs.pop(event.index)))
                elif kind == "message_delta":
                    stop_reason = getattr(event.delta, "stop_reason", None) or stop_reason
                    _add_usage(usage, getattr(event, "usage", None))
                elif kind == "message_stop":
                    stopped = True
        except Exception as exc:  # noqa: BLE001 - every vendor error becomes a typed one here
            yield from calls.names()
            if usage:
                yield self._usage(usage)
            yield stream_error(translate_error(exc), began=began, secret=self._api_key)
            return
        yield from calls.names()
        if usage:
            yield self._usage(usage)
        if not stopped or stop_reason is None:
            return  # cut before message_stop: incomplete
        if stop_reason not in STOP_REASONS:
            yield StreamError(f"unknown stop_reason {stop_reason!r}", "unknown_finish", retryable=False)
            return
        mapped = STOP_REASONS[stop_reason]
        if mapped == "stop":
            for claim in claims_in("".join(said)):
                yield ItemEvent(claim)
        if mapped is not None:
            yield Finish(mapped)

    def _usage(self, usage: dict[str, int]) -> Usage:
        fresh = usage.get("input_tokens", 0)
        cached = usage.get("cache_read_input_tokens", 0)
        written = usage.get("cache_creation_input_tokens", 0)
        tokens_in = fresh + cached + written
        tokens_out = usage.get("output_tokens", 0)
        return Usage(tokens_in, tokens_out, cost_usd(self.model, tokens_in, tokens_out, cached, written), cached)


def _add_usage(into: dict[str, int], usage: Any) -> None:
    """Later values replace earlier ones: the provider reports running totals."""
    if usage is None:
        return
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            into[key] = value


def to_messages(conversation: list[Turn], names: ToolNames) -> tuple[str, list[dict[str, Any]]]:
    """Neutral turns as (system, messages): ``tool_use`` blocks in the
    assistant turn, their ``tool_result`` blocks (by ``tool_use_id``) first in
    the user turn after it; consecutive turns of one role merged, since the
    API requires user and assistant to alternate."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for turn in conversation:
        if turn.role == "system":
            system.append(turn.text)
        elif turn.role == "user":
            add("user", [{"type": "text", "text": turn.text or "(empty)"}])
        elif turn.role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": turn.call_id, "content": turn.text,
                          "is_error": turn.error}])
        elif turn.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if turn.text:
                blocks.append({"type": "text", "text": turn.text})
            for call in turn.calls:
                arguments = call.arguments if call.arguments is not None else {"raw_arguments": call.raw_arguments}
                blocks.append({"type": "tool_use", "id": call.call_id, "name": names.provider(call.name),
                               "input": arguments})
            add("assistant", blocks or [{"type": "text", "text": "(no output)"}])
    if not messages or messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": "(start)"}]})
    return "\n\n".join(system), messages
