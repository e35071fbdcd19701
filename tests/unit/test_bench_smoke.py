"""bench/loop_overhead.py keeps working: one repetition of our side, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "loop_overhead.py"


def test_loop_overhead_runs_twenty_turns_on_our_side(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--sides",
            "ours",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    ours = results["sides"]["ours"]
    assert (ours["turns"], ours["tool_calls"]) == (20, 19)
    assert ours["wall_us_per_turn"] > 0 and ours["cpu_us_per_turn"] > 0
    assert "ours" in done.stdout and "us/turn" in done.stdout


def test_loop_overhead_refuses_an_unknown_side() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sides", "crewai", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "crewai" in done.stderr
