"""The model catalogue: what each model costs and accepts, as data (the rows are in `models.py`).

One home for prices and request rules. A `ModelInfo` row says, for one model id and its aliases
(dated ids, fal/OpenRouter slugs): its lifecycle, its prices per million tokens, which `thinking`
types it accepts, whether it takes a forced `tool_choice` and `temperature`, its minimum cacheable
prompt, maximum output and context window; `sources` names where each value comes from. The
providers shape every request from the row (`anthropic/params.py`), the simulator enforces the same
rows (`toolloop.sim.rules`), and `cost` is priced from them.

A `Catalog` is immutable. Callers extend or override it without touching any module state:

    mine = ModelInfo(id="claude-next", price=ModelPrice(3, 15, 0.3, 3.75, 6))
    prompt_gen = from_env(catalog=default_catalog().with_models(mine))  # or AnthropicHandler(catalog=)

Lookup (`find`) accepts the id, any alias, a dated id (`claude-haiku-4-5-20251001`), and a fal slug
with dots or hyphens (`anthropic/claude-opus-5.5`, `anthropic/claude-opus-5-5`).

A price may have a long-context tier (`ModelPrice.above`): a request whose prompt (uncached input,
cache reads and cache writes) is over `above.tokens` is priced whole at the tier's rates, output
included (Haiku 5.5 above 100,000 tokens). `token_cost` picks the tier; `price.at(tokens)` is the
row a prompt of that size pays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from toolloop.errors import PromptGenError

Status = Literal["current", "legacy", "deprecated", "retired"]
"""current: the model pages' latest; legacy: still served, a newer model of its family is current
(the pages say "Legacy"); deprecated: served until its end of life (`status_date`); retired: 404."""
ThinkingType = Literal["adaptive", "enabled", "disabled"]

SourceKind = Literal["read", "derived", "unconfirmed", "unknown", "operator"]
READ: Literal["read"] = "read"
OPERATOR: Literal["operator"] = "operator"
DERIVED: Literal["derived"] = "derived"
UNCONFIRMED: Literal["unconfirmed"] = "unconfirmed"
UNKNOWN: Literal["unknown"] = "unknown"


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens: uncached input, output, cache read, 5-minute cache write, and
    1-hour cache write (None: not priced separately, then twice the input price, Anthropic's rule).
    `above`: the long-context tier, the rates of a request whose prompt is over its `tokens`."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float | None = None
    above: PriceTier | None = None

    @property
    def write_1h(self) -> float:
        return (
            self.cache_write_1h if self.cache_write_1h is not None else self.input * 2
        )

    def at(self, prompt_tokens: int) -> ModelPrice:
        """The rates a request with this many prompt tokens (input, cache reads and writes) pays."""
        if self.above is not None and prompt_tokens > self.above.tokens:
            return self.above.price
        return self


@dataclass(frozen=True)
class PriceTier:
    """A long-context tier: a prompt of more than `tokens` pays `price` for the whole request."""

    tokens: int
    price: ModelPrice


@dataclass(frozen=True)
class Source:
    """Where one value of a row comes from: `kind` read (a source states it), derived (a rule such
    as 1.25x / 2x input), unconfirmed (a third-party tracker only) or unknown; `name` the source."""

    kind: SourceKind
    name: str


@dataclass(frozen=True)
class ModelInfo:
    """One model. `thinking` lists the `thinking.type` values the API accepts for it (empty: send no
    `thinking` at all); "disabled" missing means thinking is always on. Effort (`output_config`) is
    sent only with adaptive thinking. `max_output_tokens` / `context_window` None: not known."""

    id: str
    price: ModelPrice | None = None
    aliases: tuple[str, ...] = ()
    vendor: str = "anthropic"
    status: Status = "current"
    status_date: str | None = None
    """ISO date: end of life of a deprecated model, the retirement of a retired one."""
    replacement: str | None = None
    thinking: frozenset[ThinkingType] = frozenset({"adaptive", "disabled"})
    forced_tool_choice: bool = True
    temperature: bool = True
    min_cache_tokens: int | None = None
    max_output_tokens: int | None = None
    context_window: int | None = None
    fal_slug: str | None = None
    """The id fal's router (OpenRouter) serves it under; None: not served there."""
    on_demand_compaction: bool = False
    """Anthropic's on-demand compaction (the top-level `compaction: {"type": "summarize"}`, beta
    `compact-2026-09-04`): the Models API's `capabilities.compaction.summarize.supported`. A
    context policy's compaction step asks for it on such a model and makes the client-side summary
    call elsewhere (docs/context.md). False where no source says so (the conservative choice)."""
    sources: Mapping[str, Source] = field(default_factory=dict)
    """Field name -> its source; a field not listed was given by the caller."""

    @property
    def always_thinks(self) -> bool:
        return "disabled" not in self.thinking and bool(self.thinking)

    def supports(self, feature: str) -> bool:
        """Whether the model has `feature`: "on_demand_compaction" (the one feature asked so far)."""
        return feature == "on_demand_compaction" and self.on_demand_compaction

    def source(self, name: str) -> Source:
        return self.sources.get(name, Source(READ, "given by the caller"))


_DATED = re.compile(r"-(\d{8}|latest)$")


def _keys(model: str) -> list[str]:
    """The lookup keys of an id: as given, undated, without `anthropic/`, with dots as hyphens."""
    found = [model, _DATED.sub("", model)]
    for key in list(found):
        bare = key.removeprefix("anthropic/")
        found += [bare, bare.replace(".", "-")]
    return list(dict.fromkeys(found))


class Catalog:
    """Models by id and alias. Immutable: `with_models` / `with_prices` return a new catalogue."""

    def __init__(self, models: Iterable[ModelInfo]) -> None:
        self._models: dict[str, ModelInfo] = {}
        self._index: dict[str, str] = {}
        for info in models:
            self._add(info)

    def _add(self, info: ModelInfo) -> None:
        old = self._models.get(info.id)
        if old is not None:
            for key, target in list(self._index.items()):
                if target == old.id:
                    del self._index[key]
        self._models[info.id] = info
        names = [info.id, *info.aliases, *([info.fal_slug] if info.fal_slug else [])]
        for name in names:
            for key in _keys(name):
                self._index[key] = info.id

    def __iter__(self) -> Iterator[ModelInfo]:
        return iter(list(self._models.values()))

    def __len__(self) -> int:
        return len(self._models)

    def __repr__(self) -> str:
        return f"Catalog({len(self._models)} models)"

    def models(self) -> list[ModelInfo]:
        return list(self._models.values())

    def find(self, model: str) -> ModelInfo | None:
        """The row of `model` (id, alias, dated id or fal slug), or None."""
        for key in _keys(model):
            target = self._index.get(key)
            if target is not None:
                return self._models[target]
        return None

    def with_models(self, *models: ModelInfo) -> Catalog:
        """A catalogue with these rows added; a row with a known id replaces that row whole."""
        out = Catalog(self._models.values())
        for info in models:
            out._add(info)
        return out

    def with_prices(self, prices: Mapping[str, ModelPrice]) -> Catalog:
        """A catalogue where each named model has this price; an unknown name becomes a row of its
        own (sent as is, accepting what the newest models accept)."""
        rows = []
        for name, price in prices.items():
            known = self.find(name)
            if known is not None and known.status != "retired":
                rows.append(replace(known, price=price))
            else:
                vendor = name.split("/", 1)[0] if "/" in name else "anthropic"
                rows.append(ModelInfo(id=name, price=price, vendor=vendor))
        return self.with_models(*rows)

    def price(self, model: str) -> ModelPrice | None:
        info = self.find(model)
        return info.price if info is not None else None

    def require(self, provider: str, model: str) -> ModelInfo:
        """The row a request may be sent with: a retired model, an unknown one and one without a
        price are a `PromptGenError` raised before any call."""
        info = self.find(model)
        if info is None:
            raise PromptGenError(
                f"{provider}: model {model!r} is not in the model catalogue, so it has no price and no "
                "request rules.\n"
                f"  Pick a current model (docs/providers.md), or add it: pass "
                f"catalog=default_catalog().with_models(ModelInfo(id={model!r}, price=ModelPrice(...))) "
                f"or prices={{{model!r}: ModelPrice(...)}} to the handler or from_env."
            )
        if info.status == "retired":
            when = f" on {info.status_date}" if info.status_date else ""
            instead = (
                f"use {info.replacement!r}"
                if info.replacement
                else "use a current model"
            )
            raise PromptGenError(
                f"{provider}: model {model!r} was retired{when}; the API answers 404 for it.\n"
                f"  Change the model: {instead} (docs/providers.md lists the current ones)."
            )
        if info.price is None:
            raise PromptGenError(
                f"{provider}: model {model!r} has no price in the model catalogue.\n"
                f"  Pass prices={{{model!r}: ModelPrice(...)}} to the handler or from_env, or pick a "
                "priced model."
            )
        return info


def token_cost(
    price: ModelPrice,
    *,
    input: int,
    output: int,
    cache_read: int = 0,
    cache_write: int = 0,
    cache_write_1h: int = 0,
) -> float:
    """USD for uncached `input`, `output`, `cache_read`, 5-minute `cache_write` and `cache_write_1h`
    tokens, each at its own rate; a prompt over the price's long-context threshold at the tier's."""
    price = price.at(input + cache_read + cache_write + cache_write_1h)
    total = (
        input * price.input
        + output * price.output
        + cache_read * price.cache_read
        + cache_write * price.cache_write
        + cache_write_1h * price.write_1h
    )
    return round(total / 1_000_000, 10)
