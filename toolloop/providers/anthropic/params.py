"""The top-level parameters of a Messages API body, shaped from the model's catalogue row.

Invariant: `thinking` and `output_config` depend only on the model and the run's `reasoning`, never
on the turn, so every step of a run sends the same thinking setting (a change of thinking parameters
between calls would invalidate the messages part of the prompt cache, and an always-on model refuses
`disabled`). The shapes (anthropic SDK 2.14 `ThinkingConfigParam`, `OutputConfigParam`):

    reasoning   model accepts ...              sent
    None        anything                       nothing (the model's default)
    "off"       "disabled"                     thinking {"type": "disabled"}
    "off"       adaptive only (always on)      thinking adaptive + effort "low" (the least it allows)
    level       "adaptive"                     thinking adaptive + output_config {"effort": level}
    level       "enabled" (Haiku 4.5, Opus 4.5) thinking enabled + budget_tokens 2,048 / 8,192 / 24,576
    any         none known (empty set)         nothing
With thinking sent on (adaptive or enabled), `max_tokens` grows by the level's budget so thinking
does not eat the answer's room; `max_tokens` never exceeds the model's `max_output_tokens` when the
catalogue knows it.

Forced tool choice (`"required"` -> `any`, `{"name"}` -> `tool`) is sent only to a model that accepts
it and only with thinking off (the API refuses forced tool use while thinking); otherwise `auto` is
sent and the answer's `meta["request_notes"]` says so. `temperature` is never sent: the SDK's
`MessageCreateParams` (API version 2026-10-21) has no such field, and several current models refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolloop.contract import PromptGenRequest, ToolChoiceName
from toolloop.errors import PromptGenError
from toolloop.providers.catalog import ModelInfo
from toolloop.providers.common import Reasoning, max_tokens_of

THINKING_BUDGET: Mapping[Reasoning, int] = {"low": 2048, "medium": 8192, "high": 24576}
DEFAULT_MAX_TOKENS = 8192
MIN_BUDGET = 1024


def thinking_of(
    info: ModelInfo, reasoning: Reasoning | None
) -> tuple[dict[str, Any], list[str]]:
    """The `thinking` / `output_config` fields for this model and reasoning, and notes on choices
    the model forced (e.g. thinking that cannot be switched off)."""
    accepted = info.thinking
    if reasoning is None:
        return {}, []
    if reasoning == "off":
        if "disabled" in accepted:
            return {"thinking": {"type": "disabled"}}, []
        if "adaptive" in accepted:
            note = f"{info.id} always thinks: reasoning 'off' sent as adaptive thinking at effort 'low'"
            return {
                "thinking": {"type": "adaptive"},
                "output_config": {"effort": "low"},
            }, [note]
        return {}, []
    if "adaptive" in accepted:
        return {
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": reasoning},
        }, []
    if "enabled" in accepted:
        return {
            "thinking": {"type": "enabled", "budget_tokens": THINKING_BUDGET[reasoning]}
        }, []
    return {}, [
        f"{info.id} has no known thinking parameter: reasoning {reasoning!r} not sent"
    ]


def thinks(info: ModelInfo, fields: Mapping[str, Any]) -> bool:
    """Whether a request with these fields has the model thinking."""
    sent = fields.get("thinking")
    if sent is None:
        return info.always_thinks
    return bool(sent.get("type") != "disabled")


def top_level(
    request: PromptGenRequest, info: ModelInfo, reasoning: Reasoning | None
) -> tuple[dict[str, Any], list[str]]:
    """`max_tokens`, `thinking`, `output_config` and `tool_choice` of the body, and the notes."""
    fields, notes = thinking_of(info, reasoning)
    answer = max_tokens_of(request, DEFAULT_MAX_TOKENS)
    level: Reasoning = "low" if reasoning in (None, "off") else reasoning
    room = THINKING_BUDGET[level] if fields and thinks(info, fields) else 0
    max_tokens = answer + room
    cap = info.max_output_tokens
    if cap is not None and max_tokens > cap:
        notes.append(
            f"max_tokens {max_tokens} cut to {info.id}'s maximum output of {cap}"
        )
        max_tokens = cap
    thinking = fields.get("thinking")
    if thinking is not None and thinking["type"] == "enabled":
        budget = min(thinking["budget_tokens"], max_tokens - MIN_BUDGET)
        if budget < MIN_BUDGET:
            raise PromptGenError(
                f"anthropic: max_tokens {max_tokens} leaves no room for {info.id}'s thinking budget "
                f"(at least {MIN_BUDGET} tokens, less than max_tokens).\n"
                f"  Raise params.max_tokens to at least {2 * MIN_BUDGET}, or set reasoning to None."
            )
        fields["thinking"] = {"type": "enabled", "budget_tokens": budget}
    out: dict[str, Any] = {"max_tokens": max_tokens, **fields}
    choice = request.tool_choice
    if choice is not None:
        forced = choice == "required" or isinstance(choice, ToolChoiceName)
        if forced and not info.forced_tool_choice:
            notes.append(f"{info.id} refuses a forced tool_choice: sent 'auto'")
            out["tool_choice"] = {"type": "auto"}
        elif forced and thinks(info, fields):
            notes.append(
                "a forced tool_choice is refused while the model thinks: sent 'auto'"
            )
            out["tool_choice"] = {"type": "auto"}
        elif isinstance(choice, ToolChoiceName):
            out["tool_choice"] = {"type": "tool", "name": choice.name}
        else:
            out["tool_choice"] = {
                "type": {"auto": "auto", "none": "none", "required": "any"}[str(choice)]
            }
    return out, notes
