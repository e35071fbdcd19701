"""pytest names the tier it is in (tests/conftest.py TierLines): a line as each tier begins, its
size and what it runs on, and each tier's time in the summary, also under -q."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # a pytest of its own: slow on a loaded machine
@pytest.mark.slow
def test_each_tier_begins_with_its_line_and_the_summary_gives_its_time() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/replay/test_replay.py::test_every_scenario_has_a_golden_file",
            "tests/unit/test_fastjson.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    replay = next(
        i
        for i, line in enumerate(lines)
        if " replay: 1 tests (recorded runs replayed) " in line
    )
    unit = next(
        i for i, line in enumerate(lines) if " unit: 8 tests (in-process: " in line
    )
    assert replay == 0 and lines[replay + 1] == "." and unit == replay + 2, lines
    assert any(
        line.startswith("tiers: replay ") and ", unit " in line for line in lines
    ), lines
