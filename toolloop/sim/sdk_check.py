"""Strict mode: every Anthropic request body is validated against the official `anthropic` SDK's
request types (`MessageCreateParamsNonStreaming`, or `MessageCreateParamsStreaming` for a body with
`"stream": true`, and each nested TypedDict), no unknown key anywhere.

The SDK is a dev dependency only. `sdk_validator()` returns None when it is not installed; the
simulator then serves without the check and says so in a warning and in `stats()["strict"]`.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

Validator = Callable[[dict[str, Any]], None]


class SdkValidationError(ValueError):
    """The body is not a valid `MessageCreateParams` (answered 400 invalid_request_error)."""


def sdk_available() -> bool:
    return importlib.util.find_spec("anthropic") is not None


@functools.cache
def sdk_validator() -> Validator | None:
    """The validator (built once: pydantic schemas are slow to build), or None without the SDK. A
    body with `"stream": true` is checked against `MessageCreateParamsStreaming`, any other against
    `MessageCreateParamsNonStreaming` (`stream` absent or false)."""
    if not sdk_available():
        return None
    return _Checker()


class _Checker:
    """The SDK's request types as pydantic adapters, and the walk of a body through them."""

    def __init__(self) -> None:
        import anthropic.types as sdk  # the SDK is a dev dependency: a strict simulator only
        from anthropic.types import message_create_params as params  # (as above)

        forbid = ConfigDict(extra="forbid")  # a config is taken by a union only: hence the `| None`
        streaming: Any = params.MessageCreateParamsStreaming | None
        whole: Any = params.MessageCreateParamsNonStreaming | None
        self.streaming: TypeAdapter[Any] = TypeAdapter(streaming, config=forbid)
        self.whole: TypeAdapter[Any] = TypeAdapter(whole, config=forbid)
        self.sdk = sdk
        self.blocks: dict[str, Any] = {
            "text": sdk.TextBlockParam,
            "image": sdk.ImageBlockParam,
            "tool_use": sdk.ToolUseBlockParam,
            "tool_result": sdk.ToolResultBlockParam,
            "thinking": sdk.ThinkingBlockParam,
            "redacted_thinking": sdk.RedactedThinkingBlockParam,
        }
        self.thinking: dict[str, Any] = {
            "adaptive": sdk.ThinkingConfigAdaptiveParam,
            "enabled": sdk.ThinkingConfigEnabledParam,
            "disabled": sdk.ThinkingConfigDisabledParam,
        }
        self.choices: dict[str, Any] = {
            "auto": sdk.ToolChoiceAutoParam,
            "any": sdk.ToolChoiceAnyParam,
            "tool": sdk.ToolChoiceToolParam,
            "none": sdk.ToolChoiceNoneParam,
        }
        self.adapters: dict[Any, TypeAdapter[Any]] = {}

    def __call__(self, body: dict[str, Any]) -> None:
        try:
            self.top_level(body)
            for index, turn in enumerate(body["messages"]):
                self.message(index, turn)
            params = self.streaming if body.get("stream") is True else self.whole
            _consume(params.validate_python(body))  # after the blocks: their errors name the field
        except ValidationError as error:
            raise SdkValidationError(_message(error, "")) from None
        except (AttributeError, KeyError, TypeError) as error:
            raise SdkValidationError(f"The body does not have the SDK's shape: {error!r}") from None

    def top_level(self, body: dict[str, Any]) -> None:
        sdk = self.sdk
        for index, block in enumerate(body["system"] if isinstance(body.get("system"), list) else []):
            self.strict(sdk.TextBlockParam, block, f"system.{index}")
        for index, tool in enumerate(body.get("tools") or []):
            self.strict(sdk.ToolParam, tool, f"tools.{index}")
        if isinstance(body.get("tool_choice"), dict):
            self.strict(self.choices.get(body["tool_choice"].get("type")), body["tool_choice"], "tool_choice")
        if isinstance(body.get("thinking"), dict):
            self.strict(self.thinking.get(body["thinking"].get("type")), body["thinking"], "thinking")
        if isinstance(body.get("output_config"), dict):
            self.strict(sdk.OutputConfigParam, body["output_config"], "output_config")

    def message(self, index: int, turn: dict[str, Any]) -> None:
        extra = sorted(set(turn) - {"role", "content"})
        if extra:
            raise SdkValidationError(f"messages.{index}.{extra[0]}: Extra inputs are not permitted")
        content = turn["content"]
        for position, block in enumerate([] if isinstance(content, str) else content):
            where = f"messages.{index}.content.{position}"
            self.strict(self.blocks.get(block.get("type")), block, where)
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for number, part in enumerate(inner if isinstance(inner, list) else []):
                self.strict(self.blocks.get(part.get("type")), part, f"{where}.content.{number}")

    def strict(self, typed_dict: Any, value: Any, where: str) -> None:
        if typed_dict is None:
            raise SdkValidationError(f"{where}: unknown type {value.get('type')!r}")
        adapter = self.adapters.get(typed_dict)
        if adapter is None:  # kept alive: a lazily validated Iterable must not outlive its adapter
            adapter = self.adapters[typed_dict] = TypeAdapter(typed_dict)
        try:
            _consume(adapter.validate_python(value))
        except ValidationError as error:
            raise SdkValidationError(_message(error, where)) from None
        known = typed_dict.__required_keys__ | typed_dict.__optional_keys__
        extra = sorted(set(value) - known)
        if extra:
            raise SdkValidationError(f"{where}.{extra[0]}: Extra inputs are not permitted")


def _message(error: Any, where: str) -> str:
    """The first error of a pydantic `ValidationError`, at its place in the body."""
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"] if not str(part)[:1].isupper()]  # union arm names
    place = ".".join([where, *loc] if where else loc)
    return f"{place}: {first['msg']} (anthropic SDK request types)"


def _consume(value: Any) -> Any:
    """Walk what pydantic validated lazily (the SDK types use Iterable) so every item is checked."""
    if isinstance(value, dict):
        return {k: _consume(v) for k, v in value.items()}
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, Iterable):
        return [_consume(v) for v in value]
    return value
