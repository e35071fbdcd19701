"""No whole-answer cap shorter than the answer can take (toolloop/providers/timeouts.py), on a real
worker against the simulator on a scaled clock (tests/integration/scaled_model.py: the simulator's
time and the handler's timeouts both x 0.01). Each model call takes 190 s of generation: longer
than the 180 s the anthropic handler used to wait, shorter than the SDK's 10 minutes. The run
finishes `done` with each call made once; with max_tokens 32,000 (an expected 900 s, over the
SDK's non-streaming limit) every request is streamed, counted at the simulator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import sim_env, start_worker
from tests.integration.runs_kit import client_on, spec
from tests.integration.scaled_model import SCALE
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

GENERATION_S = 190.0
ADD = {"name": "add", "input": {"a": 20, "b": 22}}
SCRIPT = [
    {"text": "Adding.", "tool_calls": [ADD], "generation_s": GENERATION_S},
    {"text": "It is 42.", "generation_s": GENERATION_S},
]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SCRIPT, time_scale=SCALE) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(sim_redis)


@pytest.mark.parametrize(
    ("max_tokens", "streamed"), [(None, 0), (32_000, 2)], ids=["default", "32000"]
)
@pytest.mark.timeout(90)
def test_a_run_of_190_s_answers_finishes_with_each_call_made_once(
    sim_redis: EmbeddedServer,
    sim: SimServer,
    client: Client,
    tmp_path: Path,
    max_tokens: int | None,
    streamed: int,
) -> None:
    env = sim_env(sim, TOOLLOOP_PROMPT_GEN="tests.integration.scaled_model:prompt_gen")
    if max_tokens is not None:
        env["TOOLLOOP_TEST_MAX_TOKENS"] = str(max_tokens)
    worker = start_worker(sim_redis.url, tmp_path, env)
    try:
        sim.reset()
        run_id = client.enqueue(
            spec("You add numbers.", model="claude-sonnet-5-5", provider="anthropic")
        )
        status = client.wait(run_id, timeout=60)
    finally:
        worker.stop()
    assert status.status == "done", status
    assert status.final_text == "It is 42."
    stats = sim.stats()
    # each call once, none cut
    assert stats["requests"] == 2 and stats["statuses"] == {"200": 2}
    # 32,000 tokens: only streamed requests
    assert stats["streamed"].get("anthropic", 0) == streamed
