"""The fault suite's model in the worker: `providers.from_env()` (the simulator over real HTTP), wrapped.

Loaded by the worker as TOOLLOOP_PROMPT_GEN="faults.model:make". The wrapper records one `model`
effect line per call (faults.toolset.record) and holds two kill points (workers/testing/killpoints.py):

    model:request   the simulator has received the request (it writes `arrived/<tag>` and holds its
                    answer), the worker dies while waiting for the answer: a model call in flight
    model:answered  the answer came back, the worker dies before the loop sees it (before the commit)

and two stop points (a SIGSTOP: tests/faults/test_lease_freeze.py, test_lease_pause.py):

    model:send      just before the call is handed to the provider, whose HTTP path checks the
                    signal right before it sends
    model:inflight  the simulator has received the request (it writes `arrived/<tag>` and holds its
                    answer): the worker is paused while the call it sent is in flight

A model call is known by `<run tag>#<turn>`, turn = the assistant messages of its history (as the
simulator counts turns), so the test process can tell the calls of each run apart.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from faults.shapes import first_text, run_tag
from faults.toolset import record
from toolloop.abort import AbortSignal
from toolloop.contract import AssistantMessage, PromptGenRequest, PromptGenResult
from workers.testing.killpoints import kill_point, pending, stop_point


def exec_tag(request: PromptGenRequest) -> str:
    messages = request.messages or []
    tag = run_tag(first_text(messages)) or "?"
    turns = sum(1 for message in messages if isinstance(message, AssistantMessage))
    return f"{tag}#{turns}"


def arrived_path(directory: str, tag: str) -> str:
    return os.path.join(directory, "arrived", tag.replace("#", "_"))


def _prompt_gen() -> Any:
    """`from_env()`; with TOOLLOOP_FAULTS_TIMEOUT set, an anthropic-only PromptGen whose HTTP timeout
    is that many seconds and whose retries back off fast (so timeouts are testable in seconds)."""
    from toolloop.providers import PromptGen, from_env
    from toolloop.providers.anthropic import AnthropicHandler
    from toolloop.providers.retry import RetryPolicy

    timeout = os.environ.get("TOOLLOOP_FAULTS_TIMEOUT")
    if not timeout:
        return from_env()
    retry = RetryPolicy(base_delay_s=0.05, max_delay_s=0.5, short_retry_after_s=2.0)
    handler = AnthropicHandler(
        os.environ.get("ANTHROPIC_API_KEY"),
        base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        timeout_s=float(timeout),
        retry=retry,
    )
    return PromptGen({"anthropic": handler}, "anthropic")


async def _arrived(directory: str, tag: str, call: asyncio.Future[Any]) -> None:
    """Until the simulator has the call `tag` (or the call ended, or 10 s passed)."""
    deadline = time.monotonic() + 10.0
    while not os.path.exists(arrived_path(directory, tag)) and not call.done():
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)


def make() -> Any:
    prompt_gen = _prompt_gen()
    directory = os.environ.get("TOOLLOOP_FAULTS_DIR", "")

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        tag = exec_tag(request)
        record("model", tag)
        stop_point("model:send", tag=tag)
        call = asyncio.ensure_future(prompt_gen.generate(request, signal=signal))
        if directory and pending("model:request", tag=tag):
            await _arrived(directory, tag, call)
            kill_point("model:request", tag=tag)
        if directory and pending("model:inflight", tag=tag):
            await _arrived(directory, tag, call)
            stop_point("model:inflight", tag=tag)
        result: PromptGenResult = await call
        kill_point("model:answered", tag=tag)
        return result

    return generate


def make_fallback() -> Any:
    """An anthropic + fal PromptGen over the simulator, for the fallback test: fal serves the run's
    Anthropic model id under its router slug, from the same catalogue (see docs/faults.md)."""
    from toolloop.providers import AnthropicHandler, FalHandler, PromptGen

    handlers = {
        "anthropic": AnthropicHandler(
            os.environ.get("ANTHROPIC_API_KEY"),
            base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        ),
        "fal": FalHandler(
            os.environ.get("FAL_KEY"),
            run_url=os.environ.get("FAL_RUN_URL"),
        ),
    }
    return PromptGen(handlers, "anthropic")
