"""The crash matrix (DESIGN.md 8): no finished step runs twice, no `start` runs twice, no run is lost,
every crashed run ends with the transcript and events of its fault-free twin. See faults/matrix.py.

Bounded by default (every kill point, 2 runs each); `TOOLLOOP_FAULTS=full` (make faults-full) runs
20 runs per point. The table is printed (use -s) and included in the failure message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faults.conftest import FULL
from faults.matrix import POINTS, run_matrix
from faults.policy import FaultPolicy
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer

pytestmark = pytest.mark.faults

RUNS = int(os.environ.get("TOOLLOOP_FAULTS_RUNS", "20" if FULL else "2"))
SEED = int(os.environ.get("TOOLLOOP_FAULTS_SEED", "7"))


@pytest.mark.timeout(3600 if FULL else 420)
def test_crash_matrix(redis_server: EmbeddedServer, work_dir: Path) -> None:
    policy = FaultPolicy(work_dir)
    with SimServer(policy) as sim:
        report = run_matrix(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir,
            list(POINTS),
            runs=RUNS,
            seed=SEED,
            workers=3 if FULL else 2,
            timeout=3000 if FULL else 300,
        )
        served = sim.stats()["requests"]
    # The policy is asked once per request the simulator served: its counts are the simulator's.
    assert served == sum(policy.counts.values()) + policy.unknown > 0
    print("\n" + report.table)
    print(f"worker deaths: {report.deaths}, planned kills fired: {report.kills}")
    assert len(POINTS) >= 10
    assert not report.problems, report.table + "\n" + "\n".join(report.problems[:30])
