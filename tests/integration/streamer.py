"""A model that streams its answer word by word at a fixed rate, for the streaming tests' workers
(TOOLLOOP_PROMPT_GEN="tests.integration.streamer:make"). TOOLLOOP_TEST_STREAM_WORDS words (default
60), one every TOOLLOOP_TEST_STREAM_MS ms (default 10). The first turn of a run that has the `add`
tool calls it; the next answers in text. Each word's send time goes to TOOLLOOP_TEST_STREAM_LOG
when set (one JSON line per call: the first word's time.time()). A run whose first user message
says "redo" begins its first answer again after 10 words (a discard delta, as a provider's retry
sends), and says "think" streams two words of reasoning text first."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from toolloop.abort import AbortSignal
from toolloop.contract import (
    AssistantMessage,
    DeltaEvent,
    OnDelta,
    PromptGenRequest,
    PromptGenResult,
    PromptGenUsage,
    ToolCall,
)


def worker_env(words: int, word_ms: int, **more: str) -> dict[str, str]:
    """The environment of a worker whose model is this one: `words` words, one every `word_ms` ms."""
    return {
        "TOOLLOOP_PROMPT_GEN": "tests.integration.streamer:make",
        "TOOLLOOP_TEST_STREAM_WORDS": str(words),
        "TOOLLOOP_TEST_STREAM_MS": str(word_ms),
        **more,
    }


def answer_words(turn: int, count: int | None = None) -> list[str]:
    count = (
        int(os.environ.get("TOOLLOOP_TEST_STREAM_WORDS", "60"))
        if count is None
        else count
    )
    return [f"t{turn}w{i} " for i in range(count)]


def make() -> Any:
    pause = float(os.environ.get("TOOLLOOP_TEST_STREAM_MS", "10")) / 1000
    log = os.environ.get("TOOLLOOP_TEST_STREAM_LOG")

    async def generate(
        request: PromptGenRequest, signal: AbortSignal, on_delta: OnDelta | None = None
    ) -> PromptGenResult:
        turn = 1 + sum(
            1 for m in request.messages or [] if isinstance(m, AssistantMessage)
        )
        words = answer_words(turn)
        said = str(getattr((request.messages or [None])[0], "content", ""))
        if on_delta is not None and "think" in said:
            for piece in ("let me ", "see "):
                on_delta(DeltaEvent(text=piece, thinking=True))
        if on_delta is not None and "redo" in said and turn == 1:
            for word in [f"old{i} " for i in range(10)]:
                on_delta(DeltaEvent(text=word))
                await asyncio.sleep(pause)
            on_delta(DeltaEvent(discard=True))
        for index, word in enumerate(words):
            signal.throw_if_aborted()
            if index:
                await asyncio.sleep(pause)
            if on_delta is not None:
                if index == 0 and log:
                    with open(log, "a", encoding="utf-8") as out:
                        out.write(
                            json.dumps({"turn": turn, "sent": time.time()}) + "\n"
                        )
                on_delta(DeltaEvent(text=word))
        calls = []
        if turn == 1 and any(tool.name == "add" for tool in request.tools or []):
            calls = [ToolCall(id="call-1", name="add", input={"a": 20, "b": 22})]
        usage = PromptGenUsage(prompt_tokens=10, completion_tokens=len(words))
        return PromptGenResult(
            text="".join(words), tool_calls=calls, usage=usage, cost_usd=0.0001
        )

    return generate
