"""SIGKILL of a whole worker (its process group) in the middle of a step, then a restart.

A run is: model turn 0 (calls the `slow` tool), the tool, model turn 1 (final text). The model is
the provider simulator over real HTTP; it counts the requests of each turn of each conversation, and
the tool logs its start and its finish to a file. One test kills the worker while the simulator is
answering turn 0 (it waits 3 s on that turn), the other while the tool runs. After a fresh worker
starts, the run must finish with the fault-free transcript, and no step that had finished runs again:
the killed step itself runs twice (at-least-once for unfinished work), every other one once.

Recovery takes seconds because the workers run with a 6 s visibility timeout, kombu's unacked sweep
every 1 s with throttle 1 (CELERY-REDIS.md sections 1.1 and 5) and a 3 s lease.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import FAST_RECOVERY, Worker, sim_env, start_worker
from tests.integration.runs_kit import eventually, kinds, logged, spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client

pytestmark = pytest.mark.integration

MODEL_SLOW = "model-slow"  # the system text picks the scenario
TOOL_SLOW = "tool-slow"


class CountingModel:
    """The simulator's policy: turn 0 calls `slow`, turn 1 answers. Counts requests per turn."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turns: Counter[tuple[str, int]] = Counter()
        self.conversations: dict[
            str, str
        ] = {}  # scenario -> the simulator's conversation id

    def __call__(self, request: SimRequest) -> SimTurn:
        with self.lock:
            self.turns[(request.system or "", request.assistant_turns)] += 1
            self.conversations[request.system or ""] = request.conversation_id
        if request.assistant_turns == 0:
            seconds = 3.0 if request.system == TOOL_SLOW else 0.1
            return SimTurn(
                text="Waiting.",
                tool_calls=[{"name": "slow", "input": {"seconds": seconds}}],  # type: ignore[list-item]
                latency_s=3.0 if request.system == MODEL_SLOW else 0.0,
            )
        return SimTurn(text="Done waiting.")

    def count(self, scenario: str, turn: int) -> int:
        with self.lock:
            return self.turns[(scenario, turn)]


@pytest.fixture(scope="module")
def model() -> CountingModel:
    return CountingModel()


@pytest.fixture(scope="module")
def sim(model: CountingModel) -> Iterator[SimServer]:
    with SimServer(model) as server:
        yield server


def run_and_kill(
    sim_redis: EmbeddedServer,
    sim: SimServer,
    tmp_path: Path,
    scenario: str,
    killed_when: Callable[[], object],
) -> tuple[Client, str, Path]:
    """Enqueue a run, SIGKILL the worker's process group once `killed_when()` is true, start another
    worker, wait for the run to end. Returns the client, the run id and the tool log."""
    tool_log = tmp_path / "tools.jsonl"
    env = sim_env(sim, tool_log, **FAST_RECOVERY)
    first: Worker = start_worker(sim_redis.url, tmp_path, env)
    client = Client(sim_redis.url)
    second: Worker | None = None
    try:
        run_id = client.enqueue(
            spec(scenario, model="claude-sonnet-5-5", provider="anthropic")
        )
        eventually(killed_when, timeout=20)
        time.sleep(0.5)  # well inside the 3 s step
        first.kill()
        assert client.status(run_id).status == "running"
        second = start_worker(sim_redis.url, tmp_path, env)
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", (status, second.log.read_text()[-3000:])
        assert status.final_text == "Done waiting."
        return client, run_id, tool_log
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_kill_during_a_model_call_reruns_only_that_call(
    sim_redis: EmbeddedServer, sim: SimServer, model: CountingModel, tmp_path: Path
) -> None:
    client, run_id, tool_log = run_and_kill(
        sim_redis, sim, tmp_path, MODEL_SLOW, lambda: model.count(MODEL_SLOW, 0) >= 1
    )
    try:
        assert model.count(MODEL_SLOW, 0) == 2  # the killed call, then its rerun
        assert model.count(MODEL_SLOW, 1) == 1
        assert sim.stats()["conversations"][model.conversations[MODEL_SLOW]] == 3
        # the tool ran once
        assert [e["event"] for e in logged(tool_log)] == [
            "start",
            "finished",
        ]
        assert kinds(client, run_id) == ["queued", "model", "tool", "model", "finished"]
    finally:
        client.close()


def test_kill_during_a_tool_reruns_only_that_tool(
    sim_redis: EmbeddedServer, sim: SimServer, model: CountingModel, tmp_path: Path
) -> None:
    tool_log = tmp_path / "tools.jsonl"
    client, run_id, tool_log = run_and_kill(
        sim_redis,
        sim,
        tmp_path,
        TOOL_SLOW,
        lambda: tool_log.exists() and tool_log.read_text(),
    )
    try:
        # The finished model call is not made again; the killed tool starts again and finishes once.
        assert model.count(TOOL_SLOW, 0) == 1
        assert model.count(TOOL_SLOW, 1) == 1
        assert sim.stats()["conversations"][model.conversations[TOOL_SLOW]] == 2
        assert [e["event"] for e in logged(tool_log)] == ["start", "start", "finished"]
        assert kinds(client, run_id) == ["queued", "model", "tool", "model", "finished"]
    finally:
        client.close()
