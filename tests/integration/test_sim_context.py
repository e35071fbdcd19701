"""Anthropic context management on the simulator (SPEC.md 5.3, toolloop/sim/context.py), over HTTP:
a run with threshold compaction gets a signed compaction block, sends it back unchanged (in a body
the SDK's beta types accept), and its replay calls nothing; a run with context editing gets its old
tool results cleared and the cache broken from there; the simulator refuses what the API refuses
(no beta header, a tampered or missing signature, an empty summary, a trigger under 50,000) with
the API's error envelope."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from toolloop import (
    AssistantMessage,
    Budget,
    CompactionEvent,
    ContextPolicy,
    LoopEvent,
    MemoryJournal,
    ModelEvent,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.sim import SimRequest, SimServer

MODEL = "claude-sonnet-5-5"
TURNS = 12
PAGE_TOKENS = 12_000


class Page(BaseModel):
    page: int


def read_page(input: Page, signal: AbortSignal) -> ToolOutput:
    line = f"page {input.page}: 03:1{input.page % 10} db-1 slow query 812 ms; "
    return ToolOutput(
        value=input.page, content=[TextPart(text=(line * 2000)[: PAGE_TOKENS * 4])]
    )


TOOLS = [
    ToolSpec(
        name="read_page",
        description="Read one page of the log.",
        schema=Page,
        run=read_page,
    )
]


@pytest.fixture()
def sim() -> Iterator[SimServer]:
    def policy(request: SimRequest) -> dict[str, Any]:
        n = request.assistant_turns
        if n >= TURNS - 1:
            return {"text": f"Read {n} pages."}
        return {
            "text": f"Page {n}.",
            "tool_calls": [{"name": "read_page", "input": {"page": n + 1}}],
        }

    with SimServer(policy, strict=True) as server:
        yield server


class Recording(httpx.AsyncBaseTransport):
    """The real transport, keeping the body and beta header of every request as sent."""

    def __init__(self, bodies: list[dict[str, Any]] | None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies = bodies

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.bodies is not None:
            content = await request.aread()
            self.bodies.append(
                {
                    "body": json.loads(content),
                    "beta": request.headers.get("anthropic-beta"),
                }
            )
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run(
    sim: SimServer,
    context: ContextPolicy,
    journal: MemoryJournal,
    bodies: list[dict[str, Any]] | None = None,
    messages: list[Any] | None = None,
) -> tuple[RunToolLoopResult, list[LoopEvent]]:
    handler = AnthropicHandler("k", base_url=sim.base_url, transport=Recording(bodies))
    events: list[LoopEvent] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        return await handler.execute(request, signal)

    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model=MODEL,
            system="You read logs.",
            messages=messages or [UserMessage(content="Read the slow-query log.")],
            tools=TOOLS,
            budget=Budget(usd=100.0),
            max_steps=TURNS + 2,
            step=journal.step,
            on_step=events.append,
            context=context,
        )
    )
    return result, events


async def test_threshold_compaction_block_is_sent_back_signed_and_a_replay_calls_nothing(
    sim: SimServer,
) -> None:
    policy = ContextPolicy(server_compact_at_tokens=50_000)
    bodies: list[dict[str, Any]] = []
    journal = MemoryJournal()
    result, events = await run(sim, policy, journal, bodies)

    # every body was checked against the SDK's (beta) types
    assert sim.stats()["strict"] is True
    assert result.stopped_by == "done" and result.steps == TURNS
    compactions = [e for e in events if isinstance(e, CompactionEvent)]
    assert compactions and all(e.input_tokens >= 50_000 for e in compactions)
    blocks = [
        b
        for m in result.messages
        if isinstance(m, AssistantMessage)
        for b in m.reasoning or []
    ]
    assert [b.type for b in blocks] == ["compaction"] * len(compactions)
    assert all(b.data["encrypted_content"] and b.data["content"] for b in blocks)
    # every request carries the edit and its beta header; after a block, the block goes back verbatim
    # first in its assistant turn, and only the task precedes it
    assert all(
        b["body"]["context_management"] == {"edits": policy.edits()} for b in bodies
    )
    assert all("compact-2026-01-12" in (b["beta"] or "") for b in bodies)
    after = [b["body"] for b in bodies if any(_blocks_of(b["body"], "compaction"))]
    assert after
    latest = after[-1]
    assert latest["messages"][1]["content"][0] == blocks[-1].data
    assert latest["messages"][1]["role"] == "assistant"
    # billing: each compacting answer's cost sums its iterations (the summary pass is outside the top level)
    compacting = [
        e
        for e in events
        if isinstance(e, ModelEvent) and e.step in {c.step for c in compactions}
    ]
    assert all(e.usage.prompt_tokens > 50_000 for e in compacting)
    requests = sim.stats()["requests"]

    again, again_events = await run(sim, policy, journal)
    assert (
        sim.stats()["requests"] == requests
        and again == result
        and again_events == events
    )


async def test_a_conversation_that_goes_on_after_a_threshold_compaction_starts_at_its_block(
    sim: SimServer,
) -> None:
    """A second call over the first's messages and a follow-up (a durable run's next segment) sends
    the task, then the history from the latest compaction block on, as the first call's requests
    did after it: not the turns the block replaced, and its prefix is read from the cache."""
    policy = ContextPolicy(server_compact_at_tokens=50_000)
    first, _ = await run(sim, policy, MemoryJournal())
    cut = max(
        i
        for i, m in enumerate(first.messages)
        if isinstance(m, AssistantMessage)
        and any(b.type == "compaction" for b in m.reasoning or [])
    )
    assert cut > 1
    bodies: list[dict[str, Any]] = []
    follow_up = UserMessage(content="Now read the error log.")
    second, events = await run(
        sim, policy, MemoryJournal(), bodies, [*first.messages, follow_up]
    )
    assert second.stopped_by == "done"
    sent = bodies[0]["body"]["messages"]
    block = first.messages[cut].reasoning[0]  # type: ignore[union-attr]
    assert len(sent) == 1 + len(first.messages) - cut + 1
    assert sent[1]["role"] == "assistant" and sent[1]["content"][0] == block.data
    assert sent[-1]["role"] == "user"
    assert sent[-1]["content"][0]["text"] == follow_up.content
    usages = [e.usage for e in events if isinstance(e, ModelEvent)]
    assert usages[0].cached_tokens > 0.9 * usages[0].prompt_tokens


async def test_context_editing_clears_old_tool_results_and_breaks_the_cache_there(
    sim: SimServer,
) -> None:
    policy = ContextPolicy(
        clear_tool_results_at_tokens=40_000, keep_tool_results=1, clear_at_least=20_000
    )
    bodies: list[dict[str, Any]] = []
    result, events = await run(sim, policy, MemoryJournal(), bodies)

    assert result.stopped_by == "done"
    assert all("context-management-2025-06-27" in (b["beta"] or "") for b in bodies)
    usages = [e.usage for e in events if isinstance(e, ModelEvent)]
    # the history keeps every result; the requests stay under the trigger plus one page and an answer
    assert sum(1 for m in result.messages if m.role == "tool") == TURNS - 1
    assert max(u.prompt_tokens for u in usages) < 40_000 + PAGE_TOKENS + 2_000
    # a clearing request reads less from the cache than the one before it (its prefix changed)
    clears = [
        i
        for i in range(1, len(usages))
        if usages[i].prompt_tokens < usages[i - 1].prompt_tokens
    ]
    assert clears
    assert all(usages[i].cached_tokens < usages[i - 1].cached_tokens for i in clears)


def _blocks_of(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [
        block
        for turn in body["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
        if block.get("type") == kind
    ]


# -- refusals ----------------------------------------------------------------------------------------


def _post(
    sim: SimServer, body: dict[str, Any], beta: str | None = None
) -> httpx.Response:
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    if beta:
        headers["anthropic-beta"] = beta
    return httpx.post(
        f"{sim.base_url}/v1/messages", json=body, headers=headers, timeout=10
    )


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
        **extra,
    }


def _refused(response: httpx.Response, text: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()
    assert (
        error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    )
    assert text in error["error"]["message"]


def _signed(sim: SimServer) -> dict[str, Any]:
    """A compaction block this simulator made: one request over the trigger with a compact edit."""
    edit = {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": 50_000},
    }
    body = _body(context_management={"edits": [edit]})
    body["messages"] = [{"role": "user", "content": "word " * 260_000}]
    answer = _post(sim, body, "compact-2026-01-12")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    block = data["content"][0]
    assert (
        block["type"] == "compaction"
        and data["usage"]["iterations"][0]["type"] == "compaction"
    )
    assert [i["type"] for i in data["usage"]["iterations"]] == ["compaction", "message"]
    assert (
        data["usage"]["input_tokens"] == data["usage"]["iterations"][1]["input_tokens"]
    )
    return dict(block)


def _with_block(block: dict[str, Any]) -> dict[str, Any]:
    return _body(
        messages=[
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": [block, {"type": "text", "text": "Going on."}],
            },
            {"role": "user", "content": "Next."},
        ]
    )


def test_the_simulator_refuses_what_the_api_refuses(sim: SimServer) -> None:
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1000},
    }
    _refused(
        _post(sim, _body(context_management={"edits": [clear]})),
        "context-management-2025-06-27",
    )
    compact = {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": 10_000},
    }
    _refused(
        _post(
            sim, _body(context_management={"edits": [compact]}), "compact-2026-01-12"
        ),
        "at least 50000",
    )
    unknown = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1000},
        "x": 1,
    }
    _refused(
        _post(
            sim,
            _body(context_management={"edits": [unknown]}),
            "context-management-2025-06-27",
        ),
        "x",
    )

    block = _signed(sim)
    assert _post(sim, _with_block(block), "compact-2026-01-12").status_code == 200
    _refused(_post(sim, _with_block(block)), "compact-2026-01-12")  # no beta header
    tampered = {
        **block,
        "content": block["content"] + " And the keys are in the drawer.",
    }
    _refused(
        _post(sim, _with_block(tampered), "compact-2026-01-12"), "encrypted_content"
    )
    unsigned = {"type": "compaction", "content": block["content"]}
    _refused(
        _post(sim, _with_block(unsigned), "compact-2026-01-12"), "encrypted_content"
    )
    _refused(
        _post(sim, _with_block({**block, "content": ""}), "compact-2026-01-12"),
        "content",
    )
    # a failed compaction: a no-op, accepted
    failed = {
        "type": "compaction",
        "content": None,
    }
    assert _post(sim, _with_block(failed), "compact-2026-01-12").status_code == 200
    other = SimServer(lambda request: "hi")
    with other:  # a block another server signed is refused
        _refused(
            _post(other, _with_block(block), "compact-2026-01-12"), "encrypted_content"
        )


async def test_on_demand_compaction_sends_the_signed_block_first_in_place_of_the_turns_it_covers(
    sim: SimServer,
) -> None:
    """`on_demand`: the compaction step is Anthropic's own compaction request (the SDK's
    `BetaCompactionConfigParam`, beta compact-2026-09-04, never beside context_management); its block
    (signed) is journaled and sent first, in the assistant message at the cut, by every later request."""
    policy = ContextPolicy(
        compact_at_tokens=40_000,
        keep_turns=1,
        on_demand=True,
        clear_tool_results_at_tokens=90_000,
    )
    bodies: list[dict[str, Any]] = []
    journal = MemoryJournal()
    result, events = await run(sim, policy, journal, bodies)

    assert result.stopped_by == "done" and result.steps == TURNS
    compactions = [e for e in events if isinstance(e, CompactionEvent)]
    asks = [b for b in bodies if "compaction" in b["body"]]
    assert len(asks) == len(compactions) >= 2
    for ask in asks:
        assert (
            ask["body"]["compaction"] == {"type": "summarize"}
            and "context_management" not in ask["body"]
        )
        assert "compact-2026-09-04" in (ask["beta"] or "")
        # the history up to the cut, no prompt of ours
        assert ask["body"]["messages"][-1]["role"] == "user"
    stored = [
        json.loads(v)["value"]
        for k, v in journal.entries.items()
        if k.startswith("compact:")
    ]
    later = [
        b["body"]
        for b in bodies
        if "compaction" not in b["body"] and _blocks_of(b["body"], "compaction")
    ]
    assert later
    first = later[-1]["messages"][0]
    assert (
        first["role"] == "assistant"
        and first["content"][0] == stored[-1]["block"]["data"]
    )
    assert set(first["content"][0]) == {
        "type",
        "content",
        "encrypted_content",
        "signature",
    }
    # the history keeps every turn and no block; the replay calls nothing
    assert all(
        not m.reasoning for m in result.messages if isinstance(m, AssistantMessage)
    )
    requests = sim.stats()["requests"]
    again, again_events = await run(sim, policy, journal)
    assert (
        sim.stats()["requests"] == requests
        and again == result
        and again_events == events
    )


def test_on_demand_compaction_is_refused_beside_context_management_or_without_its_header(
    sim: SimServer,
) -> None:
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1000},
    }
    both = _body(
        compaction={"type": "summarize"}, context_management={"edits": [clear]}
    )
    _refused(
        _post(sim, both, "compact-2026-09-04,context-management-2025-06-27"),
        "cannot be combined",
    )
    _refused(_post(sim, _body(compaction={"type": "summarize"})), "compact-2026-09-04")
    answer = _post(sim, _body(compaction={"type": "summarize"}), "compact-2026-09-04")
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["stop_reason"] == "compaction" and [
        b["type"] for b in data["content"]
    ] == ["compaction"]
    block = data["content"][0]
    assert _post(sim, _with_block(block), "compact-2026-09-04").status_code == 200
    _refused(
        _post(
            sim,
            _with_block({**block, "signature": block["signature"][::-1]}),
            "compact-2026-09-04",
        ),
        "signature",
    )
