"""TOOLLOOP_DELTA_INTERVAL_MS, through a real worker against the simulator over real HTTP: a
streaming run's delta entries are that far apart (the model call reads its stream at that pace once
text flows, toolloop.deltas.READ_HOLD), and they still carry every piece once, in order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Worker, sim_env, worker_on
from tests.integration.runs_kit import client_on, spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client

ANSWER = "The sum is 42. " * 40  # 150 pieces: 0.75 s at 200 tokens/s
INTERVAL_MS = 150


def policy(request: SimRequest) -> SimTurn:
    return SimTurn(text=ANSWER)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(policy, tokens_per_s=200) as server:
        yield server


@pytest.fixture(scope="module")
def interval_worker(
    sim_redis: EmbeddedServer, sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    directory: Path = tmp_path_factory.mktemp("stream-interval-worker")
    yield from worker_on(
        sim_redis.url,
        directory,
        sim_env(sim, TOOLLOOP_DELTA_INTERVAL_MS=str(INTERVAL_MS)),
    )


@pytest.fixture
def client(sim_redis: EmbeddedServer, interval_worker: Worker) -> Iterator[Client]:
    yield from client_on(sim_redis)


def ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def test_delta_entries_come_once_per_interval_and_carry_the_whole_answer(
    client: Client,
) -> None:
    run_id = client.enqueue(
        spec(
            "You add numbers.",
            user="Add.",
            model="claude-sonnet-5-5",
            provider="anthropic",
            stream=True,
        )
    )
    assert client.wait(run_id, timeout=60).status == "done"
    stored = list(client.events(run_id))
    model = next(e for e in stored if e.kind == "model")
    deltas = [e for e in stored if e.kind == "delta"]
    assert "".join(e.text for e in deltas) == model.text == ANSWER
    assert max(stored.index(e) for e in deltas) < stored.index(model)
    gaps = [ms(b.id) - ms(a.id) for a, b in itertools.pairwise(deltas[:-1])]
    # the last one goes with the model event
    assert gaps and min(gaps) >= INTERVAL_MS * 0.9 - 1, gaps
    assert len(deltas) <= 750 / INTERVAL_MS + 3  # about 6, where 50 ms gives about 16
