"""The model catalogue: every price against its published source, lookups, overrides, the request
shapes each model gets (anthropic/params.py), and the errors raised before any call."""

from __future__ import annotations

from typing import Any

import pytest

from toolloop import PromptGenError, PromptGenRequest, UserMessage
from toolloop.providers import (
    AnthropicHandler,
    Catalog,
    FalHandler,
    ModelInfo,
    ModelPrice,
    default_catalog,
)
from toolloop.providers.anthropic.params import top_level
from toolloop.providers.catalog import token_cost
from toolloop.providers.models import (
    FAL_README,
    HAIKU_5_5_PAGE,
    LINEUP,
    MODELS,
    MYTHOS_PRICING,
    OLD_TABLE,
    PRICE_FIELDS,
    PRICING,
    SONNET_5_5_GUIDE,
    THIRD,
)

# PROVIDERS.md "Today's Claude models" (read 2026-12-01) and the first-party pages read 2026-12-02,
# copied by hand: (model, field) -> (USD per MTok, where it is read). A derived value (no source
# states it) is checked against its rule below. Changed 2026-12-02 where the pages say the earlier
# value was wrong: Sonnet 5.5 reads at 0.10 (its migration guide: "half the Claude Sonnet 5 rate",
# was 0.20); Haiku 5.5's input, output and writes are on its model page (were third-party / derived);
# the Fable 5 / 5.1 writes are on the pricing page (were derived, the same values).
PUBLISHED: dict[tuple[str, str], tuple[float, str]] = {
    ("claude-opus-5-5", "input"): (4, PRICING),
    ("claude-opus-5-5", "output"): (20, PRICING),
    ("claude-opus-5-5", "cache_read"): (0.20, PRICING),
    ("claude-opus-5-5", "cache_write"): (5.00, PRICING),
    ("claude-opus-5-5", "cache_write_1h"): (8.00, PRICING),
    ("claude-sonnet-5-5", "input"): (2, PRICING),
    ("claude-sonnet-5-5", "output"): (10, PRICING),
    ("claude-sonnet-5-5", "cache_read"): (0.10, SONNET_5_5_GUIDE),
    ("claude-sonnet-5-5", "cache_write"): (2.50, PRICING),
    ("claude-sonnet-5-5", "cache_write_1h"): (4.00, PRICING),
    ("claude-haiku-5-5", "input"): (0.10, HAIKU_5_5_PAGE),
    ("claude-haiku-5-5", "output"): (0.50, HAIKU_5_5_PAGE),
    ("claude-haiku-5-5", "cache_read"): (0.01, THIRD),
    ("claude-haiku-5-5", "cache_write"): (0.125, HAIKU_5_5_PAGE),
    ("claude-haiku-5-5", "cache_write_1h"): (0.20, HAIKU_5_5_PAGE),
    ("claude-fable-5-2", "input"): (8, LINEUP),
    ("claude-fable-5-2", "output"): (40, LINEUP),
    ("claude-fable-5-2", "cache_read"): (0.20, THIRD),
    ("claude-mythos-5-2", "cache_read"): (0.20, THIRD),
    **{
        (model, field): (value, where)
        for model, where, read in (
            ("claude-fable-5-1", PRICING, 0.25),
            ("claude-mythos-5-1", MYTHOS_PRICING, 0.25),
            ("claude-fable-5", PRICING, 1.00),
            ("claude-mythos-5", MYTHOS_PRICING, 1.00),
        )
        for field, value in zip(PRICE_FIELDS, (10, 50, read, 12.50, 20.00), strict=True)
    },
    **{
        (model, field): (value, PRICING)
        for model in (
            "claude-opus-5",
            "claude-opus-4-8",
            "claude-opus-4-7",
            "claude-opus-4-6",
            "claude-opus-4-5",
        )
        for field, value in zip(PRICE_FIELDS, (5, 25, 0.50, 6.25, 10.00), strict=True)
    },
    **{
        ("claude-sonnet-5", field): (value, PRICING)
        for field, value in zip(PRICE_FIELDS, (2, 10, 0.20, 2.50, 4.00), strict=True)
    },
    **{
        ("claude-sonnet-4-6", field): (value, PRICING)
        for field, value in zip(PRICE_FIELDS, (3, 15, 0.30, 3.75, 6.00), strict=True)
    },
    **{
        ("claude-haiku-4-5", field): (value, PRICING)
        for field, value in zip(PRICE_FIELDS, (1, 5, 0.10, 1.25, 2.00), strict=True)
    },
    ("openai/gpt-6-sol", "input"): (2, FAL_README),
    ("openai/gpt-6-sol", "output"): (10, FAL_README),
    ("openai/gpt-6-astra", "input"): (10, FAL_README),
    ("openai/gpt-6-astra", "output"): (50, FAL_README),
    ("google/gemini-3.8-flash", "input"): (0.75, FAL_README),
    ("google/gemini-3.8-flash", "output"): (3.75, FAL_README),
    ("google/gemini-2.5-flash", "input"): (0.3, FAL_README),
    ("google/gemini-2.5-flash", "output"): (2.5, FAL_README),
    ("x-ai/grok-4.7", "input"): (2, FAL_README),
    ("x-ai/grok-4.7", "output"): (6, FAL_README),
    # OpenAI's own API (openai, codex providers): the earlier prices.py table, no source yet
    **{
        (model, field): (value, OLD_TABLE)
        for model, prices in {
            "gpt-5": (1.25, 10),
            "gpt-5-mini": (0.25, 2),
            "gpt-4.1": (2, 8),
            "gpt-4.1-mini": (0.4, 1.6),
            "gpt-4o": (2.5, 10),
            "gpt-4o-mini": (0.15, 0.6),
        }.items()
        for field, value in zip(("input", "output"), prices, strict=True)
    },
}

PRICED = [
    (info, field) for info in MODELS if info.price is not None for field in PRICE_FIELDS
]


def _case_id(case: Any) -> str:
    info, field = case
    source = info.source(f"price.{field}")
    return f"{info.id}.{field}<-{source.kind}:{source.name[:40]}"


@pytest.mark.parametrize("case", PRICED, ids=[_case_id(c) for c in PRICED])
def test_each_price_matches_its_named_source(case: tuple[ModelInfo, str]) -> None:
    info, field = case
    assert info.price is not None
    value = getattr(info.price, field)
    source = info.source(f"price.{field}")
    assert source.name  # every value says where it comes from
    if (info.id, field) in PUBLISHED:
        published, where = PUBLISHED[(info.id, field)]
        assert value == pytest.approx(published) and source.name == where
        assert source.kind == ("unconfirmed" if where in (THIRD, OLD_TABLE) else "read")
    else:  # not stated anywhere: derived by the rule its source names
        assert source.kind == "derived", (
            f"{info.id}.{field} is neither published nor derived"
        )
        if source.name.startswith("as Fable 5.2"):  # Mythos 5.2: its Fable's price
            fable = default_catalog().price("claude-fable-5-2")
            assert fable is not None and value == getattr(fable, field)
        elif "1.25x" in source.name and field == "cache_write":
            assert value == pytest.approx(info.price.input * 1.25)
        elif "2x input" in source.name:
            assert value == pytest.approx(info.price.input * 2)
        else:  # another family's cache rule: "<read>x / <write>x input"
            read, write = (
                float(part.strip().rstrip("x"))
                for part in source.name.split(" input")[0].split("/")
            )
            share = read if field == "cache_read" else write
            assert value == pytest.approx(info.price.input * share)


def test_the_opus_5_5_answer_of_the_issue_costs_the_published_rates_exactly() -> None:
    price = default_catalog().price("claude-opus-5-5")
    assert price is not None
    cost = token_cost(price, input=1000, output=500, cache_read=27_000)
    assert cost == 27000 * 0.20 / 1e6 + 1000 * 4 / 1e6 + 500 * 20 / 1e6


def test_one_hour_writes_have_their_own_price() -> None:
    price = default_catalog().price("claude-sonnet-5-5")
    assert price is not None
    assert token_cost(price, input=0, output=0, cache_write_1h=1_000_000) == 4.00
    assert token_cost(price, input=0, output=0, cache_write=1_000_000) == 2.50
    # a caller's row without one: 2x input
    assert ModelPrice(3, 15, 0.3, 3.75).write_1h == 6


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("claude-opus-5-5", "claude-opus-5-5"),
        ("anthropic/claude-opus-5.5", "claude-opus-5-5"),
        ("anthropic/claude-opus-5-5", "claude-opus-5-5"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("anthropic/claude-haiku-4.5", "claude-haiku-4-5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet"),
        ("anthropic/claude-sonnet-5", "claude-sonnet-5"),
        ("gpt-5-mini", "gpt-5-mini"),
    ],
)
def test_ids_aliases_dated_ids_and_fal_slugs_find_their_row(
    name: str, found: str
) -> None:
    info = default_catalog().find(name)
    assert info is not None and info.id == found


def test_lifecycle_comes_from_the_sdk_and_the_model_pages() -> None:
    catalog = default_catalog()
    opus_4_5 = catalog.find("claude-opus-4-5")
    assert opus_4_5 is not None and (opus_4_5.status, opus_4_5.status_date) == (
        "deprecated",
        "2027-01-22",
    )
    assert "deprecated_models.py" in opus_4_5.source("status").name
    for retired in (
        "claude-sonnet-4-5",
        "claude-opus-4-1",
        "claude-opus-4",
        "claude-3-5-haiku",
    ):
        info = catalog.find(retired)
        assert (
            info is not None
            and info.status == "retired"
            and info.replacement is not None
        )
        replacement = catalog.find(info.replacement)
        assert replacement is not None and replacement.status == "current"


def test_a_retired_id_fails_before_any_call_naming_its_replacement() -> None:
    with pytest.raises(PromptGenError) as caught:
        default_catalog().require("anthropic", "claude-sonnet-4-5")
    message = str(caught.value)
    assert (
        "'claude-sonnet-4-5' was retired on 2026-11-30" in message
        and "'claude-sonnet-5-5'" in message
    )


def test_callers_extend_and_override_without_touching_the_default() -> None:
    mine = ModelInfo(
        id="claude-next",
        price=ModelPrice(3, 15, 0.3, 3.75, 6),
        thinking=frozenset({"adaptive"}),
    )
    catalog = default_catalog().with_models(mine)
    assert (
        catalog.find("claude-next") == mine
        and default_catalog().find("claude-next") is None
    )
    cheaper = default_catalog().with_prices(
        {"claude-opus-5-5": ModelPrice(1, 2, 0.1, 1.25, 2)}
    )
    opus = cheaper.find("anthropic/claude-opus-5.5")
    assert opus is not None and opus.price == ModelPrice(1, 2, 0.1, 1.25, 2)
    assert opus.thinking == frozenset({"adaptive"})  # only the price was replaced
    assert default_catalog().price("claude-opus-5-5") == ModelPrice(4, 20, 0.2, 5, 8)
    handler = AnthropicHandler("k", catalog=catalog)
    assert handler.estimate(PromptGenRequest(prompt="x" * 400, model="claude-next")) > 0
    assert FalHandler("k", catalog=catalog).catalog.find("claude-next") == mine
    assert isinstance(catalog, Catalog) and len(catalog) == len(default_catalog()) + 1


REQUEST = PromptGenRequest(messages=[UserMessage(content="Hi")])


@pytest.mark.parametrize(
    ("model", "reasoning", "thinking", "effort"),
    [
        (
            "claude-opus-5-5",
            "off",
            {"type": "adaptive"},
            "low",
        ),  # always on: never "disabled"
        ("claude-opus-5-5", "high", {"type": "adaptive"}, "high"),
        ("claude-fable-5-1", "off", {"type": "adaptive"}, "low"),
        ("claude-sonnet-5-5", "off", {"type": "disabled"}, None),
        ("claude-sonnet-5-5", "medium", {"type": "adaptive"}, "medium"),
        ("claude-haiku-4-5", "off", {"type": "disabled"}, None),
        (
            "claude-haiku-4-5",
            "low",
            {"type": "enabled", "budget_tokens": 2048},
            None,
        ),  # never adaptive
        ("claude-opus-4-5", "high", {"type": "enabled", "budget_tokens": 24576}, None),
        ("claude-haiku-5-5", "high", {"type": "adaptive"}, "high"),
    ],
)
def test_reasoning_maps_to_what_each_model_accepts(
    model: str, reasoning: str, thinking: dict[str, Any] | None, effort: str | None
) -> None:
    info = default_catalog().find(model)
    assert info is not None
    fields, _ = top_level(REQUEST, info, reasoning)  # type: ignore[arg-type]
    assert fields.get("thinking") == thinking
    assert fields.get("output_config", {}).get("effort") == effort
    if thinking is not None and thinking["type"] == "enabled":
        assert fields["max_tokens"] > thinking["budget_tokens"]  # the API's rule


def test_a_model_with_no_known_thinking_parameter_gets_none() -> None:
    bare = ModelInfo(
        id="claude-bare", price=ModelPrice(1, 1, 0.1, 1.25), thinking=frozenset()
    )
    fields, notes = top_level(REQUEST, bare, "high")
    assert "thinking" not in fields and "output_config" not in fields
    assert notes == [
        "claude-bare has no known thinking parameter: reasoning 'high' not sent"
    ]


def test_max_tokens_never_exceeds_the_models_maximum_output() -> None:
    small = ModelInfo(
        id="claude-small", price=ModelPrice(1, 1, 0.1, 1.25), max_output_tokens=4096
    )
    fields, notes = top_level(
        REQUEST.model_copy(update={"params": {"max_tokens": 100_000}}), small, None
    )
    assert fields["max_tokens"] == 4096 and notes == [
        "max_tokens 100000 cut to claude-small's maximum output of 4096"
    ]


def test_docs_show_the_catalogue_as_it_is() -> None:
    from pathlib import Path

    from toolloop.providers.models import markdown

    page = (Path(__file__).parents[2] / "docs" / "providers.md").read_text()
    shown = page.split("<!-- catalogue:start -->\n", 1)[1].split(
        "\n<!-- catalogue:end -->", 1
    )[0]
    assert shown == markdown(default_catalog()), (
        "regenerate the table: models.markdown(default_catalog())"
    )
