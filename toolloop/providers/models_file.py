"""The operator file: `TOOLLOOP_MODELS` names a JSON or YAML file that adds models to the catalogue
or overrides a price or a status, without a release. Read by `from_env` (so by every worker), by
`workers.client.sync.Client` / `AsyncClient`, by the simulator (`SimServer`, `toolloop sim`) and by
`toolloop models`, each once when it is made.

    models:
      claude-fable-5-2:                  # a known model: only the fields given change
        price: {input: 7.5, output: 38}
        source: "our contract with Anthropic, 2026-12-01"
      claude-sonnet-5:
        status: deprecated
        status_date: "2027-03-01"
      claude-next:                       # a new model: input and output prices are required
        like: claude-opus-5-5            # its request rules (thinking, tool_choice, ...) are Opus 5.5's
        price: {input: 3, output: 15, cache_read: 0.3, cache_write: 3.75, cache_write_1h: 6,
                above: {tokens: 200000, input: 6, output: 22.5}}

Every value the file gives has the source kind "operator" (its `source` text, else the file's path),
so `toolloop models` shows which rows it touched. A missing cache price of a new model follows
Anthropic's rule (read 0.1x, 5-minute write 1.25x, 1-hour write 2x input: derived). Anything else
is refused with `ModelsFileError`, two lines naming the variable, the file and the bad entry: an
unknown key, a price that is not a finite number >= 0 (NaN, infinity, a string, a boolean), an
unknown status, a file that is not a mapping, larger than 1 MB, or not JSON/YAML. YAML is read with
`yaml.safe_load`: no tag runs code.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import yaml

from toolloop.providers.catalog import (
    DERIVED,
    OPERATOR,
    Catalog,
    ModelInfo,
    ModelPrice,
    PriceTier,
    Source,
    Status,
)
from toolloop.providers.models import PRICE_FIELDS, default_catalog

ENV = "TOOLLOOP_MODELS"
MAX_BYTES = 1_000_000
_STATUSES = get_args(Status)
_ENTRY_KEYS = {
    "price",
    "status",
    "status_date",
    "replacement",
    "like",
    "aliases",
    "fal_slug",
    "max_output_tokens",
    "context_window",
    "on_demand_compaction",
    "source",
}
_PRICE_KEYS = {*PRICE_FIELDS, "above"}
_TIER_KEYS = {"tokens", *PRICE_FIELDS}
_RULE = {"cache_read": 0.1, "cache_write": 1.25, "cache_write_1h": 2.0}


class ModelsFileError(ValueError):
    """A bad operator file: `str(error)` is two lines, what is wrong and what to do."""


class _Bad(Exception):
    def __init__(self, where: str, problem: str, fix: str) -> None:
        super().__init__(where, problem, fix)
        self.where, self.problem, self.fix = where, problem, fix


def catalog_from_env(
    env: Mapping[str, str] | None = None, base: Catalog | None = None
) -> Catalog:
    """The catalogue in force: `base` (default `default_catalog()`) with the file TOOLLOOP_MODELS
    names laid over it; `base` itself when the variable is unset or blank."""
    path = (os.environ if env is None else env).get(ENV, "").strip()
    base = base or default_catalog()
    return load(path, base) if path else base


def load(path: str, base: Catalog) -> Catalog:
    """`base` with the operator file at `path` laid over it (ModelsFileError when it is bad)."""
    data = _read(path)
    try:
        if (
            not isinstance(data, dict)
            or set(data) != {"models"}
            or not isinstance(data["models"], dict)
        ):
            got = (
                type(data).__name__
                if not isinstance(data, dict)
                else f"the keys {sorted(map(str, data))}"
            )
            raise _Bad(
                "the file",
                f"is {got}, not a mapping with one key `models`",
                "Write `models:` and under it one entry per model id.",
            )
        rows = [
            _row(str(name), entry, base, path) for name, entry in data["models"].items()
        ]
    except _Bad as bad:
        raise ModelsFileError(
            f"{ENV} ({path}): {bad.where} {bad.problem}.\n  {bad.fix} See docs/providers.md."
        ) from None
    return base.with_models(*rows)


def _read(path: str) -> Any:
    def fail(problem: str, fix: str) -> ModelsFileError:
        return ModelsFileError(f"{ENV} ({path}): {problem}.\n  {fix}")

    try:
        file = Path(path)
        size = file.stat().st_size
        if size > MAX_BYTES:
            raise fail(
                f"the file has {size:,} bytes, more than {MAX_BYTES:,}",
                "Keep only the models you change.",
            )
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise fail(
            f"cannot be read ({error.strerror or error})",
            f"Point {ENV} at a readable JSON or YAML file.",
        ) from None
    except UnicodeDecodeError:
        raise fail("is not UTF-8 text", "Save it as UTF-8 JSON or YAML.") from None
    try:
        if path.endswith((".yaml", ".yml")):
            return yaml.safe_load(text)
        return json.loads(text)
    except (ValueError, yaml.YAMLError) as error:
        detail = " ".join(str(error).split())[:200]
        raise fail(
            f"is not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'} ({detail})",
            "Fix the syntax (a .yaml / .yml file is read as YAML, any other as JSON).",
        ) from None


def _row(name: str, entry: Any, base: Catalog, path: str) -> ModelInfo:
    if not isinstance(entry, dict):
        raise _Bad(
            name,
            f"is {type(entry).__name__}, not a mapping of fields",
            f"Give fields such as price, status: {', '.join(sorted(_ENTRY_KEYS))}.",
        )
    unknown = sorted(set(map(str, entry)) - _ENTRY_KEYS)
    if unknown:
        raise _Bad(
            f"{name}.{unknown[0]}",
            "is not a field of an entry",
            f"Use only {', '.join(sorted(_ENTRY_KEYS))}.",
        )
    source = Source(
        OPERATOR, _text(entry, "source", name) if "source" in entry else f"{ENV} {path}"
    )
    known = base.find(name)
    if "like" in entry:
        like = _text(entry, "like", name)
        template = base.find(like) if like else None
        if template is None:
            raise _Bad(
                f"{name}.like",
                f"names {like!r}, which is not in the catalogue",
                "Name a known model whose request rules the new one shares.",
            )
        known = replace(
            template,
            id=name,
            aliases=(),
            fal_slug=None,
            status="current",
            replacement=None,
            status_date=None,
        )
    sources: dict[str, Source] = dict(known.sources) if known is not None else {}
    if "like" in entry or known is None:
        sources["status"] = Source(OPERATOR, f"added by {ENV} {path}")
    if known is None:
        known = ModelInfo(
            id=name, vendor=name.split("/", 1)[0] if "/" in name else "anthropic"
        )
    changes: dict[str, Any] = {}
    if "price" in entry:
        old = None if "like" in entry else known.price  # a new model's price is its own
        changes["price"] = _price(name, entry["price"], old, sources, source)
    elif known.price is None and entry.get("status", known.status) != "retired":
        raise _Bad(
            name,
            "has no price",
            "Give price: {input: ..., output: ...} in USD per million tokens.",
        )
    changes.update(_fields(name, entry, source, sources))
    return replace(known, **changes, sources=sources)


def _fields(
    name: str, entry: dict[str, Any], source: Source, sources: dict[str, Source]
) -> dict[str, Any]:
    """The entry's fields other than the price, each with the operator's source."""
    changes: dict[str, Any] = {}
    if "status" in entry:
        status = entry["status"]
        if status not in _STATUSES:
            raise _Bad(
                f"{name}.status",
                f"is {status!r}",
                f"Use one of {', '.join(_STATUSES)}.",
            )
        changes["status"], sources["status"] = status, source
    for key in ("status_date", "replacement", "fal_slug"):
        if key in entry:
            changes[key], sources[key] = _text(entry, key, name), source
    for key in ("max_output_tokens", "context_window"):
        if key in entry:
            changes[key], sources[key] = _count(f"{name}.{key}", entry[key]), source
    if "on_demand_compaction" in entry:
        value = entry["on_demand_compaction"]
        if not isinstance(value, bool):
            raise _Bad(
                f"{name}.on_demand_compaction",
                f"is {value!r}, not true or false",
                "Write on_demand_compaction: true when GET /v1/models says "
                "capabilities.compaction.summarize.supported.",
            )
        changes["on_demand_compaction"], sources["on_demand_compaction"] = value, source
    if "aliases" in entry:
        aliases = entry["aliases"]
        if not isinstance(aliases, list) or not all(
            isinstance(a, str) and a for a in aliases
        ):
            raise _Bad(
                f"{name}.aliases",
                "is not a list of ids",
                'Write aliases: ["claude-next-20261201"].',
            )
        changes["aliases"] = tuple(aliases)
    return changes


def _price(
    name: str,
    raw: Any,
    old: ModelPrice | None,
    sources: dict[str, Source],
    source: Source,
) -> ModelPrice:
    values = _numbers(f"{name}.price", raw, _PRICE_KEYS)
    tier_raw = raw.get("above")
    if old is None:
        for key in ("input", "output"):
            if key not in values:
                raise _Bad(
                    f"{name}.price.{key}",
                    "is missing (a new model)",
                    "Give at least input and output in USD per million tokens.",
                )
    merged: dict[str, float | None] = {
        key: getattr(old, key) if old is not None else None for key in PRICE_FIELDS
    }
    for key in PRICE_FIELDS:
        if key in values:
            merged[key], sources[f"price.{key}"] = values[key], source
        elif old is None:  # a new model without this cache price: Anthropic's rule
            merged[key] = round(float(merged["input"] or 0) * _RULE[key], 10)
            sources[f"price.{key}"] = Source(
                DERIVED, f"{_RULE[key]:g}x input (Anthropic's rule)"
            )
    price = ModelPrice(
        float(merged["input"] or 0),
        float(merged["output"] or 0),
        float(merged["cache_read"] or 0),
        float(merged["cache_write"] or 0),
        merged["cache_write_1h"],
        old.above if old is not None else None,
    )
    if tier_raw is not None:
        tier = _numbers(f"{name}.price.above", tier_raw, _TIER_KEYS)
        if (
            "tokens" not in tier
            or tier["tokens"] < 1
            or tier["tokens"] != int(tier["tokens"])
        ):
            raise _Bad(
                f"{name}.price.above.tokens",
                "is missing or not a whole number of tokens >= 1",
                "Give the prompt size above which the tier applies, e.g. tokens: 200000.",
            )
        base = old.above.price if old is not None and old.above is not None else price
        parts = {
            key: tier.get(
                key, getattr(base, key) if key != "cache_write_1h" else base.write_1h
            )
            for key in PRICE_FIELDS
        }
        for key in tier:
            sources[f"price.above.{key}"] = source
        amounts = [float(parts[key] or 0) for key in PRICE_FIELDS]
        tier_price = ModelPrice(
            amounts[0], amounts[1], amounts[2], amounts[3], amounts[4]
        )
        price = replace(price, above=PriceTier(int(tier["tokens"]), tier_price))
    return price


def _numbers(where: str, raw: Any, allowed: set[str]) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise _Bad(
            where,
            f"is {type(raw).__name__}, not a mapping",
            "Write it as {input: 3, output: 15, ...} in USD per million tokens.",
        )
    unknown = sorted(set(map(str, raw)) - allowed)
    if unknown:
        raise _Bad(
            f"{where}.{unknown[0]}",
            "is not a price field",
            f"Use only {', '.join(sorted(allowed))}.",
        )
    found = {}
    for key, value in raw.items():
        if key == "above":
            continue
        found[str(key)] = _amount(f"{where}.{key}", value)
    return found


def _amount(where: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        shown = (
            repr(value) if not isinstance(value, str) else f"the text {value[:40]!r}"
        )
        raise _Bad(
            where,
            f"is {shown}, not a price",
            "Give a finite number >= 0 (USD per million tokens, or a token count).",
        )
    if value > 1e9:
        raise _Bad(
            where,
            f"is {value:g}, more than 1e9",
            "Give USD per million tokens (e.g. 3 for $3 / MTok).",
        )
    return float(value)


def _count(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Bad(
            where,
            f"is {value!r}, not a whole number of tokens >= 1",
            "Give a token count, e.g. 128000.",
        )
    return value


def _text(entry: dict[str, Any], key: str, name: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > 500:
        raise _Bad(
            f"{name}.{key}",
            f"is {type(value).__name__}, not a text of 1 to 500 characters",
            f"Write {key}: as a quoted text.",
        )
    return value.strip()
