"""Compaction (SPEC.md 5.2, docs/context.md) through the real provider adapters to the simulator over
HTTP: a compacting run's requests carry the summary and the recent turns (never a tool_use without its
tool_result), `result.messages` keeps every turn, a replay from the journal calls no model, a
compaction that would cross the budget is not started, on both wires."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from toolloop import (
    AssistantMessage,
    Budget,
    ChatMessage,
    CompactionEvent,
    CompactionState,
    ContextPolicy,
    LoopEvent,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolMessage,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.loop.context import COMPACT_PROMPT, SUMMARY_HEADER
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.fal import FalHandler
from toolloop.providers.models import default_catalog
from toolloop.sim import SimRequest, SimServer
from workers.protocol.spec import RunSpec

TURNS = 14
POLICY = ContextPolicy(compact_at_tokens=9000, keep_turns=2)
TASK = "Read every page of the incident log, then say what broke."


class Page(BaseModel):
    page: int


def read_page(input: Page, signal: AbortSignal) -> ToolOutput:
    # ~2.5K tokens
    text = (
        f"Page {input.page}: 03:0{input.page % 10} api-2 GET /orders 200 in 31 ms. "
        * 140
    )
    return ToolOutput(value=input.page, content=[TextPart(text=text)])


TOOLS = [
    ToolSpec(
        name="read_page",
        description="Read one page of the log.",
        schema=Page,
        run=read_page,
    )
]


@pytest.fixture()
def seen() -> list[SimRequest]:
    return []


@pytest.fixture()
def sim(seen: list[SimRequest]) -> Iterator[SimServer]:
    def policy(request: SimRequest) -> dict[str, Any]:
        seen.append(request)
        n = request.assistant_turns
        if n >= TURNS - 1:
            return {"text": f"Read {n} pages: api-2 lost its pool."}
        return {
            "text": f"Page {n}.",
            "tool_calls": [{"name": "read_page", "input": {"page": n + 1}}],
        }

    with SimServer(policy) as server:
        yield server


def handler_for(sim: SimServer, wire: str) -> tuple[AnthropicHandler | FalHandler, str]:
    if wire == "anthropic":
        return AnthropicHandler("k", base_url=sim.base_url), "claude-sonnet-5-5"
    return FalHandler("k", run_url=sim.base_url), "anthropic/claude-opus-5.5"


async def run(
    sim: SimServer,
    wire: str,
    journal: MemoryJournal,
    *,
    usd: float = 50.0,
    calls: list[PromptGenRequest] | None = None,
    messages: list[ChatMessage] | None = None,
    compacted: CompactionState | None = None,
) -> tuple[RunToolLoopResult, list[LoopEvent]]:
    handler, model = handler_for(sim, wire)
    events: list[LoopEvent] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        if calls is not None:
            calls.append(request)
        return await handler.execute(request, signal)

    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model=model,
            system="You read incident logs.",
            messages=messages or [UserMessage(content=TASK)],
            tools=TOOLS,
            budget=Budget(usd=usd),
            max_steps=TURNS + 2,
            step=journal.step,
            on_step=events.append,
            context=POLICY,
            compacted=compacted,
        )
    )
    return result, events


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_requests_after_a_compaction_carry_the_summary_then_the_recent_turns(
    sim: SimServer, seen: list[SimRequest], wire: str
) -> None:
    calls: list[PromptGenRequest] = []
    result, events = await run(sim, wire, MemoryJournal(), calls=calls)

    assert result.stopped_by == "done" and result.steps == TURNS
    compactions = [e for e in events if isinstance(e, CompactionEvent)]
    assert len(compactions) >= 2
    assert sim.stats()["compactions"] and sum(
        sim.stats()["compactions"].values()
    ) == len(compactions)
    # result.messages keeps every turn: the task, then one assistant message and one tool result per turn
    assert len(result.messages) == 1 + TURNS + (TURNS - 1)
    assert sum(isinstance(m, AssistantMessage) for m in result.messages) == TURNS
    summaries = [c for c in calls if _last_text(c) == COMPACT_PROMPT]
    assert len(summaries) == len(compactions)
    later = [
        c
        for c in calls
        if _last_text(c) != COMPACT_PROMPT and _summary_head(c) is not None
    ]
    assert later, "no request after a compaction"
    for request in later:
        messages = request.messages or []
        head = messages[0]
        assert isinstance(head, UserMessage) and not isinstance(head.content, str)
        # the task verbatim, then the summary
        assert head.content[0] == TextPart(text=TASK)
        assert messages[1].role == "assistant"  # the cut is at an assistant message
        opened = {
            c.id
            for m in messages
            if isinstance(m, AssistantMessage)
            for c in m.tool_calls or []
        }
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        assert answered <= opened  # no tool result without its call
    for index, request in enumerate(calls[:-1]):
        if (
            _last_text(request) == COMPACT_PROMPT
        ):  # right after it: the head and the kept turns
            assert len(calls[index + 1].messages or []) == 1 + 2 * POLICY.keep_turns
    # every request stays near the threshold (decided on the provider's count plus the estimate)
    limit = POLICY.compact_at_tokens or 0
    assert (
        max(e.usage.prompt_tokens for e in events if isinstance(e, ModelEvent))
        < 1.05 * limit
    )
    # the model saw each turn once and in order, compacted ones counted (the simulator's turn count)
    turns = [r.assistant_turns for r in seen]
    assert turns == list(range(TURNS))
    # the cost counts the summary calls
    model_cost = sum(e.cost_usd for e in events if isinstance(e, ModelEvent))
    assert result.spent_usd == pytest.approx(
        model_cost + sum(c.cost_usd for c in compactions)
    )
    assert all(c.cost_usd > 0 and c.covered_turns > 0 for c in compactions)


async def test_a_replay_of_a_finished_compacting_run_calls_no_model_and_returns_the_same(
    sim: SimServer,
) -> None:
    journal = MemoryJournal()
    first, first_events = await run(sim, "anthropic", journal)
    requests = sim.stats()["requests"]
    assert any(isinstance(e, CompactionEvent) for e in first_events)

    again, again_events = await run(sim, "anthropic", journal)

    assert sim.stats()["requests"] == requests  # no model call, no summary call
    assert again == first
    assert again_events == first_events
    # the steps are in the journal
    assert [k for k in journal.entries if k.startswith("compact:")]


async def test_a_compaction_that_would_cross_the_budget_is_not_started(
    sim: SimServer,
) -> None:
    _, probe = await run(sim, "anthropic", MemoryJournal())
    first = next(e for e in probe if isinstance(e, CompactionEvent))
    before = [
        e.cost_usd for e in probe if isinstance(e, ModelEvent) and e.step < first.step
    ]
    # the run can pay its next model call, not a summary call (about as dear as the latest call) on top
    usd = sum(before) + before[-1] / 2
    sim.reset()
    journal = MemoryJournal()

    result, events = await run(sim, "anthropic", journal, usd=usd)

    stored = {
        k: json.loads(v)["value"]
        for k, v in journal.entries.items()
        if k.startswith("compact:")
    }
    assert stored and all(
        value.get("skipped") == "budget" for value in stored.values()
    ), stored
    assert f"compact:{first.step}" in stored
    assert not any(isinstance(e, CompactionEvent) for e in events)
    assert not sim.stats()["compactions"]
    assert result.stopped_by == "budget"
    # the model call after the skipped compaction went ahead
    assert result.steps == first.step


async def test_a_call_that_goes_on_from_result_compacted_does_not_compact_the_whole_history_again(
    sim: SimServer,
) -> None:
    """`result.compacted` passed as `options.compacted` to the next call over the same history (a
    resume, a follow-up): its first request is the compacted one, and no summary call is made."""
    first, _ = await run(sim, "anthropic", MemoryJournal())
    assert first.compacted is not None and first.compacted.summary
    made = sum(sim.stats()["compactions"].values())
    follow_up = [*first.messages, UserMessage(content="And which pool?")]

    calls: list[PromptGenRequest] = []
    carried, _ = await run(
        sim,
        "anthropic",
        MemoryJournal(),
        calls=calls,
        messages=follow_up,
        compacted=first.compacted,
    )
    assert carried.stopped_by == "done"
    assert sum(sim.stats()["compactions"].values()) == made  # no summary call
    assert len(calls) == 1 and _summary_head(calls[0]) is not None
    assert carried.compacted == first.compacted
    assert carried.messages[: len(follow_up)] == follow_up

    # without it, the same call summarizes the whole history again
    calls.clear()
    await run(sim, "anthropic", MemoryJournal(), calls=calls, messages=follow_up)
    assert sum(sim.stats()["compactions"].values()) == made + 1
    with pytest.raises(ValueError, match="not an assistant message"):
        await run(
            sim,
            "anthropic",
            MemoryJournal(),
            messages=follow_up,
            compacted=first.compacted.model_copy(update={"cut": 0}),
        )


def _compact_values(journal: MemoryJournal) -> list[dict[str, Any]]:
    return [
        json.loads(v)["value"]
        for k, v in journal.entries.items()
        if k.startswith("compact:")
    ]


async def _run_through(generate: Any, model: str, journal: MemoryJournal) -> None:
    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model=model,
            system="You read incident logs.",
            messages=[UserMessage(content=TASK)],
            tools=TOOLS,
            budget=Budget(usd=50.0),
            max_steps=TURNS + 2,
            step=journal.step,
            context=POLICY,  # on_demand unset: the model's capability decides
        )
    )
    assert result.stopped_by == "done", result


async def test_the_catalogue_decides_on_demand_compaction_where_the_policy_leaves_it_open(
    sim: SimServer,
) -> None:
    """`on_demand` None: a model whose catalogue row has `on_demand_compaction` compacts with
    Anthropic's own summary (a signed block); the same model without it, and fal, make the
    client-side summary call."""
    assert POLICY.on_demand is None
    base = default_catalog()
    row = base.find("claude-sonnet-5-5")
    assert row is not None and not row.on_demand_compaction
    assert row.source("on_demand_compaction").kind == "unknown"
    able = base.with_models(dataclasses.replace(row, on_demand_compaction=True))

    chains = {
        "on demand": PromptGen(
            {"anthropic": AnthropicHandler("k", base_url=sim.base_url, catalog=able)},
            "anthropic",
        ),
        "default catalogue": PromptGen(
            {"anthropic": AnthropicHandler("k", base_url=sim.base_url)}, "anthropic"
        ),
        "fal": PromptGen({"fal": FalHandler("k", run_url=sim.base_url)}, "fal"),
    }
    models = {"fal": "anthropic/claude-sonnet-5.5"}
    blocks: dict[str, list[bool]] = {}
    for name, chain in chains.items():
        journal = MemoryJournal()
        model = models.get(name, "claude-sonnet-5-5")
        assert chain.supports("on_demand_compaction", model) is (name == "on demand")
        await _run_through(chain.as_generate(), model, journal)
        values = _compact_values(journal)
        assert values, name
        blocks[name] = ["block" in v for v in values]
    assert all(blocks["on demand"]), blocks
    assert not any(blocks["default catalogue"]) and not any(blocks["fal"]), blocks


def test_a_bad_policy_is_refused_before_any_work() -> None:
    with pytest.raises(ValidationError, match="compact_at_tokens"):
        ContextPolicy(compact_at_tokens=10)
    with pytest.raises(ValidationError, match="summary_prompt is blank"):
        ContextPolicy(compact_at_tokens=50_000, summary_prompt="  ")
    spec = RunSpec(
        model="m",
        messages=[UserMessage(content="hi")],
        context={"compact_at_tokens": 50_000},
    )
    assert spec.context == ContextPolicy(compact_at_tokens=50_000)
    assert RunSpec(model="m", messages=[UserMessage(content="hi")]).context is None


def _last_text(request: PromptGenRequest) -> str | None:
    last = (request.messages or [])[-1]
    if not isinstance(last, UserMessage) or isinstance(last.content, str):
        return None
    return last.content[-1].text if isinstance(last.content[-1], TextPart) else None


def _summary_head(request: PromptGenRequest) -> str | None:
    first = (request.messages or [])[0]
    if not isinstance(first, UserMessage) or isinstance(first.content, str):
        return None
    prefix = SUMMARY_HEADER.split("{turns}")[0]
    return next(
        (
            p.text
            for p in first.content
            if isinstance(p, TextPart) and p.text.startswith(prefix)
        ),
        None,
    )
