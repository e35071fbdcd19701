"""bench/durable.py keeps working against the real worker: every figure at a tiny size, run as a
user runs it (its own private server and worker processes), and its table names each verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "durable.py"


@pytest.mark.slow
def test_durable_bench_measures_every_figure_at_a_small_size() -> None:
    args = [
        "--hops",
        "10",
        "--turns",
        "3",
        "--trials",
        "1",
        "--runs",
        "4",
        "--flight-turns",
        "2",
        "--steady-turns",
        "3",
        "--steady-trials",
        "1",
        "--latency",
        "0.2",
        "--observe-runs",
        "4",
        "--observe-turns",
        "2",
        "--observe-trials",
        "1",
        "--stream-runs",
        "4",
        "--stream-turns",
        "2",
        "--stream-trials",
        "1",
        "--stream-tokens",
        "20",
    ]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("bare Celery hop (floor)") for line in lines)
    for how in ("step consumer", "Celery threads pool"):
        step = next(
            line for line in lines if line.startswith(f"durable step, {how}, per step")
        )
        assert "x floor" in step and ("met" in step or "MISSED" in step)
        assert any(
            line.startswith(f"  in flight, {how}: 4/4 done") for line in lines
        ), done.stdout
        kept = next(
            line
            for line in lines
            if line.startswith(f"4 kept in flight at 0.2 s, {how}")
        )
        assert ">= 80 % ideal" in kept and ("met" in kept or "MISSED" in kept)
        assert any(
            line.startswith(f"  kept in flight, {how}: 4/4 done") for line in lines
        ), done.stdout
    observed = next(
        line for line in lines if line.startswith("tracing + metrics on vs off")
    )
    assert "<= 1.15 x off" in observed and ("met" in observed or "MISSED" in observed)
    assert any(
        line.startswith("  tracing + metrics: 4 runs x 2 turns") for line in lines
    ), done.stdout
    streaming = next(
        line for line in lines if line.startswith("streaming on vs off, 4 in flight")
    )
    assert "<= 1.10 x off" in streaming and (
        "met" in streaming or "MISSED" in streaming
    )
    replay = next(line for line in lines if line.startswith("replay 200-step journal"))
    assert "<= 20 ms" in replay
