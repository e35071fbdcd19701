"""A provider's wait is capped (toolloop/providers/retry.py MAX_RETRY_AFTER_S, a worker's
TOOLLOOP_MAX_RETRY_AFTER): a 429 with `retry-after: 1000000000` blocks that model in the shared
rate-limit key for at most the cap (3 s here; 300 s by default: tests/unit/test_input_ranges.py),
the worker logs the ask it capped, and a fresh run after the cap succeeds. Real worker, real Redis,
the simulator's fault injection over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import redis_in
from tests.integration.test_flow_runs import (
    bucket_of,
    run_spec,
    start_sim_worker,
    wait_all,
)
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from toolloop.sim.script import SimFault, SimRequest, SimTurn
from workers.client import Client

pytestmark = pytest.mark.integration

CAP_S = 3.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


def test_an_absurd_retry_after_blocks_the_model_for_at_most_the_cap(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    refused: list[float] = []
    lock = threading.Lock()

    def policy(request: SimRequest) -> SimTurn:
        with lock:
            if not refused:
                refused.append(time.time())
                return SimTurn(fault=SimFault(status=429, retry_after=1_000_000_000))
        return SimTurn(text="Done.")

    limits = json.dumps({"anthropic": {"*": {"requests_per_minute": 6000}}})
    with SimServer(policy) as sim:
        env = {"TOOLLOOP_RATE_LIMITS": limits, "TOOLLOOP_MAX_RETRY_AFTER": str(CAP_S)}
        worker = start_sim_worker(own_redis.url, sim, tmp_path, **env)
        client = Client(own_redis.url)
        plain = redis.Redis.from_url(own_redis.url, decode_responses=True)
        try:
            (first,) = wait_all(client, [client.enqueue(run_spec())], timeout=30)
            blocked = float(
                plain.hget(
                    bucket_of("anthropic", "ANTHROPIC_API_KEY", "sim-key"), "blocked"
                )
                or 0
            )
            started = time.monotonic()
            (fresh,) = wait_all(client, [client.enqueue(run_spec())], timeout=30)
            took = time.monotonic() - started
        finally:
            worker.stop()
            client.close()
            plain.close()
        log = worker.log.read_text(errors="replace")
    assert refused, "the simulator never refused a call"
    assert first.status == "failed" and "HTTP 429" in (first.error_message or ""), first
    # not 31 years
    assert 0 < blocked / 1000 - refused[0] <= CAP_S + 1, (
        blocked,
        refused,
    )
    assert "longer than the cap of 3 s" in log
    assert fresh.status == "done" and fresh.final_text == "Done.", fresh
    assert took < CAP_S + 10, took
