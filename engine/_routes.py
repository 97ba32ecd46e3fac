"""Model routes: which adapter a run's ``model_route`` names.

    scripted           the scenario's ``model:`` entries (the default)
    openai:MODEL       Chat Completions via the ``openai`` SDK; OPENAI_API_KEY,
                       OPENAI_BASE_URL (any OpenAI-compatible server)
    anthropic:MODEL    Messages via the ``anthropic`` SDK; ANTHROPIC_API_KEY,
                       ANTHROPIC_BASE_URL

With a real model a scenario's ``model:`` entries are ignored (CONTRACT).
A key is required when the base URL is the provider's own; a server of
one's own (``OPENAI_BASE_URL=http://127.0.0.1:8000/v1``) often needs none.
``LOOPLEDGER_MODEL_TIMEOUT_S`` (default 120) bounds one call, and
``LOOPLEDGER_MAX_OUTPUT_TOKENS`` one answer (unset: the provider's default;
Anthropic, which requires a value, gets 4096).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlparse

from ._errors import BadInput
from ._model import ModelAdapter
from ._pricing import price_table
from ._vendor import PLACEHOLDER_KEY


@dataclass(frozen=True)
class Provider:
    name: str
    sdk: str  # the module the extra installs
    key_env: str
    url_env: str
    domain: str  # hosts in it (api.openai.com, eu.api.openai.com) are the provider's: they need its key
    default_url: str  # the SDK's base URL when the variable is unset

    @property
    def default_host(self) -> str:
        return urlparse(self.default_url).hostname or ""


PROVIDERS = {
    "openai": Provider("openai", "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "openai.com",
                       "https://api.openai.com/v1"),
    "anthropic": Provider("anthropic", "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "anthropic.com",
                          "https://api.anthropic.com"),
}

ANTHROPIC_DEFAULT_MAX_TOKENS = 4096


def parse_route(route: str) -> tuple[str, str]:
    """``(provider, model)``; ``("scripted", "")`` for the scripted model."""
    if route == "scripted":
        return "scripted", ""
    provider, sep, model = route.partition(":")
    if not sep or provider not in PROVIDERS or not model.strip():
        raise BadInput("--model", f"unknown model route {route!r}; expected scripted, openai:MODEL "
                       "or anthropic:MODEL")
    if any(c.isspace() for c in model):
        # Sent as is, a space would name another model (or none) at the provider.
        raise BadInput("--model", f"model route {route!r}: a model name has no spaces; expected {provider}:MODEL")
    return provider, model


@dataclass(frozen=True)
class Settings:
    api_key: str
    base_url: str | None
    timeout_s: float
    #: None: the provider's default (Anthropic, which requires one, gets ANTHROPIC_DEFAULT_MAX_TOKENS).
    max_output_tokens: int | None


def settings_for(route: str) -> Settings:
    """Check that a real route can run here: its SDK installed, its key set,
    its settings and price file readable. Raises :class:`BadInput` naming
    what to install, which variable to set or what in it is wrong."""
    provider, _ = parse_route(route)
    if provider == "scripted":
        return Settings("", None, 0.0, None)
    p = PROVIDERS[provider]
    try:
        __import__(p.sdk)
    except ImportError:
        raise BadInput("--model", f"{route} needs the {p.sdk} SDK: pip install 'loopledger[{provider}]'") from None
    base_url = os.environ.get(p.url_env) or None
    host = _host(base_url, p) if base_url else p.default_host
    key = os.environ.get(p.key_env) or ""
    if key and not key.strip():
        raise BadInput(p.key_env, "is set but blank; expected the provider's API key (or leave it unset)")
    if not key:
        if host == p.domain or host.endswith("." + p.domain):
            raise BadInput("--model", f"{route} needs an API key: set {p.key_env} "
                           f"(or {p.url_env} for a server of your own)")
        key = PLACEHOLDER_KEY
    price_table()  # checked now: otherwise first read to price an answer already paid for
    return Settings(key, base_url, _env_float("LOOPLEDGER_MODEL_TIMEOUT_S", 120.0), _env_tokens())


def _host(base_url: str, p: Provider) -> str:
    """The host a base URL names, lower case, without a trailing dot; bad
    input unless it is an http(s) URL with a host: a URL the SDK cannot
    reach would only fail each attempt with "Connection error", naming
    nothing."""
    try:
        parsed = urlparse(base_url)
        parsed.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise BadInput(p.url_env, f"expected an http(s) URL such as {p.default_url}, "
                                  f"got {base_url!r} ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BadInput(p.url_env, f"expected an http(s) URL with a host, such as {p.default_url}, got {base_url!r}")
    return parsed.hostname.lower().rstrip(".")


#: More output tokens than any model answers with; a larger figure is a typo.
MAX_OUTPUT_TOKENS = 10_000_000


def _env_tokens() -> int | None:
    raw = os.environ.get("LOOPLEDGER_MAX_OUTPUT_TOKENS")
    if not raw:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise BadInput("LOOPLEDGER_MAX_OUTPUT_TOKENS",
                       f"expected a whole number of tokens from 1 to {MAX_OUTPUT_TOKENS:,}, got {raw!r}")
    return value


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(name, f"expected a positive number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise BadInput(name, f"expected a positive number, got {raw!r}")
    return value


def model_for(route: str, scripted: Callable[[], ModelAdapter]) -> ModelAdapter:
    """The adapter for a run's route; ``scripted`` builds the scripted model."""
    if route == "scripted":
        return scripted()
    return _adapter(route, settings_for(route))


@lru_cache(maxsize=16)
def _adapter(route: str, settings: Settings) -> ModelAdapter:
    # One client per route and settings: its connection pool is shared by
    # every run, and a changed key or URL gets a client of its own.
    provider, model = parse_route(route)
    if provider == "openai":
        from ._openai import OpenAIModel

        return OpenAIModel(model, api_key=settings.api_key, base_url=settings.base_url,
                           timeout_s=settings.timeout_s, max_output_tokens=settings.max_output_tokens)
    from ._anthropic import AnthropicModel

    return AnthropicModel(model, api_key=settings.api_key, base_url=settings.base_url,
                          timeout_s=settings.timeout_s,
                          max_output_tokens=settings.max_output_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS)
