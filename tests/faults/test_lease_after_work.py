"""The lease lost after a step's work is done and before its commit: Redis goes away for longer than
the lease while model calls are in flight. Each call that came back keeps its paid answer and
retries its commit until Redis answers again: no other copy took the step meanwhile (the visibility
timeout and the re-drive age are far longer than the outage), so the commit's fence still holds and
the commit lands. Before, a step whose lease deadline passed gave its result up (`its result is lost
and the step runs again`) and the model call was paid twice (docs/workers.md, "Leases")."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from faults.policy import FaultPolicy
from faults.runs import spec_for
from faults.shapes import Call, Shape
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import start_server
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol.records import FINAL

pytestmark = pytest.mark.faults

LEASE_MS = 2000
AWAY_S = 3 * LEASE_MS / 1000


@pytest.mark.timeout(240)
def test_a_lease_lost_after_the_work_keeps_the_paid_result_while_the_fence_holds(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "redis")
    policy = FaultPolicy(tmp_path / "sim")
    shapes = [
        Shape(
            tag=f"kept{i}",
            turns=((Call("note", {"tag": f"kept{i}.0.0", "text": "ok"}),),),
            latency_s=0.4,
        )
        for i in range(8)
    ]
    for shape in shapes:
        policy.add(shape)
    timers = {
        "TOOLLOOP_LEASE_MS": str(LEASE_MS),
        "TOOLLOOP_VISIBILITY_TIMEOUT": "120",
        "TOOLLOOP_REDRIVE_AGE": "120",
    }
    try:
        with SimServer(policy) as sim:
            env = {
                **base_env(sim.base_url),
                **timers,
                "TOOLLOOP_FAULTS_DIR": str(tmp_path),
            }
            with WorkerPool(server.url, tmp_path, env, size=1, concurrency=16) as pool:
                client = Client(server.url)
                run_ids = [client.enqueue(spec_for(shape)) for shape in shapes]
                deadline = time.monotonic() + 30
                while (
                    sum(policy.counts.values()) < len(shapes)
                    and time.monotonic() < deadline
                ):
                    # every run's first call is in flight (answered after 0.4 s)
                    time.sleep(0.02)
                server.kill()
                # the answers come back; the leases pass their deadline
                time.sleep(AWAY_S)
                server.start()
                statuses: dict[str, str] = {}
                ends = time.monotonic() + 90
                while time.monotonic() < ends:
                    statuses = {r: client.status(r).status for r in run_ids}
                    if all(s in FINAL for s in statuses.values()):
                        break
                    time.sleep(0.5)
                logs = "".join(path.read_text(errors="replace") for path in pool.logs)
    finally:
        server.stop()
    assert Counter(statuses.values()) == {"done": len(shapes)}, statuses
    twice = {tag: count for tag, count in policy.counts.items() if count > 1}
    assert not twice, f"model calls paid more than once: {twice}"
    assert "its result is lost" not in logs, logs[-3000:]
    assert "the commit retried while the fence holds" in logs, logs[-3000:]
