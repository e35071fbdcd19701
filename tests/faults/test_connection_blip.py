"""Connection cuts with Redis alive: every client connection (the workers' consumers, journal and
cancel listener, the client's) is cut with `CLIENT KILL TYPE normal`, ten times, 0.3-0.8 s apart,
while runs go.

redis-py 8 reconnects and retries on its own, so most cuts pass unnoticed; some reach Celery ("lost
connection to broker": it restores its unacked messages, and the run's lease keeps a restored copy
from running a step that still runs) or fail a step's commit (the task fails, its message is acked,
the sweeper re-drives the run). So each cut allows the steps that began in the 2 s before it to run
once more; nothing else may run twice, and every run must end with the transcript and events of its
fault-free twin. A cut can also lose a message kombu had just popped: test_lost_messages.py.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from faults.policy import FaultPolicy
from faults.shapes import Shape, make_shape
from faults.toolset import read_effects
from faults.twins import run_twins
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol.records import FINAL

pytestmark = pytest.mark.faults

BLIPS = 10
IN_FLIGHT_S = 2.0  # longer than any step here (0.5 s model latency plus overhead)


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_connection_blips_never_run_a_step_twice_at_once(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    rng = random.Random(83)
    shapes = [
        dataclasses.replace(make_shape(f"blip{i}", rng), latency_s=0.5)
        for i in range(8)
    ]
    blips: list[float] = []
    cut_clients: list[int] = []

    def cut(client: Client, runs: dict[str, Shape], pool: WorkerPool) -> None:
        admin = redis.Redis.from_url(redis_server.url)
        time.sleep(1.0)
        while len(blips) < BLIPS and not all(
            client.status(r).status in FINAL for r in runs
        ):
            blips.append(time.time())
            cut_clients.append(
                int(
                    admin.execute_command(
                        "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                    )
                )
            )
            time.sleep(rng.uniform(0.3, 0.8))
        admin.close()

    policy = FaultPolicy(work_dir / "blip")
    with SimServer(policy) as sim:
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir / "blip",
            shapes,
            pool={"size": 2, "concurrency": 2},
            during=cut,
            timeout=240,
        )
    effects = read_effects(work_dir / "blip" / "fault")
    allowed: Counter[tuple[str, str]] = Counter()
    for (
        at
    ) in blips:  # a step that began shortly before a cut may have been in flight at it
        for effect in effects:
            if at - IN_FLIGHT_S <= effect["at"] <= at:
                allowed[(effect["kind"], effect["tag"])] += 1
    print(
        f"\nconnection blips: {len(blips)} cuts of {sum(cut_clients)} connections, "
        f"{twins.duplicates()} steps ran again"
    )
    # a cut between reconnects can find few to cut
    hits = sum(count >= 3 for count in cut_clients)
    assert len(blips) >= 4 and hits >= 4, (
        f"too few cuts to prove anything: {cut_clients}"
    )
    problems = twins.compare(allowed=allowed, what="connection blip: ")
    assert not problems, "\n".join(problems)
