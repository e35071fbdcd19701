"""Limits that fail a run with a clear error and an intact journal: a step that outlives
TOOLLOOP_STEP_TIMEOUT, and a step delivered more than TOOLLOOP_MAX_DELIVERIES times."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Worker, own_redis, start_worker
from tests.integration.runs_kit import client_on, kinds, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol.spec import RunSpec
from workers.runs import lifecycle as runs


@pytest.fixture(scope="module")
def limits_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Redis of its own, so that only the impatient worker takes these runs."""
    yield from own_redis(tmp_path_factory, "limits-redis")


@pytest.fixture(scope="module")
def impatient_worker(
    limits_redis: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    directory: Path = tmp_path_factory.mktemp("impatient")
    env = {
        "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
        "TOOLLOOP_STEP_TIMEOUT": "1.5",
    }
    process = start_worker(limits_redis.url, directory, env)
    yield process
    process.stop()


@pytest.fixture
def client(limits_redis: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(limits_redis)


def test_a_step_past_the_step_timeout_fails_the_run(
    client: Client, impatient_worker: Worker
) -> None:
    run_id = client.enqueue(spec("slow"))  # its tool sleeps 30 s
    status = client.wait(run_id, timeout=20)
    assert status.status == "failed"
    assert status.error_class == "TimeoutError"
    assert status.error_message is not None
    first, second = status.error_message.split("\n")
    assert "longer than 1.5 s (TOOLLOOP_STEP_TIMEOUT)" in first and second.startswith(
        "  "
    )
    # the model step stayed journaled
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "failed",
    ]


class BrokerDown:
    def send_task(self, *args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_step_delivered_too_often_fails_the_run(
    client: Client, impatient_worker: Worker
) -> None:
    run_id = runs.create(
        client.redis,
        BrokerDown(),
        RunSpec.model_validate(spec("tools", user="Add 1 and 2.")),
    )  # type: ignore[arg-type]
    # five deliveries died before this one, four of them while it ran alone (workers/process/suspects.py)
    client.redis.hset(f"tl:{{{run_id}}}:attempts", mapping={"1": 5, "1:alone": 4})
    status = client.wait(run_id, timeout=20)  # the sweeper sends it: the sixth delivery
    assert status.status == "failed"
    assert status.error_class == "DeliveryLimitError"
    first, second = (status.error_message or "").split("\n")
    assert (
        "was delivered 6 times without finishing; 6 of them count" in first
        and second.startswith("  ")
    )


def test_deliveries_beside_a_crash_do_not_count(
    client: Client, impatient_worker: Worker
) -> None:
    """A step redelivered five times, but never while it ran alone among its worker's redelivered
    steps (its crashes were its neighbours'), is not charged for them: it runs and finishes."""
    run_id = runs.create(
        client.redis,
        BrokerDown(),
        RunSpec.model_validate(spec("tools", user="Add 1 and 2.")),
    )  # type: ignore[arg-type]
    client.redis.hset(f"tl:{{{run_id}}}:attempts", "1", 5)
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "The sum is 3."
