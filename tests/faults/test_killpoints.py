"""The kill-point hook itself: it kills its process group once per plan entry, and only on a match."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from workers.testing.killpoints import kill_point
kill_point("commit:after", run="r1", key="s0/model:1")
kill_point("commit:after", run="r1", key="s0/model:2")
print("survived", flush=True)
"""


def _run(plan: Path) -> subprocess.CompletedProcess[str]:
    env = {"TOOLLOOP_KILL_PLAN": str(plan), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_an_entry_kills_once_then_lets_a_restart_pass(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps([{"point": "commit:after", "run": "r1", "key": "s0/model:2"}])
    )

    first = _run(plan)
    assert first.returncode == -signal.SIGKILL
    assert "survived" not in first.stdout
    log = [json.loads(line) for line in Path(f"{plan}.log").read_text().splitlines()]
    assert [(r["point"], r["run"], r["key"]) for r in log] == [
        ("commit:after", "r1", "s0/model:2")
    ]

    second = _run(plan)
    assert second.returncode == 0, second.stderr
    assert "survived" in second.stdout
    assert len(Path(f"{plan}.log").read_text().splitlines()) == 1


def test_no_plan_or_no_match_never_kills(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"point": "commit:after", "run": "other"}]))
    assert _run(plan).returncode == 0
    assert not Path(f"{plan}.log").exists()
