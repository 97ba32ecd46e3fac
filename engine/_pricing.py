"""What a model call cost, from its usage and a price table.

Prices are US dollars per million tokens, as the providers publish them
(docs/models.md lists them with the date they were checked). A model is
matched by the longest table key its name starts with, so dated snapshots
(``gpt-4.1-2025-04-14``, ``claude-sonnet-4-20250514``) take their family's
price. A model the table does not know costs 0 (a local server is free; an
unknown hosted model is better reported as 0 than guessed). The file named by
``LOOPLEDGER_PRICES`` (JSON: ``{"model-prefix": {"input": .., "cached_input":
.., "cache_write": .., "output": ..}}``) adds to or overrides the table.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

from ._errors import BadInput


@dataclass(frozen=True)
class Price:
    input: float  # per million input tokens not served from the cache
    output: float  # per million output tokens
    cached_input: float | None = None  # per million cache-hit input tokens (None: as input)
    cache_write: float | None = None  # per million tokens written to the cache (None: as input)


PRICES: dict[str, Price] = {
    # OpenAI, standard tier
    "gpt-5": Price(1.25, 10.00, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    # Anthropic (cache write: the 5-minute cache)
    "claude-opus-4-5": Price(5.00, 25.00, 0.50, 6.25),
    "claude-opus-4": Price(15.00, 75.00, 1.50, 18.75),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30, 3.75),
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30, 3.75),
    "claude-haiku-4-5": Price(1.00, 5.00, 0.10, 1.25),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08, 1.00),
}


@lru_cache(maxsize=8)
def _table(path: str | None) -> dict[str, Price]:
    table = dict(PRICES)
    if not path:
        return table
    try:
        with open(path, encoding="utf-8") as f:
            extra = json.load(f)
        for model, fields in extra.items():
            table[model] = Price(**fields)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise BadInput(f"LOOPLEDGER_PRICES={path}", f"expected a JSON object of model -> "
                       f"{{input, output, cached_input?, cache_write?}}: {exc}") from exc
    return table


def price_for(model: str) -> Price | None:
    table = _table(os.environ.get("LOOPLEDGER_PRICES"))
    matches = [key for key in table if model == key or model.startswith(key + "-")]
    return table[max(matches, key=len)] if matches else None


def cost_usd(model: str, tokens_in: int, tokens_out: int, cached_in: int = 0, cache_write: int = 0) -> float:
    """``tokens_in`` counts every input token, ``cached_in`` and
    ``cache_write`` included."""
    price = price_for(model)
    if price is None:
        return 0.0
    fresh = max(tokens_in - cached_in - cache_write, 0)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    write_rate = price.input if price.cache_write is None else price.cache_write
    total = fresh * price.input + cached_in * cached_rate + cache_write * write_rate + tokens_out * price.output
    return round(total / 1_000_000, 8)
