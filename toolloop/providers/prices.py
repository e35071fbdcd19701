"""Price tables (USD per million tokens) and the cost of one answer from its token counts.

Cache reads and cache writes have their own rates, never the normal input rate (SPEC 3.3):
Anthropic bills a 5-minute cache write at 1.25x the input price and a cache read at 0.1x. Other
families behind fal's router bill writes as normal input and reads at their published discount.
Figures are list prices; pass `prices={...}` to a handler to override or add a model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens: uncached input, output, cache read, cache write."""

    input: float
    output: float
    cache_read: float
    cache_write: float


def anthropic_price(input: float, output: float) -> ModelPrice:
    """Anthropic's rule: 5-minute cache write 1.25x input, cache read 0.1x input."""
    return ModelPrice(input, output, cache_read=input * 0.1, cache_write=input * 1.25)


def discounted_read(input: float, output: float, read_share: float) -> ModelPrice:
    """Families that bill cache writes as input and reads at `read_share` of the input price."""
    return ModelPrice(input, output, cache_read=input * read_share, cache_write=input)


ANTHROPIC_PRICES: Mapping[str, ModelPrice] = {
    "claude-opus-5-5": anthropic_price(4, 20),
    "claude-opus-5.5": anthropic_price(4, 20),
    "claude-sonnet-5": anthropic_price(2, 10),
    "claude-opus-4-8": anthropic_price(5, 25),
    "claude-opus-4-7": anthropic_price(5, 25),
    "claude-opus-4-6": anthropic_price(5, 25),
    "claude-sonnet-4-6": anthropic_price(3, 15),
    "claude-opus-4-5": anthropic_price(5, 25),
    "claude-opus-4-1": anthropic_price(15, 75),
    "claude-opus-4": anthropic_price(15, 75),
    "claude-sonnet-4-5": anthropic_price(3, 15),
    "claude-sonnet-4": anthropic_price(3, 15),
    "claude-3-7-sonnet": anthropic_price(3, 15),
    "claude-haiku-4-5": anthropic_price(1, 5),
    "claude-haiku-4.5": anthropic_price(1, 5),
    "claude-3-5-haiku": anthropic_price(0.8, 4),
}

FAL_PRICES: Mapping[str, ModelPrice] = {
    "anthropic/claude-opus-5.5": anthropic_price(4, 20),
    "anthropic/claude-sonnet-5": anthropic_price(2, 10),
    "anthropic/claude-haiku-4.5": anthropic_price(1, 5),
    "openai/gpt-6-sol": discounted_read(2, 10, 0.1),
    "openai/gpt-6-astra": discounted_read(10, 50, 0.1),
    "google/gemini-3.8-flash": discounted_read(0.75, 3.75, 0.25),
    "google/gemini-2.5-flash": discounted_read(0.3, 2.5, 0.25),
    "x-ai/grok-4.7": discounted_read(2, 6, 0.25),
}

OPENAI_PRICES: Mapping[str, ModelPrice] = {
    "gpt-5": discounted_read(1.25, 10, 0.1),
    "gpt-5-mini": discounted_read(0.25, 2, 0.1),
    "gpt-4.1": discounted_read(2, 8, 0.25),
    "gpt-4.1-mini": discounted_read(0.4, 1.6, 0.25),
    "gpt-4o": discounted_read(2.5, 10, 0.5),
    "gpt-4o-mini": discounted_read(0.15, 0.6, 0.5),
}

_DATED = re.compile(r"-(\d{8}|latest)$")


def find_price(table: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The row of `model`, also for a dated id (`claude-sonnet-4-5-20250929` -> `claude-sonnet-4-5`)."""
    return table.get(model) or table.get(_DATED.sub("", model))


def token_cost(
    price: ModelPrice, *, input: int, output: int, cache_read: int = 0, cache_write: int = 0
) -> float:
    """USD for uncached `input`, `output`, `cache_read` and `cache_write` tokens, each at its rate."""
    total = (
        input * price.input
        + output * price.output
        + cache_read * price.cache_read
        + cache_write * price.cache_write
    )
    return round(total / 1_000_000, 10)
