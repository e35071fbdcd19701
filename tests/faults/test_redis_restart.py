"""Redis is SIGKILLed in the middle of runs and restarted on the same directory (AOF on): every run
finishes, with the transcript and events of its fault-free twin.

A step that was in flight when Redis died may run again (its commit could not land: at-least-once
for unfinished work, docs/faults.md), so a second run of a step is allowed only for a step whose
first run began before Redis came back, and at most one per worker thread. Any other second run is
a finished step run twice.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from pathlib import Path

import pytest
import redis

from faults.policy import FaultPolicy
from faults.shapes import Shape, make_shape
from faults.toolset import read_effects
from faults.twins import run_twins
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.faults

THREADS = 4
STEP_QUEUES = {"consumer": "llm,tools,control", "pool": "none"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("steps", ["consumer", "pool"])
def test_every_run_finishes_across_a_redis_restart(
    redis_server: EmbeddedServer, redis_client: redis.Redis, work_dir: Path, steps: str
) -> None:
    """`steps`: on the step consumer (the default), or every step a Celery task in the threads pool
    (`--step-queues none`), where a step that fails on the lost connection is rejected back onto its
    queue rather than acked."""
    rng = random.Random(23)
    # the module's server and directory are shared: own tags, own files
    work_dir = work_dir / steps
    work_dir.mkdir()
    shapes = [
        dataclasses.replace(make_shape(f"rr{steps[0]}{i}", rng), latency_s=0.4)
        for i in range(8)
    ]
    policy = FaultPolicy(work_dir)
    # everysec lets a busy disk hold the AOF write back for ~2 s while Redis still replies, and a
    # SIGKILL then drops acknowledged writes (a whole enqueued run once, in a clean CI: docs/faults.md);
    # `always` closes that window, so a run missing after the restart is the workers' loss, not Redis's
    redis_client.config_set("appendfsync", "always")
    restarted = threading.Event()
    back_at: list[float] = []
    going: list[str] = []

    def during(client: Client, runs: dict[str, Shape], _pool: object) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the runs are under way
            if sum(client.status(run_id).steps > 0 for run_id in runs) >= 3:
                break
            time.sleep(0.05)
        going.extend(run_id for run_id in runs if not client.status(run_id).finished)
        redis_server.kill()
        time.sleep(1.0)
        redis_server.start()
        back_at.append(time.time())
        restarted.set()

    with SimServer(policy) as sim:
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir,
            shapes,
            pool={"size": 1, "concurrency": THREADS, "step_queues": STEP_QUEUES[steps]},
            during=during,
            timeout=180,
        )
    assert restarted.is_set()
    assert len(going) >= 4, f"only {len(going)} runs were still going when Redis died"
    print(
        f"\nredis restart ({steps}): {len(going)} of {len(shapes)} runs in flight at the kill; "
        f"{twins.duplicates()} steps ran again"
    )
    unfinished = [s.tag for s in shapes if not twins.results[s.tag].status.finished]
    assert unfinished == [], (
        f"runs not finished after the restart: {unfinished} (Redis back {time.time() - back_at[0]:.0f} s "
        f"ago)\n{twins.stalled(redis_server.url)}"
    )
    first_seen: dict[tuple[str, str], float] = {}
    for effect in read_effects(work_dir / "fault"):
        first_seen.setdefault((effect["kind"], effect["tag"]), effect["at"])
    rerun = [u for u, count in twins.units.items() if count > twins.ref_units.get(u, 0)]
    in_flight = [u for u in rerun if first_seen.get(u, float("inf")) < back_at[0]]
    assert len(in_flight) <= THREADS, (
        f"more re-runs than steps that can be in flight: {in_flight}"
    )
    problems = twins.compare(allowed={u: 1 for u in in_flight}, what="redis restart: ")  # type: ignore[arg-type]
    assert not problems, "\n".join(problems)
