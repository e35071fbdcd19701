"""Helpers of the provider tests: a recording `httpx.MockTransport` and Anthropic SDK validation."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from typing import Any

import anthropic.types as sdk
import httpx
from pydantic import ConfigDict, TypeAdapter

from toolloop.providers import RetryPolicy

FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05, total_s=5.0, short_retry_after_s=0.5)
FAKE_KEY = "sk-test-FAKE-KEY-0123456789abcdef"

Answer = httpx.Response | dict[str, Any] | Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport that answers from a list (the last answer repeats) and keeps every request."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if callable(answer):
            return answer(request)
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(200, json=answer)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]


_FORBID = ConfigDict(extra="forbid")
_PARAMS: TypeAdapter[Any] = TypeAdapter(sdk.MessageCreateParams, config=_FORBID)
_BLOCK_TYPES: dict[str, Any] = {
    "text": sdk.TextBlockParam,
    "image": sdk.ImageBlockParam,
    "tool_use": sdk.ToolUseBlockParam,
    "tool_result": sdk.ToolResultBlockParam,
    "thinking": sdk.ThinkingBlockParam,
    "redacted_thinking": sdk.RedactedThinkingBlockParam,
}
_CHOICE: TypeAdapter[Any] = TypeAdapter(sdk.ToolChoiceParam)
_THINKING: TypeAdapter[Any] = TypeAdapter(sdk.ThinkingConfigParam)


@functools.cache
def _adapter(typed_dict: Any) -> TypeAdapter[Any]:
    # Kept alive: a lazily validated Iterable must not outlive its adapter (pydantic-core panics).
    return TypeAdapter(typed_dict)


def _strict(typed_dict: Any, value: dict[str, Any]) -> None:
    """Validate `value` as the SDK TypedDict and refuse keys it does not declare."""
    _consume(_adapter(typed_dict).validate_python(value))
    known = typed_dict.__required_keys__ | typed_dict.__optional_keys__
    assert set(value) <= known, f"{typed_dict.__name__} has no key {set(value) - known}"


def _consume(value: Any) -> Any:
    """Walk what pydantic validated lazily (the SDK types use Iterable) so every item is checked."""
    if isinstance(value, dict):
        return {k: _consume(v) for k, v in value.items()}
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, Iterable):
        return [_consume(v) for v in value]
    return value


def validate_anthropic_body(body: dict[str, Any]) -> None:
    """Raise unless `body` is a valid `MessageCreateParams` of the official SDK, every nested block
    included and no unknown key anywhere."""
    _consume(_PARAMS.validate_python(body))
    system = body.get("system")
    if isinstance(system, list):
        for block in system:
            _strict(sdk.TextBlockParam, block)
    for tool in body.get("tools", []):
        _strict(sdk.ToolParam, tool)
    if "tool_choice" in body:
        _CHOICE.validate_python(body["tool_choice"])
    if "thinking" in body:
        _THINKING.validate_python(body["thinking"])
    for turn in body["messages"]:
        assert set(turn) == {"role", "content"}, turn
        content = turn["content"]
        if isinstance(content, str):
            continue
        for block in content:
            _strict(_BLOCK_TYPES[block["type"]], block)
            for inner in block.get("content", []) if block["type"] == "tool_result" else []:
                _strict(_BLOCK_TYPES[inner["type"]], inner)


def sdk_message(
    content: list[Any],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 100,
    output_tokens: int = 20,
    cache_read: int | None = None,
    cache_write: int | None = None,
    model: str = "claude-sonnet-4-5",
) -> dict[str, Any]:
    """An answer built with the SDK's own response model, as JSON."""
    message = sdk.Message(
        id="msg_1",
        type="message",
        role="assistant",
        model=model,
        content=content,
        stop_reason=stop_reason,  # type: ignore[arg-type]
        stop_sequence=None,
        usage=sdk.Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_input_tokens=cache_read,
            cache_creation_input_tokens=cache_write,
        ),
    )
    return message.model_dump(mode="json")
