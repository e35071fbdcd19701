"""`toolloop_queue_oldest_seconds` on a real worker's /metrics: steps wait on `llm` with no worker
consuming it, and the age the endpoint shows grows as the time goes (the clock of their `sent_at`);
a message without `sent_at` (another producer's) ages from the first scrape that saw it; once a
worker takes the queue, the runs finish and the age is 0 again."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import own_redis, start_worker
from tests.integration.runs_kit import eventually, spec
from toolloop.embedded import free_port
from workers.client import Client
from workers.protocol import wire

pytestmark = pytest.mark.integration

AGENTS = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}


def gauges(port: int, name: str) -> dict[str, float]:
    """The samples of `name` on the worker's /metrics, by queue."""
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        .read()
        .decode()
    )
    return {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_the_oldest_waiting_step_ages_until_a_worker_takes_its_queue(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    server = own_redis(tmp_path_factory, "queue-age-redis")
    url = next(server).url
    port = free_port()
    control = start_worker(
        url, tmp_path, {**AGENTS, "TOOLLOOP_METRICS_PORT": str(port)}, queues="control"
    )
    client = Client(url)
    raw = redis.Redis.from_url(url)
    steps = None
    try:
        assert gauges(port, "toolloop_queue_oldest_seconds") == {
            "llm": 0,
            "tools": 0,
            "control": 0,
        }
        sent = time.time()
        made = [client.enqueue(spec("tools", f"Add {i} and 1.")) for i in range(3)]
        legacy = json.loads(
            wire.task_message(
                "toolloop.advance", ["0" * 32, 1], "0" * 32 + ":1", "tools"
            ).raw
        )
        del legacy["headers"]["sent_at"]  # as a producer that does not write it
        raw.lpush("tools", json.dumps(legacy))
        time.sleep(0.5)
        first = gauges(port, "toolloop_queue_oldest_seconds")
        time.sleep(1.5)
        second = gauges(port, "toolloop_queue_oldest_seconds")
        waited = time.time() - sent
        assert gauges(port, "toolloop_queue_depth") == {
            "llm": 3,
            "tools": 1,
            "control": 0,
        }
        assert 0.4 <= first["llm"] < second["llm"] <= waited + 0.1
        assert second["llm"] - first["llm"] >= 1.4
        # from the first scrape
        assert first["tools"] < 0.5 and second["tools"] - first["tools"] >= 1.4
        assert second["control"] == 0
        raw.delete("tools")
        steps = start_worker(url, tmp_path, AGENTS, queues="llm,tools")
        for run_id in made:
            assert client.wait(run_id, timeout=60).status == "done"
        assert eventually(
            lambda: gauges(port, "toolloop_queue_oldest_seconds")["llm"] == 0
        )
        assert gauges(port, "toolloop_queue_oldest_seconds") == {
            "llm": 0,
            "tools": 0,
            "control": 0,
        }
    finally:
        if steps is not None:
            steps.stop()
        control.stop()
        client.close()
        raw.close()
        next(server, None)
