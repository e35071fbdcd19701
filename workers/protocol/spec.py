"""`RunSpec`: what a web backend asks a durable run to do. Stored as JSON in `tl:{run}:spec`.

Every field is validated at enqueue (a bad spec raises `pydantic.ValidationError` and nothing is
enqueued); the toolset is a NAME the operator registered (workers/config/toolsets.py), checked at enqueue
against the registered names without importing anything. The spec holds no secrets: provider keys
come from the worker's environment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolloop.contract import ChatMessage
from toolloop.loop.context import ContextPolicy
from toolloop.providers.env import PROVIDERS

Reasoning = Literal["off", "low", "medium", "high"]
CacheMode = Literal["off", "system", "conversation"]
CacheTtl = Literal["5m", "1h"]


def provider_names() -> list[str]:
    """The provider names a run may ask for: those `toolloop.providers.from_env()` registers on the
    workers. Anything else is refused at enqueue, not at the run's first model call. (A constant:
    building every provider to read their names cost ~1-2 ms per validation.)"""
    return list(PROVIDERS)


class RunSpec(BaseModel):
    """A durable run: the arguments of `run_tool_loop` minus the code (the toolset is a name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    system: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    toolset: str | None = Field(default=None, min_length=1, max_length=200)
    """The name of a registered toolset (TOOLLOOP_TOOLSETS on the workers), e.g. "review"."""
    # inf would be stored as null
    budget_usd: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    finish_at: float = Field(default=1.0, gt=0, le=1)
    max_steps: int = Field(default=20, ge=1)
    reasoning: Reasoning | None = None
    finish_note: str | None = None
    keep_images: int | None = Field(default=2, ge=0)
    """How many of the latest tool-result images the model still sees (None: all)."""
    cache: CacheMode = "conversation"
    cache_ttl: CacheTtl = "5m"
    """TTL of every cache mark: "1h" writes cost 2x input instead of 1.25x and live an hour."""
    provider: str | None = None
    """The provider to ask first (None: the worker's default); `fallback` lists the next ones."""
    fallback: list[str] = Field(default_factory=list)
    account: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[^{}:*\s]+$"
    )
    """A shared budget account (docs/flow-control.md): every model call and tool of the run reserves
    its estimate from it first; near its limit the run finishes, past it the run stops `budget`."""
    ask_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """How long a held ask waits; then the run goes on with `ask_default`, or stops "expired"."""
    ask_default: str | None = None
    """The answer an ask gets when its deadline passes (None: the run stops, `stopped_by="expired"`)."""
    stream: bool = False
    """Publish the model's text to the run's event stream as it arrives (`delta` entries, batched
    every 50 ms; docs/streaming.md). Off: the model is called without streaming."""
    context: ContextPolicy | None = None
    """Context management of a long run (docs/context.md): compaction and tool-result clearing
    thresholds; None (the default) changes nothing."""
    approval_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """How long a held approval waits (a tool's own `approval_timeout_s` wins); then the tool's
    `approval_default` applies (`reject` with the reason `no decision before the deadline`)."""

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, name: str | None) -> str | None:
        if name is not None and name not in (known := provider_names()):
            raise ValueError(
                f"{name!r} is not a provider; use one of {', '.join(known)}"
            )
        return name

    @field_validator("fallback")
    @classmethod
    def _known_fallbacks(cls, names: list[str]) -> list[str]:
        for name in names:
            cls._known_provider(name)
        return names
