"""A durable run whose model is the provider simulator over real HTTP (providers.from_env in the
worker, ANTHROPIC_BASE_URL pointing at the simulator): the same code path as a real provider."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Worker, own_redis, start_worker
from tests.integration.runs_kit import kinds, logged, spec
from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.embedded import EmbeddedServer
from toolloop.sim import Script, SimRequest, SimServer, SimTurn
from workers.client import Client

SCRIPT = [
    {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 20, "b": 22}}]},
    {"text": "It is 42."},
]


class Recorded:
    """The script, keeping every request body it answered."""

    def __init__(self) -> None:
        self.script = Script(SCRIPT)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: SimRequest) -> SimTurn:
        self.bodies.append(request.body)
        return self.script(request)


@pytest.fixture(scope="module")
def policy() -> Recorded:
    return Recorded()


@pytest.fixture(scope="module")
def sim(policy: Recorded) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


@pytest.fixture(scope="module")
def sim_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Redis of its own: the scripted workers of the other tests must not take these runs."""
    yield from own_redis(tmp_path_factory, "sim-redis")


@pytest.fixture(scope="module")
def sim_worker(
    sim_redis: EmbeddedServer, sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    directory: Path = tmp_path_factory.mktemp("sim-worker")
    env = {
        "ANTHROPIC_BASE_URL": sim.base_url,
        "ANTHROPIC_API_KEY": "sim-key",
        "TOOLLOOP_PROMPT_GEN": "",
        "TOOLLOOP_TEST_TOOL_LOG": str(directory / "tools.jsonl"),
    }
    process = start_worker(sim_redis.url, directory, env)
    process.tool_log = directory / "tools.jsonl"
    yield process
    process.stop()


def test_a_run_against_the_simulator_calls_each_step_once(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker
) -> None:
    client = Client(sim_redis.url)
    try:
        run_id = client.enqueue(spec("You add numbers.", model="claude-sonnet-5-5", provider="anthropic"))
        status = client.wait(run_id, timeout=30)
        assert status.status == "done", status
        assert status.final_text == "It is 42."
        assert status.spent_usd > 0  # priced from the simulator's usage
        history = client.history(run_id)
        assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
        assert kinds(client, run_id) == ["queued", "model", "tool", "model", "finished"]
        assert sim.stats()["requests"] == 2
        assert [e["a"] for e in logged(sim_worker.tool_log)] == [20]
    finally:
        client.close()


def test_the_run_spec_carries_cache_ttl_and_reasoning_to_every_request(
    sim_redis: EmbeddedServer, sim: SimServer, sim_worker: Worker, policy: Recorded
) -> None:
    client = Client(sim_redis.url)
    try:
        system = "You add numbers, carefully. " * 200  # past the minimum cacheable prefix
        before = len(policy.bodies)
        fields = {"model": "claude-opus-5-5", "provider": "anthropic", "cache_ttl": "1h", "reasoning": "off"}
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
