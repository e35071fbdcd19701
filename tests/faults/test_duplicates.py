"""Duplicate deliveries: every step message sent three times at once, and a step that outlives the
visibility timeout (kombu re-delivers it while it still runs). Each step must run exactly once: the
run's lease and fencing token turn the extra copies away (DESIGN.md 4), and every run ends with the
transcript and events of its fault-free twin.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from pathlib import Path

import pytest

from faults.policy import FaultPolicy
from faults.shapes import Call, Shape, make_shape
from faults.twins import run_twins
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.names import ADVANCE
from workers.protocol.records import FINAL

pytestmark = pytest.mark.faults

SLOW_S = 6.0  # > TOOLLOOP_VISIBILITY_TIMEOUT of the fault phase (4 s, faults/workerpool.py FAST)


def _slow_shape(tag: str) -> Shape:
    call = Call("slow", {"tag": f"{tag}.0.0", "seconds": SLOW_S})
    return Shape(tag=tag, turns=((call,),), final=f"Slow work of {tag} done.")


def duplicate_every_step(client: Client, runs: dict[str, Shape], _pool: object) -> None:
    """Send two extra copies of each run's next `advance` task, back to back, as soon as it is due."""
    sent: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        live = 0
        for run_id in runs:
            status, n, queue = client.redis.hmget(
                keys.state(run_id), "status", "n", "queue"
            )  # type: ignore[misc]
            if status in FINAL:
                continue
            live += 1
            due = int(n or 0) + 1
            if status in ("queued", "running") and sent.get(run_id) != due:
                for _ in range(2):
                    client.celery.send_task(
                        ADVANCE,
                        args=[run_id, due],
                        queue=queue or "llm",
                        task_id=f"{run_id}:{due}",
                    )
                sent[run_id] = due
        if not live:
            return
        time.sleep(0.01)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_each_step_runs_once_under_duplicate_and_late_deliveries(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    rng = random.Random(31)
    # model calls of 0.2 s: each step stays due long enough for its copies to reach a worker while it
    # runs (a step that runs on the worker that committed its predecessor begins within a millisecond)
    dups = [
        dataclasses.replace(make_shape(f"dup{i}", rng), latency_s=0.2) for i in range(6)
    ]
    shapes = [*dups, _slow_shape("slow0"), _slow_shape("slow1")]
    policy = FaultPolicy(work_dir)
    calm = {"TOOLLOOP_VISIBILITY_TIMEOUT": "60", "TOOLLOOP_LEASE_MS": "30000"}
    with SimServer(policy) as sim:
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir,
            shapes,
            ref_env=calm,
            pool={"size": 2, "concurrency": 4},
            during=duplicate_every_step,
            timeout=180,
        )
    assert twins.pool is not None
    logs = "".join(path.read_text(errors="replace") for path in twins.pool.logs)
    # a copy is turned away by the lease (busy), by the commit it would make being made (stale, early),
    # or by the run no longer running (idle: it parked on its question, or ended)
    turned_away = len(
        re.findall(r"succeeded in [0-9.e-]+s: '(?:busy|stale|early|idle)'", logs)
    )
    slow_redelivered = sum(
        len(re.findall(rf"advance\[{run}:2\] received", logs)) > 3
        for run in [
            r.run_id for tag, r in twins.results.items() if tag.startswith("slow")
        ]
    )
    print(
        f"\nduplicates: {turned_away} extra copies turned away; slow steps re-delivered: {slow_redelivered}"
    )
    assert turned_away > len(shapes), (
        "the duplicate copies were never delivered: the test proves nothing"
    )
    assert slow_redelivered >= 1, (
        "no slow step was re-delivered by the visibility timeout"
    )
    problems = twins.compare(what="duplicates: ")
    assert not problems, "\n".join(problems)
    assert twins.duplicates() == 0
