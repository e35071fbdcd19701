"""The refreshed catalogue and the operator file end to end, over real HTTP to the simulator:
`claude-fable-5-2` runs at its catalogue price; a Haiku 5.5 prompt over 100K tokens is priced at its
tier; a TOOLLOOP_MODELS file read by a real worker process changes the cost the next run reports;
the simulator serves the models the file adds; and it enforces both API versions' rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Worker, sim_env, start_worker
from tests.integration.runs_kit import spec
from tests.support.sim import Recording
from tests.unit.providers_kit import FAKE_KEY
from toolloop import (
    AbortController,
    Budget,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    PromptGenRequest,
    RunToolLoopOptions,
    UserMessage,
    run_tool_loop,
)
from toolloop.embedded import EmbeddedServer
from toolloop.providers import AnthropicHandler, RetryPolicy
from toolloop.providers.models_file import ENV
from toolloop.sim import SimServer
from workers.client import Client

FAST = RetryPolicy(
    attempts=2,
    base_delay_s=0.01,
    max_delay_s=0.05,
    total_s=10.0,
    short_retry_after_s=1.0,
)
SCRIPT = [
    {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 20, "b": 22}}]},
    {"text": "It is 42."},
]


def expected_cost(usage: Any, rates: tuple[float, float, float, float, float]) -> float:
    """USD of one answer's usage at (input, output, cache read, 5m write, 1h write) per MTok."""
    get = usage.get if isinstance(usage, dict) else lambda name: getattr(usage, name)
    written_1h = get("cache_write_1h_tokens") or 0
    written_5m = get("cache_write_5m_tokens") or 0
    uncached = get("prompt_tokens") - get("cached_tokens") - get("cache_write_tokens")
    total = (
        uncached * rates[0]
        + get("completion_tokens") * rates[1]
        + get("cached_tokens") * rates[2]
        + written_5m * rates[3]
        + written_1h * rates[4]
    )
    return total / 1e6


def anthropic(sim: SimServer) -> AnthropicHandler:
    return AnthropicHandler(FAKE_KEY, base_url=sim.base_url, retry=FAST)


async def test_claude_fable_5_2_runs_on_the_simulator_at_its_catalogue_price() -> None:
    events: list[Any] = []
    with SimServer(Recording(["Reviewed: all good."])) as sim:
        options = RunToolLoopOptions(
            generate=PromptGen(
                {"anthropic": anthropic(sim)}, "anthropic"
            ).as_generate(),
            model="claude-fable-5-2",
            system="You review storyboards.",
            messages=[UserMessage(content="Review shot 1.")],
            tools=[],
            budget=Budget(usd=5.0),
            max_steps=3,
            step=MemoryJournal().step,
            on_step=events.append,
            reasoning="high",
        )
        result = await run_tool_loop(options)
        # a 404 before: the model was unknown
        assert sim.stats()["statuses"] == {"200": 1}
    assert result.stopped_by == "done" and result.final_text == "Reviewed: all good."
    (model,) = [e for e in events if isinstance(e, ModelEvent)]
    assert model.usage.prompt_tokens > 0 and model.usage.completion_tokens > 0
    # $8 in, $40 out (the model pages' lineup), $0.20 read (unconfirmed), 10 / 16 writes (derived)
    assert model.cost_usd == pytest.approx(
        expected_cost(model.usage, (8, 40, 0.20, 10, 16))
    )
    assert result.spent_usd == pytest.approx(model.cost_usd)


async def test_a_haiku_5_5_prompt_over_100k_tokens_costs_its_tier_over_real_http() -> (
    None
):
    with SimServer(Recording(["Short.", "Long."])) as sim:
        handler = anthropic(sim)
        short = PromptGenRequest(
            prompt="Classify this.",
            model="claude-haiku-5-5",
            params={"max_tokens": 100},
        )
        # ~112,500 simulator tokens
        long = short.model_copy(update={"system": "word " * 90_000})
        low = await handler.execute(short, AbortController().signal)
        high = await handler.execute(long, AbortController().signal)
    assert low.usage.prompt_tokens < 100_000 < high.usage.prompt_tokens
    assert low.cost_usd == pytest.approx(
        expected_cost(low.usage, (0.10, 0.50, 0.01, 0.125, 0.20))
    )
    assert high.cost_usd == pytest.approx(
        expected_cost(high.usage, (0.50, 2.50, 0.05, 0.625, 1.00))
    )
    assert high.cost_usd > 4.9 * expected_cost(
        high.usage, (0.10, 0.50, 0.01, 0.125, 0.20)
    )


# -- the operator file, through a real worker process ---------------------------------------------


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    from tests.integration.conftest import own_redis

    yield from own_redis(tmp_path_factory, "models-redis")


def run_once(
    redis: EmbeddedServer, sim: SimServer, directory: Path, extra: dict[str, str]
) -> tuple[float, Any]:
    """One durable run of claude-fable-5-2 through a fresh worker process with `extra` in its
    environment: the run's spent USD and its model events' usage."""
    worker = start_worker(redis.url, directory, sim_env(sim, **extra))
    client = Client(redis.url)
    try:
        run_id = client.enqueue(
            spec(
                "You add numbers.",
                model="claude-fable-5-2",
                provider="anthropic",
                cache="off",
            )
        )
        status = client.wait(run_id, timeout=30)
        assert status.status == "done", status
        usages = [e.data["usage"] for e in client.events(run_id) if e.kind == "model"]
        return status.spent_usd, usages
    finally:
        client.close()
        worker.stop()


def test_an_operator_price_changes_the_cost_the_next_run_reports(
    module_redis: EmbeddedServer, tmp_path: Path
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  claude-fable-5-2:\n    price: {input: 100, output: 1000}\n    source: ops override\n"
    )
    with SimServer(Recording(SCRIPT * 2)) as sim:
        before, usages = run_once(module_redis, sim, tmp_path, {})
        assert len(usages) == 2
        assert before == pytest.approx(
            sum(expected_cost(u, (8, 40, 0.20, 10, 16)) for u in usages)
        )
        after, usages = run_once(module_redis, sim, tmp_path, {ENV: str(models)})
        assert sim.stats()["requests"] == 4
    assert after == pytest.approx(
        sum(expected_cost(u, (100, 1000, 0.20, 10, 16)) for u in usages)
    )
    assert after > 10 * before


def test_a_worker_refuses_to_start_with_a_bad_operator_file(
    module_redis: EmbeddedServer, tmp_path: Path
) -> None:
    bad = tmp_path / "models.json"
    bad.write_text('{"models": {"claude-fable-5-2": {"price": {"input": NaN}}}}')
    worker = Worker(module_redis.url, tmp_path / "bad-worker.log", {ENV: str(bad)})
    try:
        with pytest.raises(RuntimeError, match="The worker exited at start") as caught:
            worker.wait_ready()
    finally:
        worker.stop()
    assert f"{ENV} ({bad}): claude-fable-5-2.price.input is nan, not a price." in str(
        caught.value
    )


# -- the simulator: the models the file adds, and both API versions ---------------------------------


def post(sim: SimServer, body: dict[str, Any], version: str) -> httpx.Response:
    headers = {"x-api-key": "k", "anthropic-version": version}
    return httpx.post(f"{sim.base_url}/v1/messages", headers=headers, json=body)


def test_the_simulator_serves_a_model_the_operator_file_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  claude-next:\n    like: claude-sonnet-5-5\n    price: {input: 3, output: 15}\n"
    )
    body = {
        "model": "claude-next",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    with SimServer(["Hi."], strict=False) as sim:
        # unknown without the file
        assert post(sim, body, "2026-10-21").status_code == 404
    monkeypatch.setenv(ENV, str(models))
    with SimServer(["Hi."], strict=False) as sim:
        answered = post(sim, body, "2026-10-21")
    assert answered.status_code == 200, answered.text


HI = [{"role": "user", "content": "Hi"}]
CITED = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "a", "citations": [{"type": "char_location"}]}
        ],
    }
]
SEARCH = [
    {
        "role": "user",
        "content": [
            {
                "type": "search_result",
                "source": "s",
                "title": "t",
                "content": [{"type": "text", "text": "a", "citations": [{"x": 1}]}],
            }
        ],
    }
]
DOCUMENT = [
    {"role": "user", "content": "Hi"},
    {
        "role": "assistant",
        "content": [{"type": "document", "source": {"type": "text", "data": "d"}}],
    },
]


@pytest.mark.parametrize(
    ("body", "version", "status", "message"),
    [
        (
            {"model": "claude-opus-4-8", "temperature": 0.5},
            "2026-10-21",
            400,
            "temperature: Extra inputs",
        ),
        (
            {"model": "claude-opus-4-8", "top_p": 0.9},
            "2026-10-21",
            400,
            "top_p: Extra inputs",
        ),
        (
            {"model": "claude-opus-4-8", "top_k": 5},
            "2026-10-21",
            400,
            "top_k: Extra inputs",
        ),
        (
            {"model": "claude-opus-4-8", "messages": CITED},
            "2026-10-21",
            400,
            "may not carry `citations`",
        ),
        (
            {"model": "claude-opus-4-8", "messages": SEARCH},
            "2026-10-21",
            400,
            "may not carry `citations`",
        ),
        (
            {"model": "claude-opus-4-8", "messages": DOCUMENT},
            "2026-10-21",
            400,
            "a `document` block may not",
        ),
        (
            {"model": "claude-opus-4-8", "temperature": 0.5},
            "2023-06-01",
            200,
            "",
        ),  # its row accepts it
        (
            {"model": "claude-opus-5-5", "top_k": 5},
            "2023-06-01",
            400,
            "top_k: is not supported",
        ),
        ({"model": "claude-opus-4-8"}, "2026-10-21", 200, ""),
        (
            {"model": "claude-opus-4-8"},
            "2025-01-01",
            400,
            "'2025-01-01' is not a known version",
        ),
    ],
)
def test_the_simulator_enforces_each_api_versions_rules(
    body: dict[str, Any], version: str, status: int, message: str
) -> None:
    with SimServer(["Hi."], strict=False) as sim:
        response = post(sim, {"max_tokens": 100, "messages": HI, **body}, version)
    assert response.status_code == status, response.text
    if message:
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert message in response.json()["error"]["message"]


def test_strict_mode_lets_2023_06_01_keep_its_sampling_fields() -> None:
    body = {
        "model": "claude-opus-4-8",
        "max_tokens": 100,
        "messages": HI,
        "temperature": 0.5,
    }
    with SimServer(["Hi."], strict=True) as sim:
        old = post(sim, body, "2023-06-01")
        new = post(sim, body, "2026-10-21")
    assert old.status_code == 200, old.text
    assert (
        new.status_code == 400
        and "temperature: Extra inputs are not permitted" in new.text
    )
