"""A kill storm: workers SIGKILLed (whole process group) at random moments, again and again, while
runs go; a killed worker is restarted at once, and a step can be killed again while it recovers.

The crash matrix (test_crash_matrix.py) kills each run once at a named point; this test has no
hooks: kills land anywhere, several per run. Workers run one thread each, so a killed process had at
most one step in flight: the step of the last effect it logged may run once more per kill; nothing
else may run twice, and every run must end with the transcript and events of its fault-free twin.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from faults.conftest import FULL
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

KILLS = 20 if FULL else 6


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_runs_survive_a_kill_storm(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    rng = random.Random(71)
    shapes = [
        dataclasses.replace(make_shape(f"storm{i}", rng), latency_s=0.3)
        for i in range(8)
    ]
    kills: list[tuple[int, float]] = []

    def storm(client: Client, runs: dict[str, Shape], pool: WorkerPool) -> None:
        time.sleep(1.0)
        while len(kills) < KILLS:
            if all(client.status(run_id).status in FINAL for run_id in runs):
                return
            pid = rng.choice(pool.pids())
            kills.append((pid, time.time()))
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                kills.pop()
            time.sleep(rng.uniform(0.8, 2.5))

    policy = FaultPolicy(work_dir / "storm")
    with SimServer(policy) as sim:
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir / "storm",
            shapes,
            pool={"size": 2, "concurrency": 1},
            during=storm,
            timeout=300,
        )
    effects = read_effects(work_dir / "storm" / "fault")
    allowed: Counter[tuple[str, str]] = Counter()
    for pid, at in kills:
        before = [e for e in effects if e["pid"] == pid and e["at"] <= at]
        if before:
            allowed[(before[-1]["kind"], before[-1]["tag"])] += 1
    print(
        f"\nkill storm: {len(kills)} kills, {twins.duplicates()} steps ran again "
        f"(allowed {sum(allowed.values())})"
    )
    assert len(kills) >= min(KILLS, 3), (
        f"only {len(kills)} kills landed: the runs ended too soon to test anything"
    )
    problems = twins.compare(allowed=allowed, what="kill storm: ")
    assert not problems, "\n".join(problems)
