"""The contract types and errors of SPEC section 1, and the abort signal of 2.10."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pydantic
import pytest

from toolloop import (
    AbortController,
    AbortError,
    AssistantMessage,
    ImagePart,
    PromptGenError,
    PromptGenRequest,
    PromptGenResult,
    PromptGenUnavailableError,
    PromptGenUsage,
    TextPart,
    ToolArgumentsError,
    ToolCall,
    ToolMessage,
    UserMessage,
    is_prompt_gen_unavailable,
)
from toolloop.contract import CHAT_MESSAGES

ERRORS = [
    ToolArgumentsError("read_frame", "{not json" + "x" * 300),
    PromptGenError("The provider failed.\n  Retry later.", 503, True, 2.5),
    PromptGenUnavailableError("No key.\n  Set ANTHROPIC_API_KEY.", "auth", 401),
    AbortError("The operation was aborted: stop.", "stop"),
]


def test_messages_are_read_from_dicts_by_role_and_type() -> None:
    messages = CHAT_MESSAGES.validate_python(
        [
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "name": "x", "input": {}}],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": [
                    {"type": "text", "text": "ok", "cache": True},
                    {
                        "type": "image",
                        "path": "/a/b.png",
                        "mime_type": "image/png",
                        "hash": "00",
                    },
                ],
            },
        ]
    )
    assert messages == [
        UserMessage(content="Hi"),
        AssistantMessage(tool_calls=[ToolCall(id="c1", name="x", input={})]),
        ToolMessage(
            tool_call_id="c1",
            content=[
                TextPart(text="ok", cache=True),
                ImagePart(path="/a/b.png", mime_type="image/png", hash="00"),
            ],
        ),
    ]
    with pytest.raises(pydantic.ValidationError):
        CHAT_MESSAGES.validate_python(
            [{"role": "user", "content": [{"type": "video", "url": "x"}]}]
        )


def test_models_are_frozen_values() -> None:
    part = TextPart(text="a")
    with pytest.raises(pydantic.ValidationError):
        part.text = "b"  # type: ignore[misc]
    assert TextPart(text="a") == part and hash(ToolCall(id="c", name="n")) is not None


def test_one_turn_request_and_result_defaults() -> None:
    assert PromptGenRequest(prompt="Hi").is_one_turn
    assert not PromptGenRequest(cache_system=True).is_one_turn
    result = PromptGenResult(text="")
    assert (result.tool_calls, result.finish_reason, result.usage) == (
        [],
        "stop",
        PromptGenUsage(),
    )
    assert PromptGenUsage().cached_read_tokens is None


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_survive_pickling_and_rebuilding_from_args(error: Exception) -> None:
    for copy in (pickle.loads(pickle.dumps(error)), type(error)(*error.args)):
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.__dict__ == error.__dict__


def test_error_messages_have_two_lines() -> None:
    message = str(ERRORS[0])
    assert message == (
        'Tool call "read_frame" has arguments that are not JSON.\n  The model sent: '
        + ("{not json" + "x" * 191)
        + "."
    )
    assert not is_prompt_gen_unavailable(ERRORS[0])


def test_is_prompt_gen_unavailable() -> None:
    assert is_prompt_gen_unavailable(PromptGenUnavailableError("x", "unsupported"))
    for status in (401, 402, 403, 429):
        assert is_prompt_gen_unavailable(PromptGenError("x", status))
    assert not is_prompt_gen_unavailable(PromptGenError("x", 500, True))
    assert not is_prompt_gen_unavailable(ValueError("x"))


async def test_abort_from_another_thread_wakes_waiters() -> None:
    controller = AbortController()
    signal = controller.signal
    assert not signal.aborted
    signal.throw_if_aborted()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    thread = threading.Thread(target=controller.abort, args=("user",))
    thread.start()
    thread.join()
    await asyncio.wait_for(waiter, 5)
    assert signal.aborted and signal.reason == "user"
    with pytest.raises(AbortError) as caught:
        signal.throw_if_aborted()
    assert caught.value.reason == "user"
    await signal.wait()  # an aborted signal returns at once


def test_tests_cannot_reach_a_real_provider() -> None:
    import socket

    with pytest.raises(
        AssertionError, match=r"real provider host 'api\.anthropic\.com'"
    ):
        socket.getaddrinfo("api.anthropic.com", 443)
    assert socket.getaddrinfo("127.0.0.1", 80)
