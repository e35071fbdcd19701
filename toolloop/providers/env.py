"""`from_env()`: a `PromptGen` configured from environment variables.

    ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL   anthropic (base URL default https://api.anthropic.com)
    FAL_KEY, FAL_RUN_URL                    fal (run URL default https://fal.run)
    OPENAI_API_KEY, OPENAI_BASE_URL         openai (one-turn prompts)
    (PATH)                                  codex, claude: the local CLIs (one-turn prompts)
    TOOLLOOP_PROVIDER                       default provider, default "anthropic"
    TOOLLOOP_FALLBACK                       fallback providers, a comma list (default none)
    TOOLLOOP_MODELS                         an operator file laid over the catalogue (models_file.py)
A missing key is not an error here: that provider's calls raise unavailable "auth", so a fallback
moves on. Blank values count as unset. `catalog` (default `catalog_from_env(env)`: `default_catalog()`
with the TOOLLOOP_MODELS file laid over it; a bad file raises ModelsFileError) and `prices` are
given to every handler: `from_env(catalog=default_catalog().with_models(ModelInfo(...)))` adds or
overrides models for the whole chain. `http_client` (default: each handler's own) is the HTTP client
of every HTTP provider: a worker passes one `KeepAliveClient` for its long-lived loop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from toolloop.http import HttpClient
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.base import PromptGenHandler
from toolloop.providers.catalog import Catalog, ModelPrice
from toolloop.providers.facade import PromptGen
from toolloop.providers.fal import FalHandler
from toolloop.providers.models_file import catalog_from_env
from toolloop.providers.oneturn import ClaudeHandler, CodexHandler, OpenAIHandler

PROVIDERS = ("anthropic", "fal", "openai", "codex", "claude")
"""The names `from_env` registers, in order, whatever the environment (a validation that needs only
the names reads this, not a `from_env()` that builds every handler and catalog)."""


def from_env(
    env: Mapping[str, str] | None = None,
    *,
    catalog: Catalog | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
    http_client: HttpClient | None = None,
) -> PromptGen:
    """Every provider, registered from `env` (default `os.environ`), shaping and pricing requests
    from `catalog` (default: the catalogue in force, `default_catalog()` with the operator file
    TOOLLOOP_MODELS names laid over it) with `prices` laid over it."""
    env = os.environ if env is None else env
    catalog = (catalog or catalog_from_env(env)).with_prices(prices or {})

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    handlers: dict[str, PromptGenHandler] = {
        "anthropic": AnthropicHandler(
            get("ANTHROPIC_API_KEY"),
            base_url=get("ANTHROPIC_BASE_URL"),
            catalog=catalog,
            http_client=http_client,
        ),
        "fal": FalHandler(
            get("FAL_KEY"),
            run_url=get("FAL_RUN_URL"),
            catalog=catalog,
            http_client=http_client,
        ),
        "openai": OpenAIHandler(
            get("OPENAI_API_KEY"),
            base_url=get("OPENAI_BASE_URL") or "https://api.openai.com",
            catalog=catalog,
            http_client=http_client,
        ),
        "codex": CodexHandler(),
        "claude": ClaudeHandler(),
    }
    assert tuple(handlers) == PROVIDERS
    fallback = [
        name.strip()
        for name in (get("TOOLLOOP_FALLBACK") or "").split(",")
        if name.strip()
    ]
    return PromptGen(handlers, get("TOOLLOOP_PROVIDER") or "anthropic", fallback)
