"""Delivery faults a worker must absorb: duplicate step messages, and a successor message lost
between a commit and its send (the outbox and the sweeper bring it back)."""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import redis_in
from tests.integration.runs_kit import client_on, kinds, logged, spec
from workers.client import Client
from workers.config.settings import Settings
from workers.protocol import keys
from workers.protocol.names import ADVANCE
from workers.protocol.spec import RunSpec
from workers.runs import lifecycle as runs


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_duplicate_step_messages_run_each_step_once(client: Client, worker) -> None:  # type: ignore[no-untyped-def]
    # sums print exactly
    a, b = (
        random.randint(1000, 49999),
        random.randint(1000, 49999),
    )
    user = f"Add {a} and {b}."
    run_id = client.enqueue(spec("tools", user=user))
    for n in (1, 1, 2, 2, 3, 3):  # each step delivered three times, some at once
        client.celery.send_task(
            ADVANCE, args=[run_id, n], queue="llm", task_id=f"{run_id}:{n}"
        )
    status = client.wait(run_id, timeout=20)
    assert status.status == "done"
    assert status.final_text == f"The sum is {a + b}."
    assert kinds(client, run_id) == ["queued", "model", "tool", "model", "finished"]
    assert len([e for e in logged(worker.model_log) if e["user"] == user]) == 2
    assert len([e for e in logged(worker.tool_log) if e.get("a") == a]) == 1


class BrokerDown:
    """A Celery app whose broker refuses every message."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_successor_that_could_not_be_sent_is_sent_by_the_sweeper(
    client: Client,
) -> None:
    run_spec = RunSpec.model_validate(spec("tools", user="Add 40 and 2."))
    run_id = runs.create(client.redis, BrokerDown(), run_spec)  # type: ignore[arg-type]
    assert client.redis.zrange(f"tl:{{{run_id}}}:outbox", 0, -1) == ["1|llm"]
    # the worker sweeps every 1 s, re-sends after 2 s
    status = client.wait(run_id, timeout=20)
    assert status.status == "done"
    assert status.final_text == "The sum is 42."


def test_steps_alternating_between_two_workers_replay_what_the_other_committed(
    client: Client,
    worker,
    runs_redis,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    from tests.integration.conftest import start_worker

    second = start_worker(
        runs_redis.url,
        tmp_path,
        {
            "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
            "TOOLLOOP_TEST_TOOL_LOG": str(worker.tool_log),
            "TOOLLOOP_TEST_MODEL_LOG": str(worker.model_log),
        },
    )
    try:
        user = f"count {random.randint(0, 10**9)}"
        run_ids = [client.enqueue(spec("count", user=f"{user} {i}")) for i in range(3)]
        for run_id in run_ids:
            status = client.wait(run_id, timeout=60)
            assert status.status == "done" and status.steps == 12, status
            history = client.history(run_id)
            assert [m.content[0].text for m in history if m.role == "tool"] == [  # type: ignore[union-attr]
                f"{turn + 1000}" for turn in range(1, 12)
            ]
            assert kinds(client, run_id) == ["queued"] + ["model", "tool"] * 11 + [
                "model",
                "finished",
            ]
        models = [e for e in logged(worker.model_log) if e["user"].startswith(user)]
        assert len(models) == 3 * 12  # every model step ran once, on whichever worker
        tools = [e for e in logged(worker.tool_log) if e.get("b") == 1000]
        assert len(tools) == 3 * 11  # each tool step ran once, on whichever worker
    finally:
        second.stop()


def test_a_tool_step_goes_to_the_tools_own_queue(
    client: Client, worker, runs_redis, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import start_worker
    from tests.integration.runs_kit import eventually

    run_id = client.enqueue(spec("gpu"))
    # the render step waits for a worker of "gpu"
    eventually(lambda: client.redis.llen("gpu") == 1)
    assert client.status(run_id).status == "running"
    assert kinds(client, run_id) == ["queued", "model"]
    gpu = start_worker(
        runs_redis.url,
        tmp_path,
        {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"},
        "gpu",
    )
    try:
        status = client.wait(run_id, timeout=20)
        assert status.status == "done", status
        assert status.final_text == "Rendered 9."
    finally:
        gpu.stop()


def test_a_run_whose_message_was_lost_without_a_trace_is_driven_again(
    client: Client,
) -> None:
    """No outbox entry, no lease, nothing moving for longer than the visibility timeout: the sweeper
    sends the step again (an early-acked or dropped message, a broker list lost in a Redis restart)."""
    run_spec = RunSpec.model_validate(spec("tools", user="Add 30 and 3."))
    run_id = runs.create(client.redis, BrokerDown(), run_spec)  # type: ignore[arg-type]
    client.redis.delete(f"tl:{{{run_id}}}:outbox")
    client.redis.hset(f"tl:{{{run_id}}}:state", "touched", 0)
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "The sum is 33."


def test_blocking_sync_tools_of_two_runs_run_at_once(client: Client) -> None:
    """Sync tools run off the worker's shared event loop: two runs whose sync tools each wait for the
    other both get through (on the loop itself, the first would block the second for its 10 s)."""
    me, partner = f"a{random.randint(0, 10**9)}", f"b{random.randint(0, 10**9)}"
    first = client.enqueue(spec("meet", user=f"{me} {partner}"))
    second = client.enqueue(spec("meet", user=f"{partner} {me}"))
    for run_id in (first, second):
        status = client.wait(run_id, timeout=30)
        assert (status.status, status.final_text) == ("done", "met"), status


def test_a_run_whose_keys_cannot_be_read_does_not_stop_the_sweep_of_the_others(
    client: Client,
) -> None:
    """A run in the live index whose state key holds a string (WRONGTYPE for HMGET), sorted first, is
    logged and skipped: the sweeper still re-sends the successor of the run after it."""
    broken = "broken-" + uuid.uuid4().hex
    client.redis.set(f"tl:{{{broken}}}:state", "not a hash")
    client.redis.zadd(keys.LIVE_RUNS, {broken: 0})  # first in the sweep's order
    run_spec = RunSpec.model_validate(spec("tools", user="Add 40 and 1."))
    run_id = runs.create(client.redis, BrokerDown(), run_spec)  # type: ignore[arg-type]
    # the worker sweeps every 1 s, re-sends after 2 s
    status = client.wait(run_id, timeout=20)
    assert status.status == "done"
    assert status.final_text == "The sum is 41."
    # still indexed: nothing was dropped or lost
    assert client.redis.zscore(keys.LIVE_RUNS, broken) == 0


def test_a_sweep_whose_lock_lapsed_stops_after_the_chunk_it_read(
    tmp_path: Path,
) -> None:
    """The worker's sweeper keeps the sweep lock after each chunk of live runs (LOCK_KEEP); once
    another worker holds it, the sweep stops there (`lost`) rather than sweep the rest beside it."""
    for server in redis_in(tmp_path):
        redis_client = redis.Redis.from_url(server.url, decode_responses=True)
        ended = [f"ended-{i:04d}" for i in range(runs.SWEEP_READ + 100)]
        for run_id in ended:
            redis_client.hset(keys.state(run_id), "status", "done")
        redis_client.zadd(keys.LIVE_RUNS, {run_id: i for i, run_id in enumerate(ended)})
        redis_client.set(keys.SWEEP_LOCK, "worker-a:1", px=60_000)
        kept = functools.partial(
            runs.keep_sweep_lock, redis_client, "worker-a:1", 60_000
        )
        assert kept()
        redis_client.set(keys.SWEEP_LOCK, "worker-b:1", px=60_000)  # another took it
        settings = Settings.from_env()
        done = runs.sweep(redis_client, BrokerDown(), settings, between=kept)  # type: ignore[arg-type]
        assert (done["ended"], done["lost"]) == (runs.SWEEP_READ, 1)
        assert redis_client.zcard(keys.LIVE_RUNS) == 100  # the rest: the next sweep's
        assert redis_client.get(keys.SWEEP_LOCK) == "worker-b:1"  # not taken back
        redis_client.set(keys.SWEEP_LOCK, "worker-a:1", px=60_000)
        done = runs.sweep(redis_client, BrokerDown(), settings, between=kept)  # type: ignore[arg-type]
        assert (done["ended"], done["lost"]) == (100, 0)
        assert redis_client.zcard(keys.LIVE_RUNS) == 0
        redis_client.close()
