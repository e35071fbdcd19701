"""Token counting (SPEC.md 5.1, docs/context.md "The input-token count"): near its threshold a
compacting run asks the provider to count the next request (Anthropic's `POST
/v1/messages/count_tokens`), journals the count as step `count:<n>` and decides on it; far from the
threshold, and on fal, the loop's own figure decides and nothing is counted; a replay counts
nothing again. The simulator serves the endpoint as the docs and the SDK's types have it (strict
mode: `MessageCountTokensParams`), the official SDK's `messages.count_tokens` included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from pydantic import BaseModel

from toolloop import (
    Budget,
    ContextPolicy,
    MemoryJournal,
    PromptGen,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.fal import FalHandler
from toolloop.sim import SimRequest, SimServer

MODEL = "claude-sonnet-5-5"
TURNS = 14
POLICY = ContextPolicy(compact_at_tokens=9000, keep_turns=2)


class Page(BaseModel):
    page: int


def read_page(input: Page, signal: AbortSignal) -> ToolOutput:
    text = f"Page {input.page}: api-2 GET /orders 200 in 31 ms. " * 180  # ~2.5K tokens
    return ToolOutput(value=input.page, content=[TextPart(text=text)])


TOOLS = [
    ToolSpec(name="read_page", description="Read one page.", schema=Page, run=read_page)
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


def _counted(sim: SimServer) -> int:
    return sum(sim.stats()["counted"].values())


def _steps(journal: MemoryJournal, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        key: json.loads(value)["value"]
        for key, value in journal.entries.items()
        if key.startswith(prefix)
    }


async def _run(
    generate: Any, model: str, journal: MemoryJournal, **options: Any
) -> RunToolLoopResult:
    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model=model,
            system="You read incident logs.",
            messages=[UserMessage(content="Read every page, then say what broke.")],
            tools=TOOLS,
            budget=Budget(usd=50.0),
            max_steps=TURNS + 2,
            step=journal.step,
            context=POLICY,
            **options,
        )
    )
    assert result.stopped_by == "done", result
    return result


def test_the_simulator_counts_a_request_as_the_sdk_asks_and_refuses_a_message_body(
    sim: SimServer,
) -> None:
    system = "You read logs. " * 400
    messages = [{"role": "user", "content": "Hello, Claude. " * 50}]
    tools = [
        {
            "name": "read_page",
            "description": "Read one page.",
            "input_schema": {
                "type": "object",
                "properties": {"page": {"type": "integer"}},
            },
        }
    ]
    client = anthropic.Anthropic(api_key="k", base_url=sim.base_url, max_retries=0)
    counted = client.messages.count_tokens(
        model=MODEL, system=system, messages=messages, tools=tools
    )
    answer = httpx.post(
        f"{sim.base_url}/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 64,
            "system": system,
            "messages": messages,
            "tools": tools,
        },
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        timeout=10,
    ).json()
    usage = answer["usage"]
    billed = (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )
    assert counted.input_tokens == billed > 1000
    # the beta namespace, with an edit and its header
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 50_000},
    }
    beta = client.beta.messages.count_tokens(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        context_management={"edits": [edit]},  # type: ignore[list-item]
        betas=["context-management-2025-06-27"],
    )
    assert beta.input_tokens > 0
    assert sim.stats()["endpoints"]["count_tokens"] == 2
    # a message's output fields are not a count's
    for extra in ({"max_tokens": 64}, {"stream": False}, {"temperature": 0.5}):
        refused = httpx.post(
            f"{sim.base_url}/v1/messages/count_tokens",
            json={"model": MODEL, "messages": messages, **extra},
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
            timeout=10,
        )
        assert refused.status_code == 400, refused.text
        assert "Extra inputs are not permitted" in refused.text
        assert next(iter(extra)) in refused.json()["error"]["message"]


async def test_near_the_threshold_the_provider_counts_once_per_step_and_a_replay_counts_nothing(
    sim: SimServer,
) -> None:
    chain = PromptGen(
        {"anthropic": AnthropicHandler("k", base_url=sim.base_url)}, "anthropic"
    )
    journal = MemoryJournal()
    first = await _run(chain.as_generate(), MODEL, journal)

    counts = _steps(journal, "count:")
    compactions = _steps(journal, "compact:")
    models = _steps(journal, "model:")
    assert counts, "no turn was near the threshold"
    assert len(counts) < len(models) / 2  # most turns cost no extra call
    assert all(v["count"] == "provider" for v in counts.values()), counts
    assert _counted(sim) == len(counts)  # one count request per count step
    margin = POLICY.count_margin * 9000
    for value in counts.values():
        assert abs(value["estimate"] - 9000) <= margin
    # a compaction that followed a count was decided on the provider's figure
    for key, value in compactions.items():
        turn = key.removeprefix("compact:")
        if f"count:{turn}" in counts:
            assert value["count"] == "provider"
            assert value["input_tokens"] == counts[f"count:{turn}"]["input_tokens"]
            assert value["input_tokens"] > 9000
    # a count at or under the threshold let the model call go ahead without compacting
    for key, value in counts.items():
        turn = key.removeprefix("count:")
        assert (f"compact:{turn}" in compactions) == (value["input_tokens"] > 9000)

    requests = sim.stats()["requests"]
    again = await _run(chain.as_generate(), MODEL, journal)
    assert again == first
    assert _counted(sim) == len(counts) and sim.stats()["requests"] == requests


async def test_fal_and_a_failed_count_decide_on_the_estimate(sim: SimServer) -> None:
    fal = PromptGen({"fal": FalHandler("k", run_url=sim.base_url)}, "fal")
    journal = MemoryJournal()
    await _run(fal.as_generate(), "anthropic/claude-opus-5.5", journal)
    assert not _steps(journal, "count:") and _counted(sim) == 0
    assert _steps(journal, "compact:")

    async def refused(request: PromptGenRequest, signal: AbortSignal) -> int | None:
        raise RuntimeError("count_tokens is down")

    chain = PromptGen(
        {"anthropic": AnthropicHandler("k", base_url=sim.base_url)}, "anthropic"
    )
    journal = MemoryJournal()
    await _run(chain.as_generate(), MODEL, journal, count_tokens=refused)
    counts = _steps(journal, "count:")
    assert counts and _counted(sim) == 0
    for value in counts.values():
        assert value["count"] in ("usage+estimate", "estimate")
        assert value["input_tokens"] == value["estimate"]
        assert "count_tokens is down" in value["error"]


async def test_the_count_decides_over_the_estimate(sim: SimServer) -> None:
    """A count under the threshold where the estimate is over it: no compaction at that turn."""

    async def small(request: PromptGenRequest, signal: AbortSignal) -> int | None:
        return 1000

    chain = PromptGen(
        {"anthropic": AnthropicHandler("k", base_url=sim.base_url)}, "anthropic"
    )
    journal = MemoryJournal()
    await _run(chain.as_generate(), MODEL, journal, count_tokens=small)
    counts = _steps(journal, "count:")
    compactions = _steps(journal, "compact:")
    assert counts and compactions
    over = [k for k, v in counts.items() if v["estimate"] > 9000]
    assert over, counts
    for key in over:  # the estimate said compact, the count said not
        assert f"compact:{key.removeprefix('count:')}" not in compactions
    # the compactions came later, far enough over the threshold not to be counted
    assert all(v["count"] != "provider" for v in compactions.values())
