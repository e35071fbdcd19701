"""The rows of the default model catalogue (`default_catalog()`), read 2026-12-01 and refreshed
2026-12-02 from Anthropic's model pages, pricing page and migration guides (the docs corpus).

Every value names its source in `sources` (docs/providers.md prints the table with them):
    read         a source states it (Anthropic's pricing and model pages, the anthropic SDK 2.14,
                 AWS Bedrock's adaptive-thinking page, fal's README price table)
    derived      a rule gave it: a cache write at 1.25x input (5 minutes) or 2x input (1 hour), an
                 OpenAI-family write at 1x or 1.25x, or "accepted" where no refusal is documented
    unconfirmed  a third-party tracker only; confirm before relying on it
    unknown      no source; the conservative choice is recorded (no forced tool_choice, no
                 temperature, no `thinking` parameter, no max_tokens cap)
Facts are from /work/shared/PROVIDERS.md "Today's Claude models" and the sources it names, and,
for the rows named below, from the first-party pages read 2026-12-02 (each value names its page).
An operator file (TOOLLOOP_MODELS, toolloop/providers/models_file.py) adds to or overrides these rows;
its values have the source kind "operator".
"""

from __future__ import annotations

from toolloop.providers.catalog import (
    DERIVED,
    OPERATOR,
    READ,
    UNCONFIRMED,
    UNKNOWN,
    Catalog,
    ModelInfo,
    ModelPrice,
    PriceTier,
    Source,
    Status,
    ThinkingType,
)

PRICING = "Anthropic pricing page (platform.claude.com, read 2026-12-01)"
MODEL_PAGES = "Anthropic model pages (platform.claude.com docs, read 2026-12-01)"
SDK_DEPRECATED = "anthropic SDK 2.14 _data/deprecated_models.py"
SDK_MODELS = "anthropic SDK 2.14 types/model_param.py"
BEDROCK = "AWS Bedrock adaptive-thinking page"
THIRD = "third-party trackers (PROVIDERS.md marks them 3rd)"
RULE_5M = "1.25x input (Anthropic's 5-minute write rule)"
RULE_1H = "2x input (Anthropic's 1-hour write rule)"
NO_REFUSAL = "accepted: no refusal documented"
FAL_README = "fal README price table (PROVIDERS.md, fal section)"
OLD_TABLE = "carried over from the earlier prices.py; no source in PROVIDERS.md"
NOT_FOUND = "no source found; nothing is capped or assumed"
READ_1202 = "read 2026-12-02"
HAIKU_5_5_PAGE = (
    "Claude Haiku 5.5 model page"
    f" (platform.claude.com/docs/en/models/haiku-5-5/overview, {READ_1202})"
)
SONNET_5_5_GUIDE = (
    f"Claude Sonnet 5.5 migration guide (platform.claude.com/docs/en/models/sonnet-5-5/migration-guide, "
    f"{READ_1202}): cache reads $0.10, half the Sonnet 5 rate (the copy of its model page read still "
    "says $0.20: the guide states the change, so it wins)"
)
LINEUP = (
    f"the model pages' current-lineup table (platform.claude.com/docs/id/models/sonnet-5/overview, "
    f"{READ_1202})"
)
FABLE_5_2_NEW = f"What's new in Claude Fable 5.2 (platform.claude.com/docs/en/models/fable-5-2, {READ_1202})"
LEGACY = f"its model page says Legacy (platform.claude.com/docs/*/models/<model>/overview, {READ_1202})"
MYTHOS_PRICING = PRICING + ": the Claude Mythos rows (limited availability)"
MYTHOS_AS_FABLE = "as Fable 5.2: Mythos shares its Fable's pricing (the pricing page's 5 and 5.1 rows)"
LIMITED = "limited availability: organizations verified by Anthropic's programs only"

PRICE_FIELDS = ("input", "output", "cache_read", "cache_write", "cache_write_1h")

_ADAPTIVE: frozenset[ThinkingType] = frozenset({"adaptive"})
_ADAPTIVE_OFF: frozenset[ThinkingType] = frozenset({"adaptive", "disabled"})
_ALL: frozenset[ThinkingType] = frozenset({"adaptive", "enabled", "disabled"})
_BUDGET: frozenset[ThinkingType] = frozenset({"enabled", "disabled"})
_NONE: frozenset[ThinkingType] = frozenset()
_NOT_FOUND = Source(UNKNOWN, NOT_FOUND)
_PAGES = Source(READ, MODEL_PAGES)
_SLUG_GUESS = Source(UNCONFIRMED, "slug by fal's naming (anthropic/<name with dots>)")
_ON_DEMAND_UNKNOWN = Source(
    UNKNOWN,
    "no page read lists the models with on-demand compaction (PROVIDERS.md: the Models API's "
    "capabilities.compaction says; the SDK 2.14 types BetaCompactionCapability.summarize): off "
    "until an operator file (TOOLLOOP_MODELS) sets on_demand_compaction from GET /v1/models",
)


def _price(
    values: tuple[float, float, float, float | None, float | None],
    kinds: str = "rrrrr",
    name: str = PRICING,
) -> tuple[ModelPrice, dict[str, Source]]:
    """A price from (input, output, read, 5m write, 1h write) and one letter per value: r read from
    `name`, u unconfirmed (3rd), d derived (a missing write is derived by the 1.25x / 2x rule)."""
    input_, output, read, write, write_1h = values
    if write is None:
        write, kinds = input_ * 1.25, kinds[:3] + "d" + kinds[4]
    if write_1h is None:
        write_1h, kinds = input_ * 2, kinds[:4] + "d"
    rules = {"cache_write": RULE_5M, "cache_write_1h": RULE_1H}
    sources = {}
    for field_name, kind in zip(PRICE_FIELDS, kinds, strict=True):
        if kind == "r":
            sources[f"price.{field_name}"] = Source(READ, name)
        elif kind == "u":
            sources[f"price.{field_name}"] = Source(UNCONFIRMED, THIRD)
        else:
            sources[f"price.{field_name}"] = Source(
                DERIVED, rules.get(field_name, name)
            )
    return ModelPrice(input_, output, read, write, write_1h), sources


def _with(
    price: tuple[ModelPrice, dict[str, Source]], field_name: str, source: str
) -> tuple[ModelPrice, dict[str, Source]]:
    """The price with one value read from another page than the pricing page."""
    return price[0], {**price[1], field_name: Source(READ, source)}


def _claude(
    id: str,
    price: tuple[ModelPrice, dict[str, Source]] | None,
    *,
    thinking: frozenset[ThinkingType],
    thinking_src: Source,
    forced_tool_choice: bool,
    tool_choice_src: Source,
    temperature: bool,
    temperature_src: Source,
    min_cache_tokens: int | None = None,
    min_cache_src: Source = _NOT_FOUND,
    status: Status = "current",
    status_date: str | None = None,
    status_src: Source = _PAGES,
    replacement: str | None = None,
    aliases: tuple[str, ...] = (),
    fal_slug: str | None = None,
    fal_src: Source = _SLUG_GUESS,
    max_output_tokens: int | None = None,
    context_window: int | None = None,
    size_src: Source = _NOT_FOUND,
) -> ModelInfo:
    sources = dict(price[1]) if price else {}
    if replacement is not None:
        sources["replacement"] = Source(DERIVED, "the current model of its family")
    sources.update(
        status=status_src,
        thinking=thinking_src,
        forced_tool_choice=tool_choice_src,
        temperature=temperature_src,
        min_cache_tokens=min_cache_src,
        max_output_tokens=size_src,
        context_window=size_src,
        fal_slug=fal_src,
        on_demand_compaction=_ON_DEMAND_UNKNOWN,
    )
    return ModelInfo(
        id=id,
        price=price[0] if price else None,
        aliases=aliases,
        status=status,
        status_date=status_date,
        replacement=replacement,
        thinking=thinking,
        forced_tool_choice=forced_tool_choice,
        temperature=temperature,
        min_cache_tokens=min_cache_tokens,
        max_output_tokens=max_output_tokens,
        context_window=context_window,
        fal_slug=fal_slug,
        sources=sources,
    )


def _retired(
    id: str,
    date: str | None,
    replacement: str,
    source: str,
    aliases: tuple[str, ...] = (),
) -> ModelInfo:
    gone = Source(READ, "retired: the API answers 404")
    return ModelInfo(
        id=id,
        aliases=aliases,
        status="retired",
        status_date=date,
        replacement=replacement,
        thinking=_NONE,
        sources={
            "status": Source(READ, source),
            "replacement": Source(DERIVED, "the current model of its family"),
            "thinking": gone,
        },
    )


def _other(
    id: str,
    input_: float,
    output: float,
    read_share: float,
    write_share: float,
    source: str,
) -> ModelInfo:
    """A non-Anthropic model (behind fal's router, or OpenAI's API): reads at `read_share` and writes
    at `write_share` of the input price (the family's rule: derived)."""
    vendor = id.split("/", 1)[0] if "/" in id else "openai"
    kind = READ if source == FAL_README else UNCONFIRMED
    rule = Source(
        DERIVED, f"{read_share:g}x / {write_share:g}x input (the family's cache rule)"
    )
    price = ModelPrice(
        input_, output, input_ * read_share, input_ * write_share, input_ * write_share
    )
    sources = {
        "price.input": Source(kind, source),
        "price.output": Source(kind, source),
        "price.cache_read": rule,
        "price.cache_write": rule,
        "price.cache_write_1h": rule,
        "thinking": Source(READ, "not an Anthropic model: fal sends reasoning.effort"),
        "forced_tool_choice": Source(DERIVED, NO_REFUSAL),
        "temperature": Source(DERIVED, NO_REFUSAL),
    }
    return ModelInfo(id=id, price=price, vendor=vendor, thinking=_NONE, sources=sources)


_R = Source(READ, MODEL_PAGES)
_D = Source(DERIVED, NO_REFUSAL)
_U = Source(UNKNOWN, "'check' or '-' in PROVIDERS.md: not sent (the safe choice)")
_OLD_API = Source(READ, MODEL_PAGES + ": accepted with anthropic-version 2023-06-01")
_3RD = Source(UNCONFIRMED, THIRD)

_T_ALWAYS = Source(
    READ, MODEL_PAGES + ": always on (adaptive + effort); 'disabled' is a 400"
)
_T_ADAPTIVE_ONLY = Source(
    READ, BEDROCK + ": adaptive only; 'enabled' and 'disabled' are a 400"
)
_T_ADAPTIVE = Source(
    DERIVED, MODEL_PAGES + ": adaptive + effort; 'disabled' as no refusal is documented"
)
_T_OPUS_5 = Source(READ, MODEL_PAGES + ": adaptive; 'disabled' only at effort <= high")
_T_ALL = Source(READ, BEDROCK + ": adaptive; 'enabled' deprecated but accepted")
_T_BUDGET = Source(
    READ,
    MODEL_PAGES + ": 'enabled' + budget_tokens only; adaptive and effort are a 400",
)
_SONNET_4_5 = SDK_DEPRECATED + "; PROVIDERS.md (404 since)"
_SIZE = Source(READ, MODEL_PAGES + " (models overview): 1M context, 128K max output")
_T_HAIKU_5_5 = Source(
    DERIVED,
    MODEL_PAGES + ": adaptive (not always on); 'disabled' as no refusal is documented",
)
_1M, _128K = 1_000_000, 128_000
_T_FABLE_5_2 = Source(
    READ, FABLE_5_2_NEW + ": adaptive thinking always on, effort sets its depth"
)
_AS_FABLE_5_1 = Source(
    DERIVED,
    "as Fable 5.1: What's new in Fable 5.2 lists four breaking changes from 5.1, none of this",
)
_SIZE_5_2 = Source(
    READ, FABLE_5_2_NEW + ": 1M context (default and maximum), 128k max output"
)
_LEGACY = Source(READ, LEGACY)


def _haiku_5_5() -> tuple[ModelPrice, dict[str, Source]]:
    """Haiku 5.5's two tiers: a prompt up to 100,000 tokens, and one over it (the whole request at
    the higher rates). The page gives input, output and both writes per tier; the cache reads
    (0.01 / 0.05) only third parties give. Which tokens count toward the 100,000 (we count uncached
    input, cache reads and writes, as Anthropic's earlier long-context tier did) is unconfirmed."""
    low, low_src = _price((0.10, 0.50, 0.01, 0.125, 0.20), "rrurr", HAIKU_5_5_PAGE)
    high, high_src = _price((0.50, 2.50, 0.05, 0.625, 1.00), "rrurr", HAIKU_5_5_PAGE)
    sources = {
        **low_src,
        **{key.replace("price.", "price.above."): src for key, src in high_src.items()},
    }
    sources["price.above.tokens"] = Source(
        READ,
        HAIKU_5_5_PAGE
        + ": 'for prompts over 100,000 tokens' (counting cache reads and writes: unconfirmed)",
    )
    tiered = ModelPrice(
        low.input,
        low.output,
        low.cache_read,
        low.cache_write,
        low.cache_write_1h,
        PriceTier(100_000, high),
    )
    return tiered, sources


MODELS: tuple[ModelInfo, ...] = (
    _claude(
        "claude-fable-5-2",
        _price((8, 40, 0.20, None, None), "rrudd", LINEUP),
        thinking=_ADAPTIVE,
        thinking_src=_T_FABLE_5_2,
        forced_tool_choice=False,
        tool_choice_src=_AS_FABLE_5_1,
        temperature=False,
        temperature_src=_AS_FABLE_5_1,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE_5_2,
        status_src=Source(
            READ, LINEUP + ": in the current lineup (released 2026-11-09)"
        ),
        fal_slug="anthropic/claude-fable-5.2",
    ),
    _claude(
        "claude-opus-5-5",
        _price((4, 20, 0.20, 5.00, 8.00)),
        thinking=_ADAPTIVE,
        thinking_src=_T_ALWAYS,
        forced_tool_choice=False,
        tool_choice_src=_R,
        temperature=False,
        temperature_src=_R,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE,
        fal_slug="anthropic/claude-opus-5.5",
        fal_src=Source(READ, FAL_README),
    ),
    _claude(
        "claude-sonnet-5-5",
        _with(_price((2, 10, 0.10, 2.50, 4.00)), "price.cache_read", SONNET_5_5_GUIDE),
        thinking=_ADAPTIVE_OFF,
        thinking_src=_T_ADAPTIVE,
        forced_tool_choice=False,
        tool_choice_src=_R,
        temperature=False,
        temperature_src=_R,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE,
        fal_slug="anthropic/claude-sonnet-5.5",
    ),
    _claude(
        "claude-haiku-5-5",
        _haiku_5_5(),
        thinking=_ADAPTIVE_OFF,
        thinking_src=_T_HAIKU_5_5,
        forced_tool_choice=False,
        tool_choice_src=_U,
        temperature=False,
        temperature_src=_R,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=Source(READ, HAIKU_5_5_PAGE),
        fal_slug="anthropic/claude-haiku-5.5",
    ),
    _claude(
        "claude-fable-5-1",
        _price((10, 50, 0.25, 12.50, 20.00)),
        thinking=_ADAPTIVE,
        thinking_src=_T_ADAPTIVE_ONLY,
        forced_tool_choice=False,
        tool_choice_src=_R,
        temperature=False,
        temperature_src=_R,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE,
        status_src=Source(
            UNCONFIRMED,
            LINEUP + " lists Fable 5.2, not 5.1; no Fable 5.1 page read says Legacy",
        ),
        fal_slug="anthropic/claude-fable-5.1",
    ),
    _claude(
        "claude-mythos-5-2",
        _price((8, 40, 0.20, None, None), "ddudd", MYTHOS_AS_FABLE),
        thinking=_ADAPTIVE,
        thinking_src=Source(
            READ, FABLE_5_2_NEW + ": the same capabilities as Fable 5.2"
        ),
        forced_tool_choice=False,
        tool_choice_src=_AS_FABLE_5_1,
        temperature=False,
        temperature_src=_AS_FABLE_5_1,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE_5_2,
        status_src=Source(READ, FABLE_5_2_NEW + ": " + LIMITED),
        fal_src=_NOT_FOUND,
    ),
    _claude(
        "claude-mythos-5-1",
        _price((10, 50, 0.25, 12.50, 20.00), name=MYTHOS_PRICING),
        thinking=_ADAPTIVE,
        thinking_src=Source(DERIVED, "as Fable 5.1 (the same model, other safeguards)"),
        forced_tool_choice=False,
        tool_choice_src=Source(DERIVED, "as Fable 5.1"),
        temperature=False,
        temperature_src=Source(DERIVED, "as Fable 5.1"),
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=Source(DERIVED, "as Fable 5.1"),
        status_src=Source(READ, MYTHOS_PRICING + ": " + LIMITED),
        fal_src=_NOT_FOUND,
    ),
    _claude(
        "claude-fable-5",
        _price((10, 50, 1.00, 12.50, 20.00)),
        thinking=_ADAPTIVE,
        thinking_src=_T_ADAPTIVE_ONLY,
        forced_tool_choice=False,
        tool_choice_src=_U,
        temperature=False,
        temperature_src=_3RD,
        min_cache_tokens=512,
        min_cache_src=_3RD,
        max_output_tokens=128_000,
        context_window=1_000_000,
        size_src=Source(READ, LEGACY + ": 1M context, 128K max output"),
        status="legacy",
        status_src=_LEGACY,
        replacement="claude-fable-5-2",
        fal_slug="anthropic/claude-fable-5",
    ),
    _claude(
        "claude-mythos-5",
        _price((10, 50, 1.00, 12.50, 20.00), name=MYTHOS_PRICING),
        thinking=_ADAPTIVE,
        thinking_src=Source(
            READ,
            "Fable 5 migration guide (platform.claude.com): 'disabled' and "
            "'enabled' are a 400 on Fable 5 and Mythos 5",
        ),
        forced_tool_choice=False,
        tool_choice_src=_U,
        temperature=False,
        temperature_src=_3RD,
        min_cache_tokens=512,
        min_cache_src=_3RD,
        max_output_tokens=128_000,
        context_window=1_000_000,
        size_src=Source(
            READ, LEGACY + ": Fable 5's page, Mythos 5 shares its specifications"
        ),
        status="legacy",
        status_src=Source(
            UNCONFIRMED, "as Fable 5 (Legacy); Mythos 5's own page not read; " + LIMITED
        ),
        replacement="claude-mythos-5-2",
        fal_src=_NOT_FOUND,
    ),
    _claude(
        "claude-opus-5",
        _price((5, 25, 0.50, 6.25, 10.00)),
        thinking=_ADAPTIVE_OFF,
        thinking_src=_T_OPUS_5,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=False,
        temperature_src=_U,
        min_cache_tokens=512,
        min_cache_src=_3RD,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE,
        status="legacy",
        status_src=_LEGACY,
        replacement="claude-opus-5-5",
        fal_slug="anthropic/claude-opus-5",
    ),
    _claude(
        "claude-sonnet-5",
        _price((2, 10, 0.20, 2.50, 4.00)),
        thinking=_ADAPTIVE_OFF,
        thinking_src=_T_ADAPTIVE,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=False,
        temperature_src=_U,
        min_cache_tokens=1024,
        min_cache_src=_3RD,
        max_output_tokens=_128K,
        context_window=_1M,
        size_src=_SIZE,
        status="legacy",
        status_src=_LEGACY,
        replacement="claude-sonnet-5-5",
        fal_slug="anthropic/claude-sonnet-5",
        fal_src=Source(READ, FAL_README),
    ),
    _claude(
        "claude-opus-4-8",
        _price((5, 25, 0.50, 6.25, 10.00)),
        thinking=_ADAPTIVE_OFF,
        thinking_src=_T_ADAPTIVE,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_OLD_API,
        min_cache_tokens=1024,
        min_cache_src=_3RD,
        fal_slug="anthropic/claude-opus-4.8",
    ),
    _claude(
        "claude-opus-4-7",
        _price((5, 25, 0.50, 6.25, 10.00)),
        thinking=_ADAPTIVE,
        thinking_src=_T_ADAPTIVE_ONLY,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_OLD_API,
        min_cache_tokens=2048,
        min_cache_src=_3RD,
        fal_slug="anthropic/claude-opus-4.7",
    ),
    _claude(
        "claude-opus-4-6",
        _price((5, 25, 0.50, 6.25, 10.00)),
        thinking=_ALL,
        thinking_src=_T_ALL,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_OLD_API,
        min_cache_tokens=4096,
        min_cache_src=_3RD,
        fal_slug="anthropic/claude-opus-4.6",
    ),
    _claude(
        "claude-opus-4-5",
        _price((5, 25, 0.50, 6.25, 10.00)),
        thinking=_BUDGET,
        thinking_src=_T_BUDGET,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_D,
        min_cache_tokens=4096,
        min_cache_src=_3RD,
        status="deprecated",
        status_date="2027-01-22",
        status_src=Source(READ, SDK_DEPRECATED),
        replacement="claude-opus-5-5",
        aliases=("claude-opus-4-5-20251101",),
        fal_slug="anthropic/claude-opus-4.5",
    ),
    _claude(
        "claude-sonnet-4-6",
        _price((3, 15, 0.30, 3.75, 6.00)),
        thinking=_ALL,
        thinking_src=_T_ALL,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_D,
        fal_slug="anthropic/claude-sonnet-4.6",
    ),
    _claude(
        "claude-haiku-4-5",
        _price((1, 5, 0.10, 1.25, 2.00)),
        thinking=_BUDGET,
        thinking_src=_T_BUDGET,
        forced_tool_choice=True,
        tool_choice_src=_D,
        temperature=True,
        temperature_src=_D,
        min_cache_tokens=4096,
        min_cache_src=_3RD,
        aliases=("claude-haiku-4-5-20251001",),
        fal_slug="anthropic/claude-haiku-4.5",
        fal_src=Source(READ, FAL_README),
    ),
    _retired(
        "claude-mythos-preview",
        "2026-06-30",
        "claude-mythos-5-2",
        SDK_DEPRECATED + ": end of life June 30th, 2026 (passed: retired)",
    ),
    _retired(
        "claude-sonnet-4-5",
        "2026-11-30",
        "claude-sonnet-5-5",
        _SONNET_4_5,
        ("claude-sonnet-4-5-20250929",),
    ),
    _retired(
        "claude-opus-4-1",
        None,
        "claude-opus-5-5",
        MODEL_PAGES + ": Bedrock and Google Cloud only",
    ),
    _retired("claude-opus-4", "2026-06-15", "claude-opus-5-5", MODEL_PAGES),
    _retired("claude-sonnet-4", "2026-06-15", "claude-sonnet-5-5", MODEL_PAGES),
    _retired("claude-3-7-sonnet", "2026-02-19", "claude-sonnet-5-5", MODEL_PAGES),
    _retired("claude-3-5-haiku", "2026-02-19", "claude-haiku-4-5", MODEL_PAGES),
    _other("openai/gpt-6-sol", 2, 10, 0.1, 1.25, FAL_README),
    _other("openai/gpt-6-astra", 10, 50, 0.1, 1.25, FAL_README),
    _other("google/gemini-3.8-flash", 0.75, 3.75, 0.25, 1.0, FAL_README),
    _other("google/gemini-2.5-flash", 0.3, 2.5, 0.25, 1.0, FAL_README),
    _other("x-ai/grok-4.7", 2, 6, 0.25, 1.0, FAL_README),
    _other("gpt-5", 1.25, 10, 0.1, 1.0, OLD_TABLE),
    _other("gpt-5-mini", 0.25, 2, 0.1, 1.0, OLD_TABLE),
    _other("gpt-4.1", 2, 8, 0.25, 1.0, OLD_TABLE),
    _other("gpt-4.1-mini", 0.4, 1.6, 0.25, 1.0, OLD_TABLE),
    _other("gpt-4o", 2.5, 10, 0.5, 1.0, OLD_TABLE),
    _other("gpt-4o-mini", 0.15, 0.6, 0.5, 1.0, OLD_TABLE),
)

_DEFAULT = Catalog(MODELS)


def default_catalog() -> Catalog:
    """The catalogue of `MODELS` (immutable: extend it with `with_models` / `with_prices`)."""
    return _DEFAULT


def marked(info: ModelInfo, name: str, value: str) -> str:
    """`value` with the mark of its source kind: (d), (u), (o), ? unknown; read: unmarked."""
    kind = info.source(name).kind
    if kind == "unknown":
        return "?" if value in ("", "-") else f"{value} (?)"
    return (
        value
        + {"read": "", "derived": " (d)", "unconfirmed": " (u)", OPERATOR: " (o)"}[kind]
    )


def _size(tokens: int | None) -> str:
    if tokens is None:
        return "?"
    return (
        f"{tokens // 1_000_000}M" if tokens % 1_000_000 == 0 else f"{tokens // 1000}K"
    )


def long_context(info: ModelInfo) -> str:
    """The long-context tier of a row as one cell: "> 100K: 0.5 / 2.5, read 0.05 (u), ..."; "-" without."""
    tier = info.price.above if info.price is not None else None
    if tier is None:
        return "-"
    p = tier.price

    def cell(field: str, value: float) -> str:
        return marked(info, f"price.above.{field}", f"{value:g}")

    rates = f"{cell('input', p.input)} / {cell('output', p.output)}"
    writes = (
        f"{cell('cache_write', p.cache_write)} / {cell('cache_write_1h', p.write_1h)}"
    )
    return f"> {_size(tier.tokens)}: {rates}, read {cell('cache_read', p.cache_read)}, writes {writes}"


def status_cell(info: ModelInfo, quote: str = "") -> str:
    """A row's status as one cell: "legacy 2026-11-09 -> claude-sonnet-5-5", with its source mark;
    `quote` wraps the replacement's id (a backtick in Markdown)."""
    status = marked(info, "status", info.status) + (
        f" {info.status_date}" if info.status_date else ""
    )
    if info.replacement:
        status += f" -> {quote}{info.replacement}{quote}"
    return status


def price_cells(info: ModelInfo) -> list[str]:
    """A priced row's cells: in / out, cache read, 5m write, 1h write, long context (marked)."""
    assert info.price is not None
    p = info.price
    return [
        marked(info, "price.input", f"{p.input:g}")
        + " / "
        + marked(info, "price.output", f"{p.output:g}"),
        marked(info, "price.cache_read", f"{p.cache_read:g}"),
        marked(info, "price.cache_write", f"{p.cache_write:g}"),
        marked(info, "price.cache_write_1h", f"{p.write_1h:g}"),
        long_context(info),
    ]


def markdown(catalog: Catalog) -> str:
    """The catalogue as the Markdown table of docs/providers.md (tests/unit/test_catalog.py keeps
    the page equal to it). (d) derived, (u) unconfirmed, (o) the operator file, ? unknown, else read."""
    head = (
        "| Model | Status | $/MTok in / out | read | 5m write | 1h write | long context | thinking "
        "| forced tool_choice | temperature | min cache | max out / context | fal slug |\n"
        + "| --- " * 13
        + "|"
    )
    rows = [head]
    for info in catalog.models():
        status = status_cell(info, "`")
        if info.price is None:
            rows.append(f"| `{info.id}` | {status} |" + " |" * 11)
            continue
        money = price_cells(info)
        if info.vendor != "anthropic":
            thinking = "reasoning.effort (fal)"
        else:
            thinking = ", ".join(sorted(info.thinking)) or "none sent"
        rules = [
            marked(info, "thinking", thinking),
            marked(
                info, "forced_tool_choice", "yes" if info.forced_tool_choice else "no"
            ),
            marked(info, "temperature", "yes" if info.temperature else "no"),
            marked(info, "min_cache_tokens", str(info.min_cache_tokens or "-")),
            marked(
                info,
                "max_output_tokens",
                _size(info.max_output_tokens) + " / " + _size(info.context_window),
            )
            if info.max_output_tokens
            else "-",
            marked(info, "fal_slug", f"`{info.fal_slug}`") if info.fal_slug else "",
        ]
        rows.append(f"| `{info.id}` | {status} | " + " | ".join(money + rules) + " |")
    return "\n".join(rows)
