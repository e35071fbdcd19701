"""bench/enqueue.py and bench/fleet.py keep working: each at a tiny size, run as a user runs it (its
own private server; the fleet its own worker processes and simulator process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(script: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_enqueue_bench_measures_every_row_beside_its_floor() -> None:
    lines = run(
        "enqueue.py",
        "--runs",
        "40",
        "--trials",
        "1",
        "--batch",
        "10",
        "--concurrency",
        "4",
    )
    rows = {
        line.split("|")[1].strip(): line
        for line in lines
        if line.startswith("| ") and "---" not in line
    }
    names = [
        "floor: redis-py EVALSHA 'return 1'",
        "Client.enqueue",
        "Client.enqueue_many (10 a batch)",
        "before: store script + Celery send",
        "floor: redis.asyncio EVALSHA 'return 1'",
        "AsyncClient.enqueue",
        "AsyncClient.enqueue, 4 tasks",
        "AsyncClient.enqueue_many (10 a batch)",
    ]
    assert set(names) <= set(rows), lines
    assert any(line.startswith("One at a time: sync") for line in lines)


@pytest.mark.slow
def test_the_fleet_bench_reports_each_fleet_and_the_ceiling_of_one_redis() -> None:
    lines = run("fleet.py", "--runs", "4", "--turns", "2", "--latency", "0.2")
    fleets = [
        line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    assert len(fleets) == 2, lines
    assert (
        "4/4" in fleets[0]
        and "8/8" in fleets[1]
        and all("steps/s" in line for line in fleets)
    )
    assert any(line.startswith("Ceiling of one Redis: ~") for line in lines)
