"""bench/scale.py keeps working against the real worker: every figure at a tiny size, run as a
user runs it (its own private server, worker and simulator processes), with the probes the
profile of bench/PROFILE-19.md reads (gc counts, the cyclic garbage, the collector's time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"


@pytest.mark.timeout(
    360
)  # ~40 s at a load average of 12 on 2 cores; the suite's 120 s cut it short
@pytest.mark.slow
def test_scale_bench_measures_every_figure_at_a_small_size(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    args = [
        "--hops",
        "10",
        "--floor-trials",
        "1",
        "--runs",
        "6",
        "--turns",
        "2",
        "--latency",
        "0.2",
        "--parked",
        "12",
        "--bursts",
        "2",
        "--park-turns",
        "2",
        "--warm",
        "12",
        "--json",
        str(out),
    ]
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH), *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (
        subprocess.TimeoutExpired
    ) as late:  # say where it was: its own progress lines
        so_far = (
            late.stderr.decode(errors="replace")
            if isinstance(late.stderr, bytes)
            else late.stderr or ""
        )
        pytest.fail(
            f"bench/scale.py ran over 300 s; its stderr so far:\n{so_far[-3000:]}"
        )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("bare Celery hop (floor):") for line in lines), (
        done.stdout
    )
    flight = next(
        line
        for line in lines
        if line.startswith("6 runs in flight x 2 turns at 0.2 s:")
    )
    assert "of ideal" in flight and "worker CPU per step" in flight
    assert any(line.startswith("  trial: 6/6 done") for line in lines), done.stdout
    parked = next(
        line
        for line in lines
        if line.startswith("12 parked runs raise the worker's RSS by")
    )
    assert "{'asked': 24}" in parked  # two bursts of 12
    # the warm-up before the baseline
    assert "after 12 runs at full steps in flight" in parked
    assert any(line.startswith("  RSS after each burst of 12: ") for line in lines), (
        done.stdout
    )
    by_mapping = next(
        line
        for line in lines
        if line.startswith("  RSS by mapping, before -> after, MB: ")
    )
    assert "heap" in by_mapping and "anon" in by_mapping, by_mapping
    assert any(line.startswith("  pymalloc: arenas ") for line in lines), done.stdout
    assert any(line.startswith("  glibc: arenas ") for line in lines), done.stdout
    results = json.loads(out.read_text())
    (trial,) = results["flight"]
    # CPU is read in 10 ms ticks: 18 steps at the 0.3 ms target may read 0
    assert trial["done"] == 6 and trial["cpu_s"] >= 0 and trial["steps"] == 6 * 3
    assert {"gen0", "gen1", "gen2"} <= set(trial["gc"]) and trial[
        "sim_cpu_s"
    ] >= 0  # 10 ms ticks
    # the worker's collector thresholds (workers/worker/bootsteps.py): 6 steps in flight keep the floor of
    # 100,000
    assert trial["gc"]["thresholds"] == [100_000, 50, 1000]
    kept = results["parked"]
    assert kept["statuses"] == {"asked": 24} and len(kept["rss_after_bursts_mb"]) == 2
    # the bench asserts that every warm-up run ended done, none parked
    assert kept["warm"] == 12
    # sys._debugmallocstats() read in the worker
    pools = kept["alloc_after"]["pymalloc"]
    assert (
        pools["arenas_allocated_current"] > 0
        and pools["bytes_in_allocated_blocks"] > 1 << 20
    ), pools
    # malloc_info: the main arena at least
    assert kept["alloc_after"]["glibc"]["arenas"] >= 1
    # a parked run keeps no loop on its worker
    assert kept["probe_after"]["kept_loops"] == 0
    assert "top" in kept["garbage"] and kept["rss_after_mb"] > kept["rss_before_mb"] / 2
    assert any(line.startswith("  cyclic garbage per parked run:") for line in lines), (
        done.stdout
    )
    # no step's or ended loop's objects in cycles
    left = {name for name, _ in kept["garbage"]["top"]}
    assert not left & {
        "_Step",
        "StepCommit",
        "BegunStep",
        "Held",
        "LiveLoop",
        "Begun",
        "SegmentJournal",
        "StepTrace",
    }, kept["garbage"]
