"""What a model call cost, from its usage and a price table.

Prices are US dollars per million tokens, as the providers publish them
(docs/models.md lists them with the date they were checked). A model is
matched by the longest table key its name starts with, so dated snapshots
(``gpt-4.1-2025-04-14``, ``claude-sonnet-4-20250514``) take their family's
price. A model the table does not know costs 0 (a local server is free; an
unknown hosted model is better reported as 0 than guessed). The file named by
``LOOPLEDGER_PRICES`` (JSON: ``{"model-prefix": {"input": .., "cached_input":
.., "cache_write": .., "output": ..}}``) adds to or overrides the table; it is
read and checked whole when a real route is checked (``_routes``), before a
run is recorded, so a bad file never strands a run after a paid call.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
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


#: The fields of a price in a ``LOOPLEDGER_PRICES`` file; the others may be left out.
FIELDS = tuple(f.name for f in fields(Price))
REQUIRED = ("input", "output")
SHAPE = "{input, output, cached_input?, cache_write?}"


def price_table() -> dict[str, Price]:
    """The table, with the file named by ``LOOPLEDGER_PRICES`` applied.
    Raises :class:`BadInput` naming the file and the field that is wrong."""
    return _table(os.environ.get("LOOPLEDGER_PRICES") or None)


@lru_cache(maxsize=8)
def _table(path: str | None) -> dict[str, Price]:
    table = dict(PRICES)
    if not path:
        return table
    where = f"LOOPLEDGER_PRICES={path}"
    try:
        with open(path, encoding="utf-8") as f:
            extra = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadInput(where, f"expected a JSON object of model -> {SHAPE}: {exc}") from None
    if not isinstance(extra, dict):
        raise BadInput(where, f"expected a JSON object of model -> {SHAPE}, got {type(extra).__name__}")
    for model, given in extra.items():
        table[model] = _price(given, f"{where}: {model}")
    return table


def _price(given: object, where: str) -> Price:
    if not isinstance(given, dict):
        raise BadInput(where, f"expected an object {SHAPE}, got {type(given).__name__}")
    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise BadInput(f"{where}.{unknown[0]}", f"unknown field; expected {', '.join(FIELDS)}")
    for name in FIELDS:
        value = given.get(name)
        if value is None and name not in REQUIRED:
            continue  # as input
        number = type(value) is int or (type(value) is float and math.isfinite(value))  # not a bool
        if not number or value < 0:
            got = f"got {value!r}" if name in given else "it is missing"
            raise BadInput(f"{where}.{name}", f"expected a number >= 0 (US dollars per million tokens), {got}")
    return Price(**given)


def price_for(model: str) -> Price | None:
    table = price_table()
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
