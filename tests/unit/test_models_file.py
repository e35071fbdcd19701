"""The operator file (TOOLLOOP_MODELS, toolloop/providers/models_file.py), the long-context tier of a
price, and `toolloop models`: what an operator adds or overrides is what the providers price with,
every bad or hostile file is refused with two lines naming the variable and the entry, and the
command prints the catalogue in force with its sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolloop import PromptGenRequest
from toolloop.cli import main
from toolloop.providers import AnthropicHandler, default_catalog, from_env
from toolloop.providers.catalog import ModelPrice, token_cost
from toolloop.providers.models import HAIKU_5_5_PAGE
from toolloop.providers.models_file import ENV, ModelsFileError, catalog_from_env, load

OVERRIDE = """\
models:
  claude-fable-5-2:
    price: {input: 7.5, output: 38}
    source: "our contract, 2026-12-01"
  claude-sonnet-5:
    status: deprecated
    status_date: "2027-03-01"
  claude-next:
    like: claude-opus-5-5
    price: {input: 3, output: 15, above: {tokens: 200000, input: 6, output: 22.5}}
"""


def write(tmp_path: Path, text: str, name: str = "models.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the long-context tier -----------------------------------------------------------------------


def test_a_haiku_5_5_prompt_over_100k_tokens_is_priced_whole_at_its_tier() -> None:
    price = default_catalog().price("claude-haiku-5-5")
    assert (
        price is not None and price.above is not None and price.above.tokens == 100_000
    )
    # 100,000: the low tier
    at_limit = token_cost(price, input=60_000, cache_read=40_000, output=1_000)
    assert at_limit == pytest.approx(
        (60_000 * 0.10 + 40_000 * 0.01 + 1_000 * 0.50) / 1e6
    )
    # over: all at the tier
    over = token_cost(price, input=60_001, cache_read=40_000, output=1_000)
    assert over == pytest.approx((60_001 * 0.50 + 40_000 * 0.05 + 1_000 * 2.50) / 1e6)
    # writes count
    writes = token_cost(price, input=1, cache_write=99_999, cache_write_1h=1, output=0)
    assert writes == pytest.approx((1 * 0.50 + 99_999 * 0.625 + 1 * 1.00) / 1e6)
    info = default_catalog().find("claude-haiku-5-5")
    assert info is not None and info.source("price.above.input").name == HAIKU_5_5_PAGE
    # third parties only
    assert info.source("price.above.cache_read").kind == "unconfirmed"


def test_the_estimate_of_a_long_prompt_uses_its_tier() -> None:
    handler = AnthropicHandler("k")
    short = PromptGenRequest(
        prompt="word " * 1000, model="claude-haiku-5-5", params={"max_tokens": 1000}
    )
    # 125,000 estimated tokens
    long = short.model_copy(update={"prompt": "x" * 500_000})
    assert handler.estimate(short) < 0.001
    assert handler.estimate(long) == pytest.approx(
        (125_000 * 0.50 + 1000 * 2.50) / 1e6, rel=0.01
    )


# -- the operator file ---------------------------------------------------------------------------


def test_an_operator_file_overrides_a_price_a_status_and_adds_a_model(
    tmp_path: Path,
) -> None:
    catalog = catalog_from_env({ENV: write(tmp_path, OVERRIDE)})
    fable = catalog.find("claude-fable-5-2")
    assert fable is not None and fable.price is not None
    # the rest kept
    assert (fable.price.input, fable.price.output, fable.price.cache_read) == (
        7.5,
        38,
        0.2,
    )
    assert fable.source("price.input").kind == "operator"
    assert fable.source("price.input").name == "our contract, 2026-12-01"
    # untouched: the built-in source
    assert fable.source("price.cache_read").kind == "unconfirmed"
    sonnet = catalog.find("claude-sonnet-5")
    assert sonnet is not None and (sonnet.status, sonnet.status_date) == (
        "deprecated",
        "2027-03-01",
    )
    nxt = catalog.find("claude-next")
    opus = default_catalog().find("claude-opus-5-5")
    assert nxt is not None and opus is not None and nxt.thinking == opus.thinking
    assert nxt.forced_tool_choice is False  # Opus 5.5's rules
    assert nxt.price == ModelPrice(
        3, 15, 0.3, 3.75, 6.0, nxt.price.above if nxt.price else None
    )
    # Anthropic's rule for a missing one
    assert nxt.source("price.cache_read").kind == "derived"
    cost = token_cost(nxt.price, input=200_001, output=10)  # type: ignore[arg-type]
    assert cost == pytest.approx((200_001 * 6 + 10 * 22.5) / 1e6)
    assert default_catalog().find("claude-next") is None  # nothing global changed
    gen = from_env({ENV: write(tmp_path, OVERRIDE), "ANTHROPIC_API_KEY": "k"})
    assert gen.estimate(PromptGenRequest(prompt="x" * 4000, model="claude-next")) > 0


def test_an_operator_file_turns_on_demand_compaction_on_for_a_model(
    tmp_path: Path,
) -> None:
    text = "models: {claude-sonnet-5-5: {on_demand_compaction: true}}"
    catalog = catalog_from_env({ENV: write(tmp_path, text, "models.yaml")})
    sonnet = catalog.find("claude-sonnet-5-5")
    built_in = default_catalog().find("claude-sonnet-5-5")
    assert sonnet is not None and built_in is not None
    assert sonnet.on_demand_compaction and sonnet.supports("on_demand_compaction")
    assert sonnet.source("on_demand_compaction").kind == "operator"
    assert not built_in.on_demand_compaction  # no source says which models have it
    assert built_in.source("on_demand_compaction").kind == "unknown"
    handler = AnthropicHandler("k", catalog=catalog)
    assert handler.supports("on_demand_compaction", "claude-sonnet-5-5")
    assert not handler.supports("on_demand_compaction", "claude-opus-5-5")
    assert handler.supports("count_tokens", "claude-opus-5-5")
    assert not handler.supports("count_tokens", "claude-sonnet-4-5")  # retired


def test_an_unset_or_blank_variable_is_the_built_in_catalogue() -> None:
    assert catalog_from_env({}) is default_catalog()
    assert catalog_from_env({ENV: "  "}) is default_catalog()


HOSTILE = [
    (
        '{"models": {"claude-fable-5-2": {"price": {"input": NaN}}}}',
        "json",
        "claude-fable-5-2.price.input is nan",
    ),
    (
        '{"models": {"claude-fable-5-2": {"price": {"output": Infinity}}}}',
        "json",
        "price.output is inf",
    ),
    (
        "models: {claude-fable-5-2: {price: {input: .nan}}}",
        "yaml",
        "claude-fable-5-2.price.input is nan",
    ),
    (
        "models: {claude-fable-5-2: {price: {cache_read: -.inf}}}",
        "yaml",
        "price.cache_read is -inf",
    ),
    (
        "models: {claude-fable-5-2: {price: {input: -1}}}",
        "yaml",
        "claude-fable-5-2.price.input is -1",
    ),
    (
        "models: {claude-fable-5-2: {price: {input: '3'}}}",
        "yaml",
        "is the text '3', not a price",
    ),
    (
        "models: {claude-fable-5-2: {price: {input: true}}}",
        "yaml",
        "price.input is True, not a price",
    ),
    (
        '{"models": {"claude-fable-5-2": {"price": {"input": 1e400}}}}',
        "json",
        "price.input is inf",
    ),
    (
        "models: {claude-fable-5-2: {price: {input: 1.0e+300}}}",
        "yaml",
        "is 1e+300, more than 1e9",
    ),
    (
        "models: {claude-fable-5-2: {price: {inptu: 3}}}",
        "yaml",
        "claude-fable-5-2.price.inptu is not a price field",
    ),
    (
        "models: {claude-fable-5-2: {stauts: legacy}}",
        "yaml",
        "claude-fable-5-2.stauts is not a field",
    ),
    (
        "models: {claude-fable-5-2: {status: gone}}",
        "yaml",
        "claude-fable-5-2.status is 'gone'",
    ),
    ("models: {claude-new: {status: current}}", "yaml", "claude-new has no price"),
    (
        "models: {claude-new: {price: {input: 3}}}",
        "yaml",
        "claude-new.price.output is missing",
    ),
    (
        "models: {claude-new: {like: claude-nope, price: {input: 1, output: 2}}}",
        "yaml",
        "claude-new.like names",
    ),
    (
        "models: {claude-haiku-5-5: {price: {above: {input: 1}}}}",
        "yaml",
        "price.above.tokens is missing",
    ),
    (
        "models: {claude-haiku-5-5: {max_output_tokens: -5}}",
        "yaml",
        "max_output_tokens is -5",
    ),
    (
        "models: {claude-sonnet-5-5: {on_demand_compaction: yes please}}",
        "yaml",
        "on_demand_compaction is 'yes please'",
    ),
    (
        "- claude-fable-5-2",
        "yaml",
        "the file is list, not a mapping with one key `models`",
    ),
    ("models: [1, 2]", "yaml", "not a mapping with one key `models`"),
    ("claude-fable-5-2: {price: {input: 1}}", "yaml", "the keys ['claude-fable-5-2']"),
    ("models: {claude-fable-5-2: {price: {input: 1}}", "yaml", "is not valid YAML"),
    (
        "models: !!python/object/apply:os.system ['touch PWNED']",
        "yaml",
        "is not valid YAML",
    ),
]


@pytest.mark.parametrize(
    ("text", "kind", "message"), HOSTILE, ids=[h[2][:40] for h in HOSTILE]
)
def test_a_bad_or_hostile_file_is_refused_in_two_lines_naming_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, kind: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, text, f"models.{kind}")
    with pytest.raises(ModelsFileError) as caught:
        load(path, default_catalog())
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith("  "), lines
    assert lines[0].startswith(f"{ENV} ({path}): ") and message in lines[0], lines[0]
    assert not (tmp_path / "PWNED").exists()  # no YAML tag runs code


def test_a_missing_or_huge_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ModelsFileError, match=r"cannot be read \(No such file or directory\)"
    ):
        catalog_from_env({ENV: str(tmp_path / "nope.yaml")})
    huge = write(tmp_path, "models: {}\n" + "#" * 1_000_001)
    with pytest.raises(ModelsFileError, match="more than 1,000,000"):
        catalog_from_env({ENV: huge})


# -- toolloop models -----------------------------------------------------------------------------


def test_toolloop_models_prints_statuses_prices_and_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Model catalogue in force (") and f"{ENV} unset" in out
    row = next(
        line for line in out.splitlines() if line.startswith("claude-fable-5-2 ")
    )
    assert (
        "current" in row and "8 / 40" in row and "0.2 (u)" in row and "built-in" in row
    )
    assert any(
        line.startswith("claude-sonnet-5 ") and "legacy -> claude-sonnet-5-5" in line
        for line in out.splitlines()
    )
    sources = out.split("\nSources:\n", 1)[1]
    assert "read: the model pages' current-lineup table" in sources
    assert "unconfirmed: third-party trackers" in sources
    numbers = row.split()[-1].split(",")
    # every number a row cites is listed
    assert all(f"  [{n}] " in sources for n in numbers)


def test_toolloop_models_marks_the_operator_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV, write(tmp_path, OVERRIDE))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "3 rows from it" in out
    row = next(
        line for line in out.splitlines() if line.startswith("claude-fable-5-2 ")
    )
    assert "7.5 (o) / 38 (o)" in row and " file " in row
    assert "operator: our contract, 2026-12-01" in out
    assert main(["models", "claude-next", "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert (
        data["from_operator_file"] is True
        and data["price"]["above"]["tokens"] == 200_000
    )
    assert main(["models", "claude-fable-5-2"]) == 0
    detail = capsys.readouterr().out
    assert "price.input" in detail and "operator: our contract, 2026-12-01" in detail


def test_toolloop_models_refuses_a_bad_file_in_two_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        ENV, write(tmp_path, "models: {claude-fable-5-2: {price: {input: .nan}}}")
    )
    assert main(["models"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 2
        and err[0].startswith(f"{ENV} (")
        and "claude-fable-5-2.price.input is nan" in err[0]
    )
