"""The model of a worker whose simulator runs on a scaled clock (`SimServer(time_scale=SCALE)`):
TOOLLOOP_PROMPT_GEN="tests.integration.scaled_model:prompt_gen". The anthropic handler's timeouts
are the SDK's rule on the same clock (`Timeouts().scaled(SCALE)`: 600 s take 6 s), so a call
decides to stream and waits exactly as it would against a real model taking minutes.
TOOLLOOP_TEST_MAX_TOKENS, when set, is every request's `max_tokens` (an operator's long answers).
"""

from __future__ import annotations

import os

from toolloop.abort import AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.http import client_from_env
from toolloop.providers import AnthropicHandler, PromptGen
from toolloop.providers.timeouts import Timeouts

SCALE = 0.01


class LongAnswers(AnthropicHandler):
    """The anthropic handler, every request with TOOLLOOP_TEST_MAX_TOKENS as its max_tokens."""

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        room = os.environ.get("TOOLLOOP_TEST_MAX_TOKENS", "").strip()
        if room:
            request = request.model_copy(
                update={"params": {**(request.params or {}), "max_tokens": int(room)}}
            )
        return await super().execute(request, signal, on_delta)


def prompt_gen() -> PromptGen:
    handler = LongAnswers(
        os.environ["ANTHROPIC_API_KEY"],
        base_url=os.environ["ANTHROPIC_BASE_URL"],
        http_client=client_from_env(),
        timeouts=Timeouts().scaled(SCALE),
    )
    return PromptGen({"anthropic": handler}, "anthropic")
