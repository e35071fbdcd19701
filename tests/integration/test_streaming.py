"""Streamed model calls over real HTTP to the simulator (SPEC 4.3; docs/providers.md, Streaming):
a streamed answer gives the same `PromptGenResult` as the non-streamed one (text, tool calls,
thinking with signatures, cache usage, cost) on both wires; deltas reach `on_step` in order and the
step's `ModelEvent` follows them; a replay emits none; a stream cut or failed mid-way is retried, the
answer is the completed one and its cost adds what the cut attempt may have cost (the figures:
test_stream_cut_cost.py); the timeout is an idle timeout between events, not a cap on the whole
answer; with reads held (READ_HOLD, as a durable worker streams) every piece still comes once, in
order, one delta per hold, and the fault paths behave the same."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    Budget,
    DeltaEvent,
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
from toolloop.deltas import READ_HOLD
from toolloop.http import KeepAliveClient
from toolloop.providers import AnthropicHandler, FalHandler, RetryPolicy
from toolloop.sim import SimRequest, SimServer, SimTurn
from toolloop.sim.stream import PIECE_CHARS


class Shot(BaseModel):
    shot: int


def read_frame(input: Shot, signal: AbortSignal) -> ToolOutput:
    return ToolOutput(content=[TextPart(text=f"frame {input.shot}: a corridor, empty")])


def read_frame_spec() -> ToolSpec:
    return ToolSpec(
        name="read_frame", description="Read one frame.", schema=Shot, run=read_frame
    )


FAST = RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1, total_s=10.0)
# > 1,024 tokens
SYSTEM = "You review storyboards shot by shot and report what to change. " * 80
TOOL = {
    "name": "read_frame",
    "description": "Read one frame.",
    "input_schema": {"type": "object"},
}
LONG = "The third shot holds too long on the empty corridor; cut it by a second. " * 6
SCENARIOS: dict[str, list[Any]] = {
    "text": [{"text": LONG}],
    "tool calls": [
        {
            "text": "Looking at both.",
            "tool_calls": [
                {
                    "name": "read_frame",
                    "input": {"shot": 3, "note": "ünïcode \u2014 ok"},
                },
                {"name": "read_frame", "input": {}},
            ],
        }
    ],
    "thinking": [
        {
            "text": "Shot 3 is fine.",
            "thinking": "Check the corridor shot first. " * 5,
            "redacted_thinking": True,
        }
    ],
    "cut tool call": [
        {
            "text": "Writing.",
            "tool_calls": [{"name": "read_frame", "input": {"shot": 3}}],
            "max_tokens_needed": 100_000,
        }
    ],
}


def handler(wire: str, sim: SimServer, **options: Any) -> AnthropicHandler | FalHandler:
    options.setdefault("retry", FAST)
    if options.pop("keep_alive", False):
        options["http_client"] = KeepAliveClient()
    if wire == "anthropic":
        return AnthropicHandler("sk-ant-FAKE-stream", base_url=sim.base_url, **options)
    return FalHandler("fal-FAKE-stream", run_url=sim.base_url, **options)


def request(scenario: str, turn: int = 0) -> PromptGenRequest:
    params: dict[str, Any] = {"reasoning": "high" if scenario == "thinking" else "off"}
    if scenario == "cut tool call":
        params["max_tokens"] = 2000
    messages = [UserMessage(content=f"Review the storyboard, pass {turn}.")]
    return PromptGenRequest(
        model="claude-sonnet-5-5",
        system=SYSTEM,
        cache_system=True,
        params=params,
        messages=messages,
        tools=[TOOL],
    )


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_a_streamed_answer_is_the_same_result_as_the_whole_one(
    wire: str, scenario: str
) -> None:
    with SimServer(SCENARIOS[scenario], strict=True) as sim:
        model = handler(wire, sim)
        whole = [
            await model.execute(request(scenario, turn), NEVER_ABORTED)
            for turn in (1, 2)
        ]
        sim.reset()  # an empty prompt cache again: the streamed calls write, then read, the same
        deltas: list[DeltaEvent] = []
        streamed = [
            await model.execute(
                request(scenario, t), NEVER_ABORTED, on_delta=deltas.append
            )
            for t in (1, 2)
        ]
    for one, other in zip(whole, streamed, strict=True):
        assert other.model_dump_json() == one.model_dump_json()
    first, second = whole
    # cache usage counted
    assert first.usage.cache_write_tokens > 0 and second.usage.cached_tokens > 0
    text = "".join(d.text for d in deltas if not d.thinking)
    assert text == first.text + second.text
    if scenario == "thinking":
        assert first.reasoning and any(b.data.get("signature") for b in first.reasoning)
        # anthropic's, fal's (OpenRouter's)
        redacted = {
            "redacted_thinking",
            "reasoning.encrypted",
        }
        assert any(b.data.get("type") in redacted for b in first.reasoning)
        assert any(d.thinking for d in deltas)
    if scenario == "tool calls":
        assert [c.input for c in first.tool_calls] == [
            {"shot": 3, "note": "ünïcode — ok"},
            {},
        ]
    if scenario == "cut tool call":
        assert first.finish_reason == "length"


def loop_options(
    wire: str, sim: SimServer, journal: MemoryJournal, events: list[Any]
) -> RunToolLoopOptions:
    gen = PromptGen({wire: handler(wire, sim)}, wire)
    return RunToolLoopOptions(
        generate=gen.as_generate(),
        model="claude-sonnet-5-5",
        system=SYSTEM,
        messages=[UserMessage(content="Review shot 3.")],
        tools=[read_frame_spec()],
        budget=Budget(usd=5.0),
        max_steps=5,
        step=journal.step,
        on_step=events.append,
        reasoning="off",
    )


LOOP_SCRIPT = [
    {
        "text": "Let me read the frame first.",
        "tool_calls": [{"name": "read_frame", "input": {"shot": 3}}],
    },
    {"text": LONG},
]


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_deltas_reach_on_step_in_order_then_the_model_event_and_a_replay_emits_none(
    wire: str,
) -> None:
    journal = MemoryJournal()
    with SimServer(LOOP_SCRIPT, strict=True) as sim:
        events: list[Any] = []
        result = await run_tool_loop(loop_options(wire, sim, journal, events))
        calls = sim.stats()["requests"]
        replayed: list[Any] = []
        again = await run_tool_loop(loop_options(wire, sim, journal, replayed))
        assert sim.stats()["requests"] == calls  # the replay called nothing
    assert result.final_text == LONG.strip() or result.final_text == LONG
    kinds = [e.kind for e in events]
    assert kinds.index("model") > 0 and kinds[-1] == "model"
    for step in (1, 2):
        deltas = [e for e in events if isinstance(e, DeltaEvent) and e.step == step]
        model = next(e for e in events if isinstance(e, ModelEvent) and e.step == step)
        assert len(deltas) > 3 and "".join(d.text for d in deltas) == model.text
        # the ModelEvent follows
        assert max(events.index(d) for d in deltas) < events.index(model)
    assert again.final_text == result.final_text
    # no deltas on replay
    assert [e.kind for e in replayed] == [
        "model",
        "tool",
        "model",
    ]


def faulted(kind: str, **fields: Any) -> list[Any]:
    return [{"text": LONG, "fault": {"kind": kind, "after": 5, **fields}}]


def same_answer(
    result: PromptGenResult, expected: PromptGenResult, *, cut_attempts: int
) -> bool:
    """`result` is `expected` (the same request answered whole) with the cost of its cut attempts
    added (docs/providers.md, "Usage and cost")."""
    meta = dict(result.meta or {})
    cuts = meta.pop("cut_usd", [])
    meta.pop("cut_usage")
    meta["cost_source"] = meta["cost_source"].removesuffix("+cut")
    assert len(cuts) == cut_attempts and all(cut > 0 for cut in cuts)
    assert result.cost_usd == pytest.approx(expected.cost_usd + sum(cuts), abs=1e-9)
    answer = result.model_copy(update={"meta": meta, "cost_usd": expected.cost_usd})
    return answer.model_dump_json() == expected.model_dump_json()


@pytest.mark.parametrize(
    "keep_alive", [False, True], ids=["per-call client", "keep-alive client"]
)
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.parametrize("kind", ["stream_drop", "stream_error"])
async def test_a_stream_cut_or_failed_mid_way_is_retried_and_the_cut_attempt_counted(
    wire: str, kind: str, keep_alive: bool
) -> None:
    with SimServer(
        [{"text": LONG}], strict=True
    ) as clean:  # the same request twice: the cut attempt
        # had written the cache
        await handler(wire, clean).execute(request("text"), NEVER_ABORTED)
        expected = await handler(wire, clean).execute(request("text"), NEVER_ABORTED)
    fields = {"status": 529} if kind == "stream_error" else {}
    with SimServer(faulted(kind, **fields), strict=True) as sim:
        deltas: list[DeltaEvent] = []
        model = handler(wire, sim, keep_alive=keep_alive)
        result = await model.execute(
            request("text"), NEVER_ABORTED, on_delta=deltas.append
        )
        stats = sim.stats()
        await model.http.aclose()
    assert same_answer(result, expected, cut_attempts=1)
    # the retry read the prefix the cut attempt cached
    assert result.usage.cached_tokens > 0
    assert stats["faults"] == {kind: 1} and stats["requests"] == 2
    cut = deltas.index(DeltaEvent(discard=True))
    # the 5 pieces before the fault, in 1 to 5 deltas
    shown = "".join(d.text for d in deltas[:cut])
    assert (
        shown == LONG[: 5 * PIECE_CHARS]
        and "".join(d.text for d in deltas[cut + 1 :]) == LONG
    )
    assert DeltaEvent(discard=True) not in deltas[cut + 1 :]


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_an_overloaded_error_event_every_time_ends_as_the_http_529_would(
    wire: str,
) -> None:
    with SimServer(faulted("stream_error", status=529, times=None), strict=True) as sim:
        deltas: list[DeltaEvent] = []
        with pytest.raises(
            PromptGenError, match=r"HTTP 529.*\(2 attempts\)"
        ) as caught:  # each may be billed
            await handler(wire, sim).execute(
                request("text"), NEVER_ABORTED, on_delta=deltas.append
            )
    assert caught.value.status == 529 and caught.value.retryable
    assert deltas[-1] == DeltaEvent(discard=True)  # what was shown is void


@pytest.mark.parametrize(
    "keep_alive", [False, True], ids=["per-call client", "keep-alive client"]
)
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_the_timeout_is_idle_between_events_not_a_cap_on_the_answer(
    wire: str, keep_alive: bool
) -> None:
    slow = [{"text": LONG, "tokens_per_s": 40}]  # ~110 pieces: about 2.8 s, 25 ms apart
    with SimServer(slow, strict=True) as sim:
        model = handler(wire, sim, timeout_s=0.5, keep_alive=keep_alive)
        result = await model.execute(
            request("text"), NEVER_ABORTED, on_delta=lambda d: None
        )
        await model.http.aclose()
    assert result.text == LONG
    stalled = faulted("stall", seconds=1.0, times=None)
    with SimServer(stalled, strict=True) as sim:
        model = handler(
            wire,
            sim,
            timeout_s=0.3,
            retry=RetryPolicy(attempts=2, base_delay_s=0.01),
            keep_alive=keep_alive,
        )
        with pytest.raises(
            PromptGenError,
            match=r"sent nothing for 0\.3 s in the middle of its streamed",
        ):
            await model.execute(request("text"), NEVER_ABORTED, on_delta=lambda d: None)
        assert sim.stats()["faults"] == {"stall": 2}
        await model.http.aclose()


async def test_anthropic_streams_a_call_above_the_sdk_non_streaming_limit_without_on_delta() -> (
    None
):
    bodies: list[dict[str, Any]] = []

    def policy(sim_request: SimRequest) -> SimTurn:
        bodies.append(sim_request.body)
        return SimTurn(text="A long answer, in time.")

    with SimServer(policy, strict=True) as sim:
        model = handler("anthropic", sim)
        big = request("text").model_copy(
            update={"params": {"reasoning": "off", "max_tokens": 30_000}}
        )
        long_answer = await model.execute(big, NEVER_ABORTED)
        short_answer = await model.execute(request("text"), NEVER_ABORTED)
    assert long_answer.text == short_answer.text == "A long answer, in time."
    assert [body.get("stream") for body in bodies] == [True, None]


def held(seconds: float) -> Any:
    """A context in which streamed calls hold their reads (toolloop.deltas.READ_HOLD)."""
    return contextlib.contextmanager(_held)(seconds)


def _held(seconds: float) -> Iterator[None]:
    token = READ_HOLD.set(seconds)
    try:
        yield
    finally:
        READ_HOLD.reset(token)


def timed(into: list[tuple[float, DeltaEvent]]) -> Any:
    return lambda delta: into.append((time.monotonic(), delta))


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_held_reads_pass_every_piece_once_in_order_one_delta_per_hold(
    wire: str,
) -> None:
    paced = [{"text": LONG, "tokens_per_s": 200}]  # 114 pieces 5 ms apart: about 0.57 s
    with SimServer(paced, strict=True) as sim:
        whole = await handler(wire, sim).execute(request("text"), NEVER_ABORTED)
        sim.reset()
        model = handler(wire, sim, keep_alive=True)
        each: list[tuple[float, DeltaEvent]] = []
        streamed = await model.execute(
            request("text"), NEVER_ABORTED, on_delta=timed(each)
        )
        sim.reset()
        gathered: list[tuple[float, DeltaEvent]] = []
        with held(0.1):
            kept = await model.execute(
                request("text"), NEVER_ABORTED, on_delta=timed(gathered)
            )
        await model.http.aclose()
    assert (
        streamed.model_dump_json() == whole.model_dump_json() == kept.model_dump_json()
    )
    assert (
        "".join(d.text for _, d in gathered) == "".join(d.text for _, d in each) == LONG
    )
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(gathered)]
    # a delta per hold, not per piece
    assert len(gathered) <= 0.6 / 0.1 + 3 < len(LONG) // PIECE_CHARS
    assert min(gaps) >= 0.09, gaps  # nothing read while held
    assert len(each) > 2 * len(gathered)  # without the hold, reads as the pieces come


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.parametrize("kind", ["stream_drop", "stream_error"])
async def test_a_stream_cut_or_failed_while_reads_are_held_is_retried_the_same(
    wire: str, kind: str
) -> None:
    with SimServer([{"text": LONG}], strict=True) as clean:
        await handler(wire, clean).execute(request("text"), NEVER_ABORTED)
        expected = await handler(wire, clean).execute(request("text"), NEVER_ABORTED)
    fields = {"status": 529} if kind == "stream_error" else {}
    paced = [
        {
            "text": LONG,
            "tokens_per_s": 200,
            "fault": {"kind": kind, "after": 30, **fields},
        }
    ]
    with SimServer(paced, strict=True) as sim, held(0.05):
        deltas: list[DeltaEvent] = []
        model = handler(wire, sim, keep_alive=True)
        result = await model.execute(
            request("text"), NEVER_ABORTED, on_delta=deltas.append
        )
        stats = sim.stats()
        await model.http.aclose()
    assert same_answer(result, expected, cut_attempts=1)
    assert stats["faults"] == {kind: 1} and stats["requests"] == 2
    cut = deltas.index(DeltaEvent(discard=True))
    assert "".join(d.text for d in deltas[:cut]) == LONG[: 30 * PIECE_CHARS]
    assert "".join(d.text for d in deltas[cut + 1 :]) == LONG and len(deltas) < 40


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_held_reads_keep_the_idle_timeout_between_events(wire: str) -> None:
    stall = {"kind": "stall", "seconds": 1.2, "after": 20, "times": None}
    with (
        SimServer(
            [{"text": LONG, "tokens_per_s": 200, "fault": stall}], strict=True
        ) as sim,
        held(0.05),
    ):
        model = handler(
            wire,
            sim,
            timeout_s=0.5,
            retry=RetryPolicy(attempts=2, base_delay_s=0.01),
            keep_alive=True,
        )
        try:
            with pytest.raises(
                PromptGenError, match=r"sent nothing for 0\.5 s in the middle of its"
            ):
                await model.execute(
                    request("text"), NEVER_ABORTED, on_delta=lambda d: None
                )
        finally:
            await model.http.aclose()
        await asyncio.sleep(1.0)  # the simulator's stalled answer ends before it stops
    with SimServer([{"text": LONG, "tokens_per_s": 40}], strict=True) as sim, held(1.0):
        # the hold: cut to half the timeout
        model = handler(wire, sim, timeout_s=0.5, keep_alive=True)
        try:
            result = await model.execute(
                request("text"), NEVER_ABORTED, on_delta=lambda d: None
            )
        finally:
            await model.http.aclose()
    assert result.text == LONG
