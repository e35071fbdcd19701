"""Helpers of the provider tests: a recording `httpx.MockTransport` and Anthropic SDK validation."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic.types as sdk
import httpx

from toolloop.providers import RetryPolicy
from toolloop.sim.sdk_check import sdk_validator

FAST = RetryPolicy(
    attempts=3,
    base_delay_s=0.01,
    max_delay_s=0.05,
    total_s=5.0,
    short_retry_after_s=0.5,
)
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


def validate_anthropic_body(body: dict[str, Any]) -> None:
    """Raise unless `body` is a valid `MessageCreateParams` of the official SDK, every nested block
    included and no unknown key anywhere (the simulator's strict-mode check)."""
    validate = sdk_validator()
    assert validate is not None, "the anthropic SDK (a dev dependency) is not installed"
    validate(body)


def sdk_message(
    content: list[Any],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 100,
    output_tokens: int = 20,
    cache_read: int | None = None,
    cache_write: int | None = None,
    model: str = "claude-sonnet-4-6",
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
