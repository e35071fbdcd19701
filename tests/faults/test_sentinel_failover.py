"""A failover drill with real processes: a primary, a replica and three sentinels (redis-server in
sentinel mode, what Debian's `redis-sentinel` runs), two workers on the `redis+sentinel://` URL, runs
of several tool turns, and failovers while they go. `TOOLLOOP_FAULTS=full` (make faults-full): the
issue's drill, 20 runs through five failovers (four graceful `SENTINEL FAILOVER`, one SIGKILL of the
primary); bounded (CI): 6 runs through one of each. With `TOOLLOOP_COMMIT_WAIT=1` every run finishes
with the transcript and events of its fault-free twin: no committed step is lost, and no finished
step runs again beyond the one re-run a step interrupted by a failover may take (docs/operations.md,
"Sentinel"). It prints how much longer each run took than its twin (not asserted: each failover
pauses commits until the demoted primary rejoins, about 10 s, against runs of a few seconds).
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest

from faults.conftest import FULL
from faults.policy import FaultPolicy
from faults.shapes import Shape, make_shape
from faults.toolset import read_effects
from faults.twins import run_twins
from tests.support.sentinel import SentinelSet
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol.records import RunStatus

pytestmark = pytest.mark.faults

WORKERS, THREADS = 2, 4
RUNS = 20 if FULL else 6
MOVES = (
    ("failover", "failover", "kill", "failover", "failover")
    if FULL
    else ("failover", "kill")
)
"""The issue's drill under TOOLLOOP_FAULTS=full: 20 runs, four graceful failovers and a SIGKILL; the
bounded one (CI) keeps one of each kind with 6 runs."""


@pytest.mark.timeout(600 if FULL else 300)
def test_runs_survive_failovers_and_a_kill_with_commit_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the test's Client too: its answers wait for a replica
    monkeypatch.setenv("TOOLLOOP_COMMIT_WAIT", "1")
    rng = random.Random(31)
    shapes = [
        dataclasses.replace(make_shape(f"sf{i}", rng), latency_s=0.3)
        for i in range(RUNS)
    ]
    policy = FaultPolicy(tmp_path)
    deployment = SentinelSet(tmp_path / "redis").start()
    moves: list[
        tuple[str, float, float]
    ] = []  # (how, began, primary takes writes again)
    phase_time: dict[str, float] = {}

    def during(client: Client, runs: dict[str, Shape], _pool: object) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
            client.status(r).steps > 0 for r in runs
        ) < min(5, RUNS):
            time.sleep(0.05)
        for how in MOVES:
            if all(client.status(r).finished for r in runs):
                break
            deployment.replicas_in_sync()
            began = time.time()
            deployment.kill_primary() if how == "kill" else deployment.failover()
            moves.append((how, began, time.time()))
            time.sleep(1.5)

    try:
        with SimServer(policy) as sim:
            started = time.monotonic()
            twins = run_twins(
                deployment.url,
                sim.base_url,
                policy,
                tmp_path,
                shapes,
                pool={"size": WORKERS, "concurrency": THREADS},
                fault_env={
                    "TOOLLOOP_COMMIT_WAIT": "1",
                    "TOOLLOOP_COMMIT_WAIT_MS": "2000",
                },
                ref_env={"TOOLLOOP_COMMIT_WAIT": "1"},
                during=during,
                timeout=240,
            )
            phase_time["all"] = time.monotonic() - started
        stalled = twins.stalled(deployment.url)
    finally:
        deployment.stop()
    slower = {
        s.tag: _took(twins.results[s.tag].status) / _took(twins.refs[s.tag].status)
        for s in shapes
    }
    print(
        f"\nsentinel drill: {RUNS} runs, {len(moves)} failovers "
        f"({', '.join(f'{how} {end - began:.1f} s' for how, began, end in moves)}); "
        f"{twins.duplicates()} steps ran again; both phases {phase_time['all']:.0f} s; a run's time "
        f"against its fault-free twin's: median {sorted(slower.values())[len(slower) // 2]:.2f}x, "
        f"max {max(slower.values()):.2f}x"
    )
    assert [how for how, _, _ in moves] == list(MOVES), (
        f"the runs ended after {moves}: make them longer"
    )
    unfinished = [s.tag for s in shapes if not twins.results[s.tag].status.finished]
    assert unfinished == [], (
        f"runs not finished after the failovers: {unfinished}\n{stalled}"
    )
    # a step may run again only when its first run began before a failover's end
    first_seen: dict[tuple[str, str], float] = {}
    for effect in read_effects(tmp_path / "fault"):
        first_seen.setdefault((effect["kind"], effect["tag"]), effect["at"])
    rerun = [u for u, count in twins.units.items() if count > twins.ref_units.get(u, 0)]
    last_end = max(end for _, _, end in moves)
    late = [u for u in rerun if first_seen.get(u, float("inf")) > last_end]
    assert late == [], f"steps first run after the last failover ran again: {late}"
    assert len(rerun) <= len(moves) * WORKERS * THREADS, (
        f"more re-runs than steps in flight: {rerun}"
    )
    problems = twins.compare(allowed={u: 1 for u in rerun}, what="sentinel drill: ")  # type: ignore[arg-type]
    assert not problems, "\n".join(problems)


def _took(status: RunStatus) -> float:
    """Seconds from the run's enqueue to its last change (its end, for a finished run)."""
    return (status.updated_at or 0.0) - (status.created_at or 0.0)
