"""A task message lost between Redis and a worker: kombu's BRPOP takes a message off the queue
before the worker records it as unacked, so a connection cut in that instant loses the message for
good (seen in test_connection_blip.py: an `answer` task popped, its reply lost, the run parked
forever). The state each loss leaves behind is built here directly, then the run must still finish:

- an `advance` message lost: the run is queued/running with no lease and nothing in its outbox; the
  sweeper re-drives it after TOOLLOOP_REDRIVE_AGE (6 s in the suite);
- a run's first `advance` message lost (the pool path, `--step-queues none`, pops with kombu's own
  BRPOP: a Redis restart in that instant loses it; test_redis_restart.py[pool] once left its last
  run queued that way): its outbox record is dated TOOLLOOP_REDRIVE_AGE ahead by the process that
  enqueued it (300 s by default in a web backend), and the workers' sweeper sends it again after
  *its own* TOOLLOOP_REDRIVE_AGE (it used to wait for the enqueuing process's 300 s);
- an `answer` message lost: the answer is in the run's inbox, the run is parked; the sweeper sends
  the `answer` task again once the inbox entry is older than TOOLLOOP_OUTBOX_AGE (found by
  test_connection_blip.py: the run used to stay parked forever).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from faults.policy import FaultPolicy
from faults.runs import spec_for
from faults.shapes import Call, Shape
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.names import LLM
from workers.protocol.spec import RunSpec
from workers.runs import lifecycle as runs

pytestmark = pytest.mark.faults


class LostOnTheWay:
    """A Celery app whose messages a worker popped and never saw (the broker took them, then lost them)."""

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        return None


def _shape(tag: str, ask: bool) -> Shape:
    first = (Call("note", {"tag": f"{tag}.0.0", "text": "fine"}),)
    if ask:
        first += (Call("ask", {"question": f"Go on with {tag}?"}),)
    return Shape(
        tag=tag,
        turns=(first, (Call("note", {"tag": f"{tag}.1.0", "text": "ok"}),)),
        final=f"{tag} done.",
    )


@pytest.fixture
def setup(redis_server: EmbeddedServer, work_dir: Path) -> Any:
    policy = FaultPolicy(work_dir / "lost")
    policy.phase = "fault"
    with SimServer(policy) as sim:
        env = {**base_env(sim.base_url), "TOOLLOOP_FAULTS_DIR": str(work_dir / "lost")}
        with WorkerPool(redis_server.url, work_dir, env, size=1, concurrency=2) as pool:
            client = Client(redis_server.url)
            yield client, policy, pool
            client.close()


@pytest.mark.timeout(120)
def test_a_lost_advance_message_is_redriven(setup: Any) -> None:
    client, policy, _ = setup
    shape = _shape("lostadv", ask=False)
    policy.add(shape)
    run_id = runs.create(
        client.redis, LostOnTheWay(), RunSpec.model_validate(spec_for(shape))
    )  # type: ignore[arg-type]
    # sent, popped, gone: nothing left to re-send
    client.redis.delete(keys.outbox(run_id))
    status = client.wait(run_id, timeout=60)
    assert status.status == "done", status


@pytest.mark.timeout(120)
def test_a_lost_answer_message_is_still_applied(setup: Any) -> None:
    client, policy, _ = setup
    shape = _shape("lostans", ask=True)
    policy.add(shape)
    run_id = client.enqueue(spec_for(shape))
    status = client.wait(run_id, timeout=30)
    assert status.status == "asked", status
    # Client.answer minus its lost task
    runs.store_answer(client.redis, run_id, status.segment, "Yes, go on.")
    # sweeps every 1 s; outbox age 1 s, re-drive age 6 s
    deadline = time.monotonic() + 20
    while (
        status := client.status(run_id)
    ).status == "asked" and time.monotonic() < deadline:
        time.sleep(0.2)
    status = client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))
    assert status.status == "done", (
        f"the answer in the inbox was never applied: {status}"
    )


@pytest.mark.timeout(120)
def test_a_lost_first_step_is_sent_again_after_the_workers_redrive_age(
    redis_server: EmbeddedServer, work_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A web backend with the default TOOLLOOP_REDRIVE_AGE (300 s) enqueues; its first step is popped
    off the queue and lost before any worker ran it (what kombu's BRPOP does when Redis dies before
    the pop is recorded in `unacked`). The workers (TOOLLOOP_REDRIVE_AGE 6 s, outbox age 1 s, a sweep
    every 1 s) send it again within their re-drive age, and the run finishes."""
    # the enqueuing process: the default
    monkeypatch.setenv("TOOLLOOP_REDRIVE_AGE", "300")
    shape = _shape("lostfirst", ask=False)
    policy = FaultPolicy(work_dir / "lostfirst")
    policy.phase = "fault"
    policy.add(shape)
    client = Client(redis_server.url)
    try:
        run_id = client.enqueue(spec_for(shape))
        # the worker's BRPOP took it; Redis died before `unacked`
        popped = client.redis.rpop(LLM)
        assert popped is not None and run_id in str(popped), (
            "the first step was not on the llm queue"
        )
        with SimServer(policy) as sim:
            env = {
                **base_env(sim.base_url),
                "TOOLLOOP_FAULTS_DIR": str(work_dir / "lostfirst"),
            }
            with WorkerPool(
                redis_server.url,
                work_dir,
                env,
                size=1,
                concurrency=2,
                step_queues="none",
            ):
                started = time.monotonic()
                status = client.wait(run_id, timeout=30)
                took = time.monotonic() - started
    finally:
        client.close()
    assert status.status == "done", status
    assert took < 6 + 1 + 1 + 10, f"the lost first step came back after {took:.1f} s"
