"""What a streamed answer cut mid-way may have cost, counted (docs/providers.md, "Cut streams"),
over real HTTP to the simulator: a stream dropped, failed (`overloaded_error`) or stalled past the
idle timeout after its answer began is retried, and the result's cost is the completed answer +
the cut attempt's reported input usage at the catalogue's rates (fal, which reports usage only in
its last chunk: the character estimate of the request) + the estimate of the output it received;
a loop's budget sees that spend, and a replay of the journaled step rebuilds it; a fallback answer
counts the failed provider's cut attempts; a call that fails for good carries them on its error
and logs them."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    Budget,
    BudgetEvent,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    PromptGenError,
    PromptGenRequest,
    PromptGenResult,
    RunToolLoopOptions,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import NEVER_ABORTED
from toolloop.journal.redis import RedisJournal
from toolloop.providers import AnthropicHandler, FalHandler, RetryPolicy
from toolloop.providers.common import estimate_tokens, input_text
from toolloop.sim import SimRequest, SimServer
from toolloop.sim.stream import PIECE_CHARS

FAST = RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1, total_s=10.0)
MODEL = "claude-sonnet-5-5"
# > 1,024 tokens
SYSTEM = "You review storyboards shot by shot and report what to change. " * 80
LONG = "The third shot holds too long on the empty corridor; cut it by a second. " * 6
AFTER = 5
STALLED_S = 0.3
"""Pieces sent before the fault: 5 pieces of 4 ASCII characters, 20 characters, 5 output tokens."""


def handler(
    wire: str, sim: SimServer, timeout_s: float = 30.0
) -> AnthropicHandler | FalHandler:
    if wire == "anthropic":
        return AnthropicHandler(
            "sk-ant-FAKE-cut", base_url=sim.base_url, retry=FAST, timeout_s=timeout_s
        )
    return FalHandler(
        "fal-FAKE-cut", run_url=sim.base_url, retry=FAST, timeout_s=timeout_s
    )


def prompt() -> PromptGenRequest:
    return PromptGenRequest(
        model=MODEL,
        system=SYSTEM,
        cache_system=True,
        params={"reasoning": "off"},
        messages=[UserMessage(content="Review the storyboard.")],
    )


def faulted(
    kind: str, turn: dict[str, Any] | None = None, times: int | None = 1
) -> dict[str, Any]:
    fault: dict[str, Any] = {"kind": kind, "after": AFTER, "times": times}
    if kind == "stream_error":
        fault["status"] = 529  # overloaded_error
    if kind == "stall":
        fault["seconds"] = 1.0  # past the idle timeout of STALLED_S
    return {**(turn or {"text": LONG}), "fault": fault}


def cut_usd(
    wire: str, model: AnthropicHandler | FalHandler, first: PromptGenResult
) -> float:
    """What the cut attempt counts, from the published rules: anthropic, the input usage its
    message_start reported (that of the same request on a fresh simulator, `first`: it wrote the
    cache) at the catalogue's rates; fal, the character estimate of the request at the input rate;
    both, the AFTER pieces received as output tokens (one each: 4 ASCII characters)."""
    price = model.catalog.require(wire, MODEL).price
    assert price is not None
    output = AFTER * PIECE_CHARS // 4 * price.output
    if wire == "fal":
        return (estimate_tokens(input_text(prompt())) * price.input + output) / 1e6
    usage = first.usage
    uncached = usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
    # the cut attempt wrote the cache
    assert usage.cache_write_tokens > 0 and usage.cached_tokens == 0
    return (
        uncached * price.input + usage.cache_write_tokens * price.cache_write + output
    ) / 1e6


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.parametrize("kind", ["stream_drop", "stream_error", "stall"])
async def test_a_cut_attempt_costs_its_reported_input_and_the_output_it_received(
    wire: str, kind: str
) -> None:
    with SimServer(
        [{"text": LONG}], strict=True
    ) as clean:  # the same request twice: the cut attempt
        # wrote the cache
        first = await handler(wire, clean).execute(prompt(), NEVER_ABORTED)
        # the retry reads it
        answer = await handler(wire, clean).execute(prompt(), NEVER_ABORTED)
    with SimServer([faulted(kind)], strict=True) as sim:
        model = handler(wire, sim, timeout_s=STALLED_S if kind == "stall" else 30.0)
        result = await model.execute(
            prompt(), NEVER_ABORTED, on_delta=lambda delta: None
        )
        assert sim.stats()["faults"] == {kind: 1} and sim.stats()["requests"] == 2
    cut = cut_usd(wire, model, first)
    # the usage of the answer
    assert result.text == answer.text and result.usage == answer.usage
    assert result.meta is not None and answer.meta is not None
    assert result.meta["cut_usd"] == [pytest.approx(cut, abs=1e-10)]
    assert result.cost_usd == pytest.approx(answer.cost_usd + cut, abs=1e-9)
    assert result.meta["cost_source"] == f"{answer.meta['cost_source']}+cut"
    [counted] = result.meta["cut_usage"]
    assert counted["completion_tokens"] == AFTER and counted["output_from"] == "chars"
    if wire == "anthropic":  # message_start's input and cache counts, as reported
        assert counted["prompt_tokens"] == first.usage.prompt_tokens
        assert counted["cache_write_tokens"] == first.usage.cache_write_tokens


class Shot(BaseModel):
    shot: int


def read_frame(input: Shot, signal: AbortSignal) -> ToolOutput:
    return ToolOutput(content=[TextPart(text=f"frame {input.shot}: a corridor, empty")])


SCRIPT = [
    {
        "text": "Let me read the frame first.",
        "tool_calls": [{"name": "read_frame", "input": {"shot": 3}}],
    },
    {"text": LONG},
]


def options(
    wire: str,
    sim: SimServer,
    journal: MemoryJournal | RedisJournal,
    events: list[Any],
    usd: float,
    max_steps: int = 2,
) -> RunToolLoopOptions:
    gen = PromptGen({wire: handler(wire, sim)}, wire)
    tool = ToolSpec(
        name="read_frame", description="Read one frame.", schema=Shot, run=read_frame
    )
    return RunToolLoopOptions(
        generate=gen.as_generate(),
        model=MODEL,
        system=SYSTEM,
        messages=[UserMessage(content="Shot 3?")],
        tools=[tool],
        budget=Budget(usd=usd),
        max_steps=max_steps,
        step=journal.step,
        on_step=events.append,
        reasoning="off",
    )


def journals(
    kind: str, request: pytest.FixtureRequest
) -> Callable[[], MemoryJournal | RedisJournal]:
    """A maker of journal objects over one store: each call a new object, as a restarted process."""
    if kind == "memory":
        entries: dict[str, str] = {}
        return lambda: MemoryJournal(entries=entries)
    client: redis.Redis = request.getfixturevalue("redis_client")
    run_id = uuid.uuid4().hex
    return lambda: RedisJournal(client, run_id, "s0/")


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_a_loop_budget_counts_the_cut_attempt_and_a_replay_rebuilds_the_same_spend(
    wire: str, kind: str, request: pytest.FixtureRequest
) -> None:
    with SimServer(
        SCRIPT, strict=True
    ) as clean:  # model:1 as the retry makes it: the cache read
        wrote: list[Any] = []  # model:1 as the cut attempt makes it: the cache written
        await run_tool_loop(
            options(wire, clean, MemoryJournal(), wrote, 5.0, max_steps=1)
        )
        read = await run_tool_loop(
            options(wire, clean, MemoryJournal(), [], 5.0, max_steps=1)
        )
    model = handler(wire, clean)
    price = model.catalog.require(wire, MODEL).price
    assert price is not None and read.stopped_by == "steps"
    # the least a cut attempt adds: its 5 output tokens
    output = AFTER * price.output / 1e6
    # enough for model:1 alone, not with its cut attempt
    usd = read.spent_usd + output / 2
    journal = journals(kind, request)
    with SimServer([faulted("stream_error", SCRIPT[0]), SCRIPT[1]], strict=True) as sim:
        events: list[Any] = []
        result = await run_tool_loop(options(wire, sim, journal(), events, usd))
        # no model:2
        assert (
            sim.stats()["faults"] == {"stream_error": 1}
            and sim.stats()["requests"] == 2
        )
        replayed: list[Any] = []
        # a new process's
        again = await run_tool_loop(options(wire, sim, journal(), replayed, usd))
        assert sim.stats()["requests"] == 2  # the replay called nothing
    [step] = [event for event in events if isinstance(event, ModelEvent)]
    [stop] = [event for event in events if isinstance(event, BudgetEvent)]
    assert result.stopped_by == "budget" and stop.mode == "stop"
    assert (
        step.cost_usd >= read.spent_usd + output
        and stop.spent_usd == result.spent_usd == step.cost_usd
    )
    if (
        wire == "anthropic"
    ):  # the cut attempt's message_start: the usage of `wrote`'s model:1
        [cut_input] = [e.usage for e in wrote if isinstance(e, ModelEvent)]
        uncached = cut_input.prompt_tokens - cut_input.cache_write_tokens
        cut = (
            uncached * price.input + cut_input.cache_write_tokens * price.cache_write
        ) / 1e6 + output
        assert step.cost_usd == pytest.approx(read.spent_usd + cut, abs=1e-9)
    assert again.stopped_by == "budget" and again.spent_usd == result.spent_usd
    assert [e for e in replayed if isinstance(e, BudgetEvent)] == [stop]
    assert [e.cost_usd for e in replayed if isinstance(e, ModelEvent)] == [
        step.cost_usd
    ]


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_a_call_that_fails_for_good_after_cut_attempts_carries_and_logs_what_they_may_have_cost(
    wire: str, caplog: pytest.LogCaptureFixture
) -> None:
    with SimServer([{"text": LONG}], strict=True) as clean:
        first = await handler(wire, clean).execute(prompt(), NEVER_ABORTED)
    with SimServer([faulted("stream_drop", times=None)], strict=True) as sim:
        model = handler(wire, sim)
        with pytest.raises(
            PromptGenError, match=r"\(2 attempts\)"
        ) as caught:  # a cut one is retried once
            await model.execute(prompt(), NEVER_ABORTED, on_delta=lambda delta: None)
    # the first attempt wrote the cache; the next one read it
    cut = cut_usd(wire, model, first)
    costs = [attempt.usd for attempt in caught.value.cut_attempts]
    assert (
        len(costs) == 2
        and costs[0] == pytest.approx(cut, abs=1e-10)
        and 0 < costs[1] <= costs[0]
    )
    lost = [r for r in caplog.records if "cut mid-answer" in r.getMessage()]
    assert [r.levelno for r in lost] == [logging.WARNING]
    assert (
        f"{wire}: the call failed after 2 streamed attempt(s) cut mid-answer"
        in lost[0].getMessage()
    )
    assert f"${sum(costs):.6f}" in lost[0].getMessage()


def cut_on_anthropic(sim_request: SimRequest) -> dict[str, Any]:
    """Every anthropic stream drops after AFTER pieces; fal answers."""
    return (
        faulted("stream_drop", times=None)
        if sim_request.wire == "anthropic"
        else {"text": LONG}
    )


async def test_a_fallback_answer_counts_the_cut_attempts_of_the_provider_that_failed() -> (
    None
):
    with SimServer(cut_on_anthropic, strict=True) as sim:
        gen = PromptGen(
            {"anthropic": handler("anthropic", sim), "fal": handler("fal", sim)},
            "anthropic",
            ["fal"],
        )
        result = await gen.generate(prompt(), on_delta=lambda delta: None)
        sim.reset()
        # fal alone, cache empty
        answer = await handler("fal", sim).execute(prompt(), NEVER_ABORTED)
    assert result.meta is not None and answer.meta is not None
    assert (
        result.meta["provider"] == "fal"
        and result.meta["fallback_from"][0]["provider"] == "anthropic"
    )
    cuts = result.meta["cut_usd"]
    assert [u["provider"] for u in result.meta["cut_usage"]] == [
        "anthropic"
    ] * 2 and all(c > 0 for c in cuts)
    assert result.cost_usd == pytest.approx(answer.cost_usd + sum(cuts), abs=1e-9)
    assert result.meta["cost_source"] == "usage+cut" and result.text == answer.text
