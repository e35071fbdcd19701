"""The crash matrix (DESIGN.md 8): no finished step runs twice, no `start` runs twice, no run is lost,
every crashed run ends with the transcript and events of its fault-free twin. See faults/matrix.py.

Twice: with 1 step slot per worker, and with SLOTS (8) slots and every run at once, so that each kill
ends several steps in flight (docs/faults.md). Bounded by default (every kill point, 2 runs each; 3
with many slots); `TOOLLOOP_FAULTS=full` (make faults-full) runs 20 runs per point. The table is
printed (use -s) and included in the failure message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faults.conftest import FULL
from faults.matrix import POINTS, Report, run_matrix
from faults.policy import FaultPolicy
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer

pytestmark = pytest.mark.faults

RUNS = int(os.environ.get("TOOLLOOP_FAULTS_RUNS", "20" if FULL else "2"))
SEED = int(os.environ.get("TOOLLOOP_FAULTS_SEED", "7"))
SLOTS = int(os.environ.get("TOOLLOOP_FAULTS_SLOTS", "8"))
"""Step slots per worker in the many-slot matrix (production workers run 500)."""
SLOT_RUNS = int(os.environ.get("TOOLLOOP_FAULTS_SLOT_RUNS", "20" if FULL else "3"))


@pytest.mark.timeout(3600 if FULL else 420)
@pytest.mark.slow
def test_crash_matrix(redis_server: EmbeddedServer, work_dir: Path) -> None:
    """One step slot per worker: each kill interrupts its own step (and a control task's bystander)."""
    _matrix(redis_server, work_dir / "one", runs=RUNS, slots=1)


@pytest.mark.timeout(3600 if FULL else 420)
@pytest.mark.slow
def test_crash_matrix_many_slots(redis_server: EmbeddedServer, work_dir: Path) -> None:
    """SLOTS step slots per worker, every run at once: a kill interrupts many steps in flight, and
    each may run again once, no more; no committed step runs again."""
    report = _matrix(redis_server, work_dir / "many", runs=SLOT_RUNS, slots=SLOTS)
    # the kills did interrupt several steps each (else this is the one-slot matrix again)
    assert report.interrupted >= 2 * report.kills, report.table


def _matrix(
    redis_server: EmbeddedServer, work_dir: Path, *, runs: int, slots: int
) -> Report:
    work_dir.mkdir(parents=True, exist_ok=True)
    policy = FaultPolicy(work_dir)
    with SimServer(policy) as sim:
        report = run_matrix(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir,
            list(POINTS),
            runs=runs,
            seed=SEED,
            workers=3 if FULL else 2,
            slots=slots,
            timeout=3000 if FULL else 300,
        )
        stats = sim.stats()
    print("\n" + report.table)
    print(f"worker deaths: {report.deaths}, planned kills fired: {report.kills}")
    # The policy is asked once per request whose body the simulator read: its counts are the
    # simulator's. The others are requests cut by a kill while their body was on its way (the
    # simulator never read them, so nothing answered or billed them): at most one per step interrupted.
    read = sum(stats["conversations"].values())
    assert read == sum(policy.counts.values()) + policy.unknown > 0
    assert stats["requests"] - read <= report.interrupted
    assert len(POINTS) >= 10
    assert not report.problems, report.table + "\n" + "\n".join(report.problems[:30])
    return report
