"""The one-turn providers: openai over HTTP (MockTransport), codex and claude through stand-in CLIs
(small scripts on disk, run as real subprocesses)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from providers_kit import FAKE_KEY, FAST, Recorder

from toolloop import (
    AbortController,
    AbortError,
    PromptGen,
    PromptGenError,
    PromptGenRequest,
    PromptGenUnavailableError,
    ToolDefinition,
    UserMessage,
)
from toolloop.providers import ClaudeHandler, CodexHandler, OpenAIHandler

TOOL = ToolDefinition(name="t", description="d", input_schema={"type": "object"})
NOT_ONE_TURN = [
    PromptGenRequest(messages=[UserMessage(content="Hi")]),
    PromptGenRequest(prompt="Hi", tools=[TOOL]),
    PromptGenRequest(prompt="Hi", tool_choice="auto"),
    PromptGenRequest(prompt="Hi", cache_system=True),
]


def cli(tmp_path: Path, name: str, body: str) -> Path:
    """An executable Python script standing in for a CLI; it appends its argv to `<name>.calls`."""
    path = tmp_path / name
    path.write_text(
        f"#!{sys.executable}\nimport json, sys, time\n"
        f"open({str(tmp_path / (name + '.calls'))!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"stdin = sys.stdin.read()\n{body}\n"
    )
    path.chmod(0o755)
    return path


def calls(tmp_path: Path, name: str) -> list[list[str]]:
    file = tmp_path / f"{name}.calls"
    return (
        [json.loads(line) for line in file.read_text().splitlines()]
        if file.exists()
        else []
    )


@pytest.mark.parametrize(
    "request_", NOT_ONE_TURN, ids=["messages", "tools", "tool_choice", "cache_system"]
)
async def test_every_one_turn_provider_refuses_tool_requests_before_any_call(
    request_: PromptGenRequest, tmp_path: Path
) -> None:
    recorder = Recorder({})
    handlers = [
        OpenAIHandler(FAKE_KEY, transport=recorder.transport),
        ClaudeHandler(binary=str(cli(tmp_path, "claude", "print('{}')"))),
        CodexHandler(binary=str(cli(tmp_path, "codex", "print('{}')"))),
    ]
    for handler in handlers:
        with pytest.raises(PromptGenUnavailableError) as caught:
            handler.estimate(request_)
        assert caught.value.reason == "unsupported"
        with pytest.raises(PromptGenUnavailableError) as caught:
            await handler.execute(request_, AbortController().signal)
        assert caught.value.reason == "unsupported"
        assert "one-turn prompts only" in str(caught.value)
    assert (
        recorder.requests == []
        and calls(tmp_path, "claude") == []
        and calls(tmp_path, "codex") == []
    )


async def test_a_refusing_provider_falls_back_to_the_next() -> None:
    class Answers:
        def estimate(self, request: PromptGenRequest) -> float:
            return 0.0

        async def execute(self, request: PromptGenRequest, signal: object) -> object:
            from toolloop import PromptGenResult

            return PromptGenResult(text="served")

    gen = PromptGen(
        {"openai": OpenAIHandler(FAKE_KEY), "anthropic": Answers()},
        "openai",
        ["anthropic"],
    )  # type: ignore[dict-item]
    result = await gen.generate(PromptGenRequest(messages=[UserMessage(content="Hi")]))
    assert result.text == "served"
    assert result.meta == {
        "provider": "anthropic",
        "fallback_from": [{"provider": "openai", "reason": "unsupported"}],
    }


async def test_a_missing_binary_is_unavailable_missing() -> None:
    handler = ClaudeHandler(binary="toolloop-no-such-claude-binary")
    with pytest.raises(
        PromptGenUnavailableError, match="was not found on PATH"
    ) as caught:
        await handler.execute(PromptGenRequest(prompt="Hi"), AbortController().signal)
    assert caught.value.reason == "missing"


async def test_claude_cli_answer_cost_and_usage(tmp_path: Path) -> None:
    answer = {
        "type": "result",
        "is_error": False,
        "result": "Hello there.",
        "total_cost_usd": 0.0042,
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
            "output_tokens": 7,
        },
    }
    binary = cli(
        tmp_path, "claude", f"assert stdin == 'Say hi.'\nprint(json.dumps({answer!r}))"
    )
    handler = ClaudeHandler(binary=str(binary), default_model="haiku")
    result = await handler.execute(
        PromptGenRequest(prompt="Say hi.", system="Be brief."), AbortController().signal
    )
    assert result.text == "Hello there." and result.cost_usd == 0.0042
    assert (
        result.usage.prompt_tokens,
        result.usage.completion_tokens,
        result.usage.cached_tokens,
    ) == (
        115,
        7,
        100,
    )
    assert result.meta == {
        "provider": "claude",
        "model": "haiku",
        "cost_source": "usage",
    }
    assert calls(tmp_path, "claude") == [
        [
            "-p",
            "--output-format",
            "json",
            "--model",
            "haiku",
            "--system-prompt",
            "Be brief.",
        ]
    ]


async def test_codex_cli_reads_the_last_agent_message_and_usage(tmp_path: Path) -> None:
    events = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"type": "reasoning", "text": "thinking"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "Done."}},
        {
            "type": "turn.completed",
            "usage": {
                "input_tokens": 1000,
                "cached_input_tokens": 800,
                "output_tokens": 50,
            },
        },
    ]
    lines = "\\n".join(json.dumps(e) for e in events)
    binary = cli(
        tmp_path, "codex", f"assert stdin == 'Be brief.\\n\\nSay hi.'\nprint('{lines}')"
    )
    handler = CodexHandler(binary=str(binary))
    request = PromptGenRequest(prompt="Say hi.", system="Be brief.", model="gpt-5")
    result = await handler.execute(request, AbortController().signal)
    assert result.text == "Done." and result.usage.cached_tokens == 800
    assert result.cost_usd == pytest.approx((200 * 1.25 + 800 * 0.125 + 50 * 10) / 1e6)
    assert calls(tmp_path, "codex") == [
        ["exec", "--json", "--skip-git-repo-check", "-m", "gpt-5", "-"]
    ]


async def test_a_failing_cli_reports_its_stderr(tmp_path: Path) -> None:
    binary = cli(
        tmp_path, "claude", "sys.stderr.write('Please run /login\\n'); sys.exit(3)"
    )
    with pytest.raises(PromptGenError, match="exited with status 3: Please run /login"):
        await ClaudeHandler(binary=str(binary)).execute(
            PromptGenRequest(prompt="Hi"), AbortController().signal
        )


async def test_the_callers_abort_kills_a_running_cli_at_once(tmp_path: Path) -> None:
    binary = cli(tmp_path, "codex", "time.sleep(30)")
    controller = AbortController()
    asyncio.get_running_loop().call_later(0.3, controller.abort, "cancel")
    started = time.monotonic()
    with pytest.raises(AbortError):
        await CodexHandler(binary=str(binary)).execute(
            PromptGenRequest(prompt="Hi"), controller.signal
        )
    assert time.monotonic() - started < 5


async def test_openai_one_turn_body_and_answer() -> None:
    answer = {
        "model": "gpt-5-mini",
        "choices": [
            {
                "message": {"role": "assistant", "content": "Hi!"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1000,
            "completion_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 400},
        },
    }
    recorder = Recorder(answer)
    handler = OpenAIHandler(
        FAKE_KEY,
        base_url="http://openai.test",
        retry=FAST,
        transport=recorder.transport,
    )
    request = PromptGenRequest(
        prompt="Say hi.", system="Be brief.", params={"reasoning": "low"}
    )
    result = await handler.execute(request, AbortController().signal)
    assert str(recorder.requests[0].url) == "http://openai.test/v1/chat/completions"
    assert recorder.requests[0].headers["authorization"] == f"Bearer {FAKE_KEY}"
    assert recorder.bodies[0] == {
        "model": "gpt-5-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hi."},
        ],
        "reasoning_effort": "low",
    }
    assert (
        result.text == "Hi!"
        and result.meta is not None
        and result.meta["provider"] == "openai"
    )
    assert result.cost_usd == pytest.approx((600 * 0.25 + 400 * 0.025 + 10 * 2) / 1e6)
    assert FAKE_KEY not in repr(handler)
