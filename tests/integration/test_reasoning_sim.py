"""Reasoning across a tool loop over real HTTP to the simulator (SPEC 4.1): a 3-turn tool
conversation with `reasoning="medium"` finishes `done` on today's Claude models, through the
anthropic provider and through fal (its slugs), and every request carries each earlier answer's
thinking blocks exactly as the simulator signed them, first in their turn; also when the run
crashed before its last model call and went on from its RedisJournal. And the simulator refuses
a history whose thinking was dropped or changed, with the API's own messages."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from pydantic import BaseModel

from tests.integration.reasoning_kit import emitted, sent_back
from tests.support.sim import Recording
from tests.unit.providers_kit import FAKE_KEY, validate_anthropic_body
from toolloop import (
    AbortSignal,
    AssistantMessage,
    Budget,
    RedisJournal,
    RunToolLoopOptions,
    TextPart,
    ToolOutput,
    ToolSpec,
    run_tool_loop,
)
from toolloop.providers import AnthropicHandler, FalHandler, RetryPolicy
from toolloop.sim import SimServer, thinking

pytestmark = pytest.mark.integration

FAST = RetryPolicy(
    attempts=2, base_delay_s=0.02, max_delay_s=0.1, total_s=5.0, short_retry_after_s=1.0
)
MODELS = [
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-4-5",
    "claude-fable-5-1",
]
FAL_SLUGS = {
    "claude-opus-5-5": "anthropic/claude-opus-5.5",
    "claude-sonnet-5-5": "anthropic/claude-sonnet-5.5",
    "claude-haiku-4-5": "anthropic/claude-haiku-4.5",
    "claude-fable-5-1": "anthropic/claude-fable-5.1",
}

SCRIPT = [
    {"text": "First shot.", "tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}]},
    {
        "tool_calls": [{"name": "add", "input": {"a": 3, "b": 4}}],
        "redacted_thinking": True,
    },
    {"text": "Both sums are in."},
]


class Crash(Exception):
    """The process died before this model call."""


class AddInput(BaseModel):
    a: float
    b: float


def add(input: AddInput, signal: AbortSignal) -> ToolOutput:
    return ToolOutput(
        value=input.a + input.b, content=[TextPart(text=f"{input.a + input.b:g}")]
    )


TOOLS = [ToolSpec(name="add", description="Add two numbers.", schema=AddInput, run=add)]


@pytest.fixture
def recording() -> Recording:
    return Recording(SCRIPT)


@pytest.fixture
def sim(recording: Recording) -> Iterator[SimServer]:
    with SimServer(recording) as server:
        yield server


def generate_for(sim: SimServer, wire: str) -> Any:
    if wire == "anthropic":
        handler: Any = AnthropicHandler(FAKE_KEY, base_url=sim.base_url, retry=FAST)
    else:
        handler = FalHandler(FAKE_KEY, run_url=sim.base_url, retry=FAST)
    return handler.execute


def options(generate: Any, model: str, journal: RedisJournal) -> RunToolLoopOptions:
    return RunToolLoopOptions(
        generate=generate,
        model=model,
        system="You add numbers, one tool call at a time.",
        messages=[{"role": "user", "content": "Add 1 and 2, then 3 and 4."}],
        tools=TOOLS,
        budget=Budget(usd=5.0),
        max_steps=6,
        step=journal.step,
        reasoning="medium",
    )


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.parametrize("model", MODELS)
async def test_three_tool_turns_with_reasoning_finish_done_with_every_thinking_block_sent_back(
    sim: SimServer,
    recording: Recording,
    redis_client: redis.Redis,
    model: str,
    wire: str,
) -> None:
    name = model if wire == "anthropic" else FAL_SLUGS[model]
    journal_id = f"reasoning-{uuid.uuid4().hex}"
    live = generate_for(sim, wire)
    calls = 0

    async def crashes_before_the_third_call(request: Any, signal: AbortSignal) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Crash
        return await live(request, signal)

    with pytest.raises(Crash):
        await run_tool_loop(
            options(
                crashes_before_the_third_call,
                name,
                RedisJournal(redis_client, journal_id),
            )
        )
    assert len(recording.seen) == 2
    # the restart: steps 1-4 replay from Redis (no call), the third model call runs
    result = await run_tool_loop(
        options(live, name, RedisJournal(redis_client, journal_id))
    )
    assert result.stopped_by == "done" and result.final_text == "Both sums are in."
    assert len(recording.seen) == 3 and result.steps == 3

    answers = [emitted(wire, request, turn) for request, turn in recording.seen]
    assert all(answers), (
        f"{name} on {wire}: an answer without thinking (the setting must not change)"
    )
    for index, (request, _) in enumerate(recording.seen):
        if wire == "anthropic":
            validate_anthropic_body(request.body)
        assert sent_back(wire, request.body) == answers[:index], f"request {index + 1}"
    history = [m for m in result.messages if isinstance(m, AssistantMessage)]
    assert [[block.data for block in m.reasoning or []] for m in history] == answers


async def test_a_tool_loop_that_drops_its_thinking_is_refused_with_the_api_message(
    sim: SimServer,
) -> None:
    first = await _post(sim, [{"role": "user", "content": "Add 1 and 2."}])
    tool_use = [block for block in first["content"] if block["type"] == "tool_use"]
    dropped = [
        {"role": "user", "content": "Add 1 and 2."},
        {"role": "assistant", "content": tool_use},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use[0]["id"],
                    "content": "3",
                }
            ],
        },
    ]
    response = await _post(sim, dropped, status=400)
    assert response["error"]["type"] == "invalid_request_error"
    assert response["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block"
    )
    kept = [dropped[0], {"role": "assistant", "content": first["content"]}, dropped[2]]
    assert (await _post(sim, kept))[
        "stop_reason"
    ] == "tool_use"  # the same history, blocks kept
    changed = dict(first["content"][0], thinking=first["content"][0]["thinking"] + " ")
    tampered = [
        dropped[0],
        {"role": "assistant", "content": [changed, *first["content"][1:]]},
        dropped[2],
    ]
    response = await _post(sim, tampered, status=400)
    assert (
        response["error"]["message"]
        == "messages.1.content.0: Invalid `signature` in `thinking` block"
    )


async def _post(
    sim: SimServer, messages: list[dict[str, Any]], status: int = 200
) -> dict[str, Any]:
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 1024,
        "thinking": {"type": "adaptive"},
        "messages": messages,
        "tools": [
            {"name": "add", "description": "Add.", "input_schema": {"type": "object"}}
        ],
    }
    headers = {"x-api-key": "sim-key", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{sim.base_url}/v1/messages", json=body, headers=headers
        )
    assert response.status_code == status, response.text
    data: dict[str, Any] = response.json()
    return data


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_scripted_refusals_and_cut_off_calls_reach_the_loop_on_both_wires(
    redis_client: redis.Redis, wire: str
) -> None:
    ran: list[float] = []

    def counted(input: AddInput, signal: AbortSignal) -> ToolOutput:
        ran.append(input.a)
        return add(input, signal)

    tools = [
        ToolSpec(
            name="add", description="Add two numbers.", schema=AddInput, run=counted
        )
    ]
    # more than the first request's room (anthropic 8,192 + 8,192 for thinking; fal 32,000), less
    # than the retry's (twice the answer room)
    needed = 20_000 if wire == "anthropic" else 40_000
    cut = {
        "tool_calls": [{"name": "add", "input": {"a": 5, "b": 6}}],
        "max_tokens_needed": needed,
    }
    refusal = {
        "text": "No.",
        "refusal": {"category": "bio", "explanation": "Lab methods."},
    }
    with SimServer([cut, refusal]) as sim:
        journal = RedisJournal(redis_client, f"stops-{uuid.uuid4().hex}")
        model = (
            "claude-sonnet-5-5"
            if wire == "anthropic"
            else FAL_SLUGS["claude-sonnet-5-5"]
        )
        loop = options(generate_for(sim, wire), model, journal).model_copy(
            update={"tools": tools}
        )
        result = await run_tool_loop(loop)
    assert result.stopped_by == "refused" and result.final_text == "No."
    # the cut answer's call never ran; the retry's (with room to spare) ran once
    assert ran == [5]
    if wire == "anthropic":
        assert result.refusal is not None and result.refusal.category == "bio"
        assert result.refusal.explanation == "Lab methods."
    else:  # fal's router says content_filter and nothing more
        assert result.refusal is not None and result.refusal.category is None


async def test_a_paused_turn_goes_back_with_its_thinking_and_the_run_goes_on(
    redis_client: redis.Redis,
) -> None:
    paused = {
        "text": "Searching the archive…",
        "stop_reason": "pause_turn",
        "redacted_thinking": False,
    }
    turns: list[Any] = [paused, *SCRIPT]
    recording = Recording(turns)
    with SimServer(recording) as sim:
        journal = RedisJournal(redis_client, f"paused-{uuid.uuid4().hex}")
        result = await run_tool_loop(
            options(generate_for(sim, "anthropic"), "claude-opus-5-5", journal)
        )
    assert (result.stopped_by, result.steps, result.final_text) == (
        "done",
        4,
        "Both sums are in.",
    )
    (first, first_turn), (second, _) = recording.seen[:2]
    continued = second.body["messages"]
    # sent back, no tool result between
    assert [m["role"] for m in continued] == [
        "user",
        "assistant",
    ]
    blocks = thinking.anthropic_blocks(first_turn, first)
    assert continued[-1]["content"] == [
        *blocks,
        {"type": "text", "text": "Searching the archive…"},
    ]
    # paused, its continuation (a tool call), the next call, the answer
    assert len(recording.seen) == 4
