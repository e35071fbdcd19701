"""A durable run with `reasoning="medium"` whose worker is SIGKILLed mid-run (right after its second
model step committed): a fresh worker replays the run from its Redis journal and the requests it
sends carry every earlier answer's reasoning exactly as the simulator signed it, first in its turn.
Through the anthropic provider and through fal, each as the worker builds them from the environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import FAST_RECOVERY, Worker, sim_env, start_worker
from tests.integration.reasoning_kit import emitted, sent_back
from tests.integration.runs_kit import client_on, eventually, logged, spec
from tests.support.sim import Recording
from toolloop import AssistantMessage
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.integration

SCRIPT = [
    {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 21, "b": 1}}]},
    {
        "tool_calls": [{"name": "add", "input": {"a": 23, "b": 1}}],
        "redacted_thinking": True,
    },
    {"text": "22 and 24."},
]
WIRES = {"anthropic": "claude-opus-5-5", "fal": "anthropic/claude-opus-5.5"}


@pytest.fixture(scope="module")
def recording() -> Recording:
    return Recording(SCRIPT)


@pytest.fixture(scope="module")
def sim(recording: Recording) -> Iterator[SimServer]:
    with SimServer(recording) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(sim_redis)


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_worker_killed_mid_run_resumes_and_sends_every_thinking_block_back_unchanged(
    sim_redis: EmbeddedServer,
    sim: SimServer,
    recording: Recording,
    client: Client,
    tmp_path: Path,
    wire: str,
) -> None:
    plan = tmp_path / "kill-plan.json"
    plan.write_text(json.dumps([{"point": "commit:after", "key": "s0/model:2"}]))
    env = sim_env(
        sim,
        tmp_path / "tools.jsonl",
        **FAST_RECOVERY,
        FAL_RUN_URL=sim.base_url,
        FAL_KEY="sim-key",
        TOOLLOOP_KILL_PLAN=str(plan),
    )
    system = f"You add numbers ({wire})."
    first: Worker = start_worker(sim_redis.url, tmp_path, env)
    second: Worker | None = None
    try:
        run_id = client.enqueue(
            spec(system, model=WIRES[wire], provider=wire, reasoning="medium")
        )
        # killed after model:2 committed
        eventually(lambda: Path(f"{plan}.log").exists(), timeout=30)
        first.kill()
        second = start_worker(sim_redis.url, tmp_path, env)
        status = client.wait(run_id, timeout=60)
        assert status.status == "done" and status.final_text == "22 and 24.", status
    finally:
        first.kill()
        if second is not None:
            second.stop()
    seen = recording.of(system)
    # no model call made twice
    assert [request.assistant_turns for request, _ in seen] == [
        0,
        1,
        2,
    ]
    assert [(line["a"], line["b"]) for line in logged(tmp_path / "tools.jsonl")] == [
        (21, 1),
        (23, 1),
    ]
    answers = [emitted(wire, request, turn) for request, turn in seen]
    assert all(answers), (
        "an answer without thinking (the setting must be the same for every step)"
    )
    for index, (request, _) in enumerate(seen):
        assert sent_back(wire, request.body) == answers[:index], f"request {index + 1}"
    history = [m for m in client.history(run_id) if isinstance(m, AssistantMessage)]
    kept: list[Any] = [[block.data for block in m.reasoning or []] for m in history]
    assert kept == answers
