"""bench/long_run.py keeps working and keeps its targets on a short run, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "long_run.py"


def test_a_short_long_run_meets_its_targets(tmp_path: Path) -> None:
    out = tmp_path / "long.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "40", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(out.read_text())["modes"]["client"]
    assert (
        row["turns"] == 40 and row["stopped_by"] == "done" and row["compactions"] >= 2
    )
    assert row["largest_request_tokens"] < 200_000 and row["spend_vs_billed"] <= 0.005
    assert "MISSED" not in done.stdout


def test_an_unknown_mode_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--modes", "magic"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        done.returncode == 2
        and "--modes among client, demand, server, clear" in done.stderr
    )
