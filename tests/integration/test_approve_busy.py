"""A decision on a held call reaches its run while the worker's step consumer is full: the control
task does not wait for a step slot, so `Client.approve` returns as soon as the worker recorded it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import own_redis, start_worker
from tests.integration.runs_kit import eventually, kinds, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    # no other worker takes its runs
    yield from own_redis(tmp_path_factory, "approve-busy-redis")


ENV = {
    "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
    "TOOLLOOP_STEPS_IN_FLIGHT": "1",
}
"""The scripted model, and one step slot: a run's gate tool takes it."""


def test_approve_returns_at_once_while_every_step_slot_is_taken(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    worker = start_worker(server.url, tmp_path, ENV)
    client = Client(server.url)
    gate = tmp_path / "open"
    try:
        held_run = client.enqueue(spec("approve"))
        status = client.wait(held_run, timeout=20)
        assert status.approvals, status
        # its gate tool holds the one slot
        busy = client.enqueue(spec("gated_ask", str(gate)))
        eventually(lambda: "model" in kinds(client, busy))
        time.sleep(0.5)  # the gate step is running
        started = time.monotonic()
        outcome = client.approve(held_run, status.approvals[0]["call_id"])
        took = time.monotonic() - started
        assert outcome == "resumed"
        assert took < 2.0, f"approve took {took:.2f} s with the step slot taken"
        gate.touch()  # the slot is free again: the approved run's next step runs
        assert (
            client.wait(held_run, timeout=20).final_text == "Model read: published 2+3"
        )
        assert client.wait(busy, timeout=20).asked == {"question": "Which shot?"}
    finally:
        gate.touch()
        client.close()
        worker.stop()
