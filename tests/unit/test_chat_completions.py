"""One chat-completions parser (toolloop/providers/chat_completions.py) behind both of its callers:
the same answers, sent to the fal handler and to the openai handler over httpx.MockTransport, give
the same result (text, tool calls, finish, usage, cost, reasoning, meta) or the same error, but for
the provider's name. Each caller's own figures stay pinned in test_providers_fal.py and
test_providers_oneturn.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from providers_kit import FAKE_KEY, FAST, Recorder

from toolloop import (
    AbortController,
    PromptGenError,
    PromptGenRequest,
    PromptGenResult,
    ToolArgumentsError,
)
from toolloop.providers import FalHandler, OpenAIHandler
from toolloop.providers.base import PromptGenHandler

MODEL = "anthropic/claude-opus-5.5"
"""A model both handlers price from the default catalogue at the same rates."""
REQUEST = PromptGenRequest(prompt="x" * 400, params={"max_tokens": 1000})


def answer(
    content: str | None = "ok",
    *,
    finish: str | None = "stop",
    usage: dict[str, Any] | None = None,
    **message: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "gen-1",
        "model": MODEL,
        "provider": "Anthropic",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish,
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def calls(*arguments: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "read_frame", "arguments": a},
        }
        for i, a in enumerate(arguments)
    ]


TOKENS = {"prompt_tokens": 2000, "completion_tokens": 100}
ANSWERS = {
    "text and token usage with cache details": answer(
        "Hi!",
        usage={
            **TOKENS,
            "prompt_tokens_details": {"cached_tokens": 1500, "cache_write_tokens": 300},
        },
    ),
    "a reported cost and top-level cache fields": answer(
        usage={
            **TOKENS,
            "cost": 0.0123,
            "cache_read_input_tokens": 1200,
            "cache_creation_input_tokens": 50,
        }
    ),
    "no usage: the character rule": answer("y" * 40),
    "tool calls": answer(
        None,
        finish="tool_calls",
        usage=TOKENS,
        tool_calls=calls('{"shot": 3}', "", {"a": 1}),
    ),
    "cut off at length": answer(
        None, finish="length", usage=TOKENS, tool_calls=calls("{}", '{"shot": ')
    ),
    "content filter": answer("", finish="content_filter", usage=TOKENS),
    "an unknown finish": answer(finish=None, usage=TOKENS),
    "reasoning details": answer(
        usage=TOKENS, reasoning_details=[{"type": "reasoning.text", "text": "hm"}]
    ),
    "reasoning text": answer(usage=TOKENS, reasoning="thinking it over"),
}
FAILURES = {
    "no content": (answer(None), PromptGenError, "incomplete LLM result"),
    "not an object": ([], PromptGenError, "incomplete LLM result"),
    "a tool call without a name": (
        answer(None, tool_calls=[{"function": {}}]),
        PromptGenError,
        "incomplete tool call",
    ),
    "an error message in a 2xx": (
        {"error": {"message": "upstream   broke"}},
        PromptGenError,
        "returned an error",
    ),
    "arguments that are not JSON": (
        answer(None, finish="tool_calls", tool_calls=calls("{shot: 3")),
        ToolArgumentsError,
        "read_frame",
    ),
}


def both(recorder: Recorder) -> list[PromptGenHandler]:
    fal = FalHandler(
        FAKE_KEY,
        run_url="http://fal.test",
        retry=FAST,
        transport=recorder.transport,
        upload_images=False,
    )
    openai = OpenAIHandler(
        FAKE_KEY,
        base_url="http://openai.test",
        default_model=MODEL,
        retry=FAST,
        transport=recorder.transport,
    )
    return [fal, openai]


def seen(result: PromptGenResult, provider: str) -> str:
    """The result as JSON, the provider's name made neutral; fal's own note of the reasoning effort
    it sent (the openai handler sends none by default) left out."""
    data = result.model_dump(mode="json")
    data["meta"].pop("reasoning", None)
    return re.sub(rf"\b{provider}\b", "PROVIDER", json.dumps(data, sort_keys=True))


@pytest.mark.parametrize("body", ANSWERS.values(), ids=ANSWERS.keys())
async def test_both_callers_read_an_answer_the_same(body: dict[str, Any]) -> None:
    recorder = Recorder(body)
    results = [
        await h.execute(REQUEST, AbortController().signal) for h in both(recorder)
    ]
    fal, openai = results
    assert fal.meta is not None and fal.meta["provider"] == "fal"
    assert openai.meta is not None and openai.meta["provider"] == "openai"
    assert seen(fal, "fal") == seen(openai, "openai")


@pytest.mark.parametrize(
    ("body", "error", "says"), FAILURES.values(), ids=FAILURES.keys()
)
async def test_both_callers_refuse_a_bad_answer_the_same(
    body: Any, error: type[Exception], says: str
) -> None:
    messages = []
    for handler in both(Recorder(body)):
        with pytest.raises(error, match=says) as caught:
            await handler.execute(REQUEST, AbortController().signal)
        messages.append(re.sub(rf"\b{handler.name}\b", "PROVIDER", str(caught.value)))
    assert messages[0] == messages[1]


async def test_the_answer_room_the_request_gave_is_in_a_cut_answers_meta() -> None:
    """Both callers tell the parser the `max_tokens` of the request: a length answer says it."""
    for handler in both(Recorder(ANSWERS["cut off at length"])):
        result = await handler.execute(REQUEST, AbortController().signal)
        assert result.finish_reason == "length" and result.meta is not None
        assert result.meta["max_tokens"] == 1000 and result.meta["cut_off"] == ["c1"]
