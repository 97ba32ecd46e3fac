"""Translating a vendor SDK's exceptions into the engine's model errors.

Each adapter declares a table from the SDK's exception class names to a
:class:`Rule`; :func:`translate` finds the nearest class of an exception's
MRO in the table, so a subclass a newer SDK adds (``OverloadedError`` under
``InternalServerError``) is mapped by what it is. Names an older SDK lacks
are skipped. A rule without an error class (the SDK's generic status or
stream error) decides by the HTTP status, then by the error ``type`` in the
body, which is all a mid-stream ``error`` event carries.

Both SDKs speak HTTP through httpx (or its successor, httpx2); a transport
error that escapes the SDK unwrapped (Anthropic's stream iterator lets them
through) is classified by its class names.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

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
from ._model import ModelRequest, StreamError, ToolCallDelta

#: A provider's retry-after longer than this is not believed; the deadline
#: still bounds the wait.
MAX_RETRY_AFTER_S = 600.0


@dataclass(frozen=True)
class Rule:
    #: None: decide by status and body type (the SDK's generic errors).
    error: type[ModelError] | None
    code: str | None = None
    retryable: bool | None = None


BY_STATUS = Rule(None)

#: Error ``type`` (or ``code``) values in provider error bodies.
BODY_TYPES: dict[str, Rule] = {
    # Anthropic
    "rate_limit_error": Rule(ModelRateLimited),
    "overloaded_error": Rule(ModelServerError, "overloaded"),
    "api_error": Rule(ModelServerError),
    "timeout_error": Rule(ModelTimeout),
    "authentication_error": Rule(ModelAuthError),
    "permission_error": Rule(ModelAuthError, "permission_denied"),
    "billing_error": Rule(ModelAuthError, "billing"),
    "invalid_request_error": Rule(ModelBadRequest),
    "not_found_error": Rule(ModelBadRequest, "not_found"),
    "request_too_large": Rule(ModelBadRequest, "request_too_large"),
    # OpenAI and compatible servers
    "rate_limit_exceeded": Rule(ModelRateLimited),
    "insufficient_quota": Rule(ModelRateLimited, "quota_exhausted", retryable=False),
    "server_error": Rule(ModelServerError),
    "context_length_exceeded": Rule(ModelBadRequest, "context_length_exceeded"),
    "invalid_api_key": Rule(ModelAuthError),
}

#: Body types that decide over the exception's class, which an SDK picks by
#: the HTTP status alone: a 429 saying ``insufficient_quota`` is an account
#: out of credit, which no wait lifts.
BODY_OVER_CLASS = frozenset({"insufficient_quota"})

#: ``error.details.error_code`` values that decide over the class too: an
#: Anthropic spend limit, which no wait within a run lifts (an SDK without
#: a class for it raises a plain rate-limit error).
SPEND_LIMIT = Rule(ModelRateLimited, "spend_limit", retryable=False)
DETAIL_CODES: dict[str, Rule] = {code: SPEND_LIMIT for code in (
    "contract_spend_limit_reached", "enforced_spend_limit_reached", "linked_organization_spend_limit_reached")}


def resolve_table(module: ModuleType, rules: Mapping[str, Rule]) -> dict[type, Rule]:
    table: dict[type, Rule] = {}
    for name, rule in rules.items():
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            table[cls] = rule
    return table


def nearest_rule(exc_type: type, table: Mapping[type, Rule]) -> tuple[type, Rule] | None:
    for cls in exc_type.__mro__:
        if cls in table:
            return cls, table[cls]
    return None


def by_status(status: int | None) -> Rule | None:
    if status is None or status < 400:
        return None
    if status == 408:
        return Rule(ModelTimeout)
    if status == 409:
        return Rule(ModelServerError, "conflict")  # a lock held elsewhere: worth another try
    if status == 429:
        return Rule(ModelRateLimited)
    if status in (401, 403):
        return Rule(ModelAuthError)
    if status == 501:
        return Rule(ModelBadRequest, "not_implemented")
    if status >= 500:
        return Rule(ModelServerError)
    return Rule(ModelBadRequest)


def body_type(body: Any) -> str | None:
    """``error.type`` (or ``error.code``) of an error body, wherever the
    SDK put it: the whole body, or only its ``error`` member."""
    if not isinstance(body, Mapping):
        return None
    error = body.get("error", body)
    if not isinstance(error, Mapping):
        return None
    for key in ("type", "code"):
        value = error.get(key)
        if isinstance(value, str) and value in BODY_TYPES:
            return value
    value = error.get("type")
    return value if isinstance(value, str) else None


def _detail_code(body: Any) -> str | None:
    """``error.details.error_code`` of an error body, if it has one."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    details = error.get("details") if isinstance(error, Mapping) else None
    code = details.get("error_code") if isinstance(details, Mapping) else None
    return code if isinstance(code, str) else None


def retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return min(max(float(ms) / 1000, 0.0), MAX_RETRY_AFTER_S)
        value = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(when.timestamp() - time.time(), 0.0), MAX_RETRY_AFTER_S)


def transport_rule(exc: BaseException) -> Rule | None:
    """httpx/httpx2 errors, by class name (the SDK's httpx flavour is not ours to import)."""
    names = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.split(".")[0].startswith("httpx")}
    if not names:
        return None
    if "TimeoutException" in names:
        return Rule(ModelTimeout)
    return Rule(ModelConnectionError)


def translate(exc: BaseException, *, provider: str, table: Mapping[type, Rule]) -> ModelError:
    """The engine's error for a vendor exception (to be raised ``from exc``)."""
    if isinstance(exc, ModelError):
        return exc
    found = nearest_rule(type(exc), table)
    rule = found[1] if found else transport_rule(exc)
    if isinstance(exc, json.JSONDecodeError):
        # An event whose data is not JSON: the SDKs let the decoder's error through.
        rule = Rule(ModelResponseError)
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    body = getattr(exc, "body", None)
    kind = body_type(body)
    if kind in BODY_OVER_CLASS:
        rule = BODY_TYPES[kind]
    detail = DETAIL_CODES.get(_detail_code(body) or "")
    if detail is not None:
        rule = detail
    if rule is not None and rule.error is None:
        rule = by_status(status) or BODY_TYPES.get(kind or "") or Rule(ModelServerError, "stream_error")
    if rule is None:
        # Not a vendor error this adapter knows: reported, never retried blindly.
        rule = Rule(ModelError, "unexpected", retryable=False)
    assert rule.error is not None
    response = getattr(exc, "response", None)
    wait = retry_after(getattr(response, "headers", None)) if response is not None else None
    return rule.error(_describe(exc), provider=provider, code=rule.code,
                      retryable=rule.retryable, retry_after_s=wait, status=status)


def _describe(exc: BaseException) -> str:
    try:
        text = str(getattr(exc, "message", None) or exc)
    except Exception:  # noqa: BLE001 - a vendor __str__ that needs attributes it never got
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def stream_error(error: ModelError, *, began: bool, secret: str = "") -> StreamError:
    """The stream event for an error. A connection that broke or timed out
    after the stream began makes the attempt ``incomplete``. ``secret``:
    the API key, written out of the message (a proxy or a compatible server
    may echo the key it refused, and the message is recorded)."""
    broken = began and isinstance(error, (ModelConnectionError, ModelTimeout))
    return StreamError(redact(str(error), secret), error.code, error.retryable, error.retry_after_s,
                       incomplete=broken)


#: Shorter keys are not written out: a copy of a short string may be part of any word.
SECRET_MIN_CHARS = 8
#: What a server of one's own gets as the key when none is set (the SDKs
#: refuse an empty one; engine/_routes.py): no secret, never written out.
PLACEHOLDER_KEY = "not-needed"


def redact(text: str, secret: str) -> str:
    """``text`` with every copy of ``secret`` replaced by ``[API key]``."""
    if len(secret) < SECRET_MIN_CHARS or secret == PLACEHOLDER_KEY:
        return text
    return text.replace(secret, "[API key]")



class CallAssembler:
    """Tool-call pieces of one stream, keyed the engine's way.

    Names are yielded once, when the stream ends (:meth:`names`): a name can
    arrive in pieces, and only the whole provider name maps back to the
    registry's. A piece that carries a new id under an index already in use
    starts a new call: some OpenAI-compatible servers send every parallel
    call at index 0.
    """

    def __init__(self, to_registry: Any) -> None:
        self._to_registry = to_registry
        self._index: dict[Any, int] = {}
        self._ids: dict[int, str] = {}
        self._names: dict[int, list[str]] = {}

    def piece(self, key: Any, call_id: str | None, name: str | None, arguments: str | None) -> ToolCallDelta:
        index = self._index.get(key)
        if index is None or (call_id and self._ids.get(index) not in (None, call_id)):
            index = len(self._names)
            self._index[key] = index
            self._names[index] = []
        if call_id and index not in self._ids:
            self._ids[index] = call_id
        if name:
            self._names[index].append(name)
        return ToolCallDelta(index, call_id or None, None, arguments or "")

    def names(self) -> list[ToolCallDelta]:
        return [ToolCallDelta(index, None, self._to_registry("".join(parts)), "")
                for index, parts in self._names.items() if parts]


def call_timeout(request: ModelRequest, default_s: float) -> float:
    """The client timeout, shortened to what is left of the run's deadline
    when the attempt begins (never below one second, so a nearly spent
    deadline still gets an answer or a clean timeout). A request made
    without that figure falls back on the context's budget, frozen when the
    step began."""
    left = request.time_left_s
    if left is None:
        left = (request.context.get("budget") or {}).get("deadline_s")
    if isinstance(left, (int, float)):
        return max(min(default_s, float(left)), 1.0)
    return default_s
