"""`celery -A workers.app flower` on a Sentinel REDIS_URL (real sentinels: a primary, a replica and three
sentinels, tests/support/sentinel.py), with a real worker on the same URL: Flower lists the worker,
a run's steps as `toolloop.advance` tasks and the step queues with their lengths, and after a
graceful failover it shows the steps of a run made on the new primary (its event receiver follows
the primary through kombu's Sentinel transport; its broker page asks the sentinels on each request).
What Flower cannot do: its broker page reads through the first sentinel of the URL only (Flower's
`RedisSentinel` takes the first broker URL), so with that sentinel down the queue lengths are not
shown, while the tasks and workers still are (docs/operations.md, "Sentinel").

About 15 s (three sentinels, a failover and its rejoin; about 55 s before the sentinels ran
deploy/sentinel/demote-old-primary.sh), and it runs in the full tier only, not in CI:
`make faults-full`, or `TOOLLOOP_FAULTS=full .venv/bin/python -m pytest -q
tests/integration/test_flower_sentinel.py`; without TOOLLOOP_FAULTS=full it is skipped."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import ROOT, WORKER_ENV, Worker, start_worker
from tests.integration.runs_kit import eventually, spec
from tests.support.flower import running_flower
from tests.support.sentinel import SentinelSet
from workers.client import Client

FULL = os.environ.get("TOOLLOOP_FAULTS") == "full"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not FULL,
        reason="~15 s: the full tier only (TOOLLOOP_FAULTS=full, make faults-full)",
    ),
]

AUTH = ("watcher", "s3cret-pass")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    found = SentinelSet(tmp_path_factory.mktemp("flower-sentinel")).start()
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def flower(
    deployment: SentinelSet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = tmp_path_factory.mktemp("flower-on-sentinel") / "flower.log"
    env = {
        **os.environ,
        **WORKER_ENV,
        "REDIS_URL": deployment.url,
        "PYTHONPATH": str(ROOT),
    }
    with running_flower(env, log, AUTH, timeout_s=60) as url:
        yield url


@pytest.fixture(scope="module")
def worker(
    deployment: SentinelSet, flower: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    process = start_worker(
        deployment.url, tmp_path_factory.mktemp("flower-sentinel-worker"), env
    )
    yield process
    process.stop()


def api(url: str, path: str, **params: Any) -> Any:
    response = httpx.get(f"{url}{path}", params=params, auth=AUTH, timeout=10)
    response.raise_for_status()
    return response.json()


def run_and_see_its_steps(deployment: SentinelSet, flower: str) -> str:
    with Client(deployment.url) as client:
        run_id = client.enqueue(spec("tools", "Add 19 and 23."))
        assert client.wait(run_id, timeout=60).final_text == "The sum is 42."

    def steps() -> bool:
        tasks = api(flower, "/api/tasks", taskname="toolloop.advance")
        mine = {
            task_id: t for task_id, t in tasks.items() if task_id.startswith(run_id)
        }
        return sorted(mine) == [f"{run_id}:{n}" for n in (1, 2, 3)] and all(
            t["state"] == "SUCCESS" for t in mine.values()
        )

    eventually(steps, timeout=30)
    return run_id


def test_flower_on_sentinel_shows_workers_steps_and_queues_across_a_failover(
    deployment: SentinelSet, flower: str, worker: Worker
) -> None:
    prefix = worker.name.split("@")[0]
    eventually(
        lambda: any(prefix in name for name in api(flower, "/api/workers", refresh=1)),
        timeout=30,
    )
    run_and_see_its_steps(deployment, flower)
    queues = {
        q["name"]: q["messages"]
        for q in api(flower, "/api/queues/length")["active_queues"]
    }
    assert {"llm", "tools", "control"} <= set(queues) and all(
        isinstance(n, int) for n in queues.values()
    )

    before = deployment.primary_port()
    assert deployment.failover() != before
    # the demoted primary is a replica again (at once with the sentinels' demote script; ~10 s without)
    deployment.rejoined(before)
    # events from the new primary reach Flower
    run_and_see_its_steps(deployment, flower)
    assert {"llm", "tools", "control"} <= {
        q["name"] for q in api(flower, "/api/queues/length")["active_queues"]
    }


def test_flower_reads_queue_lengths_through_the_first_sentinel_only(
    deployment: SentinelSet, flower: str, worker: Worker
) -> None:
    first = deployment.sentinels[0]
    # the first sentinel stops answering (its port stays open)
    first.process.send_signal(signal.SIGSTOP)
    try:
        refused = httpx.get(f"{flower}/api/queues/length", auth=AUTH, timeout=30)
        assert refused.status_code >= 500
        began = time.monotonic()
        # its steps reach Flower: kombu asks other sentinels
        run_and_see_its_steps(deployment, flower)
        # a new client asks the hung sentinel once (a 2 s timeout), then the next: no retries (it
        # took ~27 s with redis-py 8's default of 10 retries, toolloop/redisurl.py `_timeouts`)
        assert time.monotonic() - began < 15
        assert (
            httpx.get(f"{flower}/api/workers", auth=AUTH, timeout=10).status_code == 200
        )
    finally:
        first.process.send_signal(signal.SIGCONT)
    assert api(flower, "/api/queues/length")["active_queues"]
