"""A durable run whose model is the provider simulator over real HTTP (providers.from_env in the
worker, ANTHROPIC_BASE_URL pointing at the simulator): the same code path as a real provider."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import Worker
from tests.integration.runs_kit import kinds, logged, spec
from tests.support.sim import Recording
from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

SCRIPT = [
    {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 20, "b": 22}}]},
    {"text": "It is 42."},
]


@pytest.fixture(scope="module")
def policy() -> Recording:
    return Recording(SCRIPT)


@pytest.fixture(scope="module")
def sim(policy: Recording) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


def test_a_run_against_the_simulator_calls_each_step_once(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker
) -> None:
    client = Client(sim_redis.url)
    try:
        run_id = client.enqueue(
            spec("You add numbers.", model="claude-sonnet-5-5", provider="anthropic")
        )
        status = client.wait(run_id, timeout=30)
        assert status.status == "done", status
        assert status.final_text == "It is 42."
        assert status.spent_usd > 0  # priced from the simulator's usage
        history = client.history(run_id)
        assert [type(m) for m in history] == [
            UserMessage,
            AssistantMessage,
            ToolMessage,
            AssistantMessage,
        ]
        assert kinds(client, run_id) == ["queued", "model", "tool", "model", "finished"]
        assert sim.stats()["requests"] == 2
        assert [e["a"] for e in logged(sim_worker.tool_log)] == [20]
    finally:
        client.close()


def test_the_run_spec_carries_cache_ttl_and_reasoning_to_every_request(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker, policy: Recording
) -> None:
    client = Client(sim_redis.url)
    try:
        # past the minimum cacheable prefix
        system = "You add numbers, carefully. " * 200
        before = len(policy.bodies)
        fields = {
            "model": "claude-opus-5-5",
            "provider": "anthropic",
            "cache_ttl": "1h",
            "reasoning": "off",
        }
        run_id = client.enqueue(spec(system, **fields))
        status = client.wait(run_id, timeout=30)
        assert status.status == "done", status
        bodies = policy.bodies[before:]
        assert len(bodies) == 2
        marks = [b["system"][0]["cache_control"] for b in bodies]
        assert marks == [{"type": "ephemeral", "ttl": "1h"}] * 2
        # Opus 5.5 always thinks: "off" is the least effort, the same on both steps
        assert [(b["thinking"], b["output_config"]) for b in bodies] == [
            ({"type": "adaptive"}, {"effort": "low"})
        ] * 2
        model = [e for e in client.events(run_id) if e.kind == "model"]
        assert model[0].data["usage"]["cache_write_1h_tokens"] > 1024
    finally:
        client.close()
