"""The command line on the project's own embedded server, as a new user meets it: the worker's banner
lists the queues it takes from and neither it nor `toolloop doctor` warns about `maxmemory` (the
embedded server has one); `toolloop run --follow` with no terminal stops with a clear message when
the run asks, instead of blocking, and the run stays parked for an answer sent from elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.runs_kit import eventually

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOOLLOOP = str(Path(sys.executable).parent / "toolloop")
REGISTERED = "review=examples.storyboard.tools:REVIEW_TOOLS"


def test_the_embedded_server_worker_banner_doctor_and_run_follow_without_a_terminal(
    tmp_path: Path,
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "REDIS_URL" and not k.startswith("TOOLLOOP_")
    }
    env |= {"TOOLLOOP_HOME": str(tmp_path / "state"), "TOOLLOOP_TOOLSETS": REGISTERED}
    env = {k: v for k, v in env.items() if k not in ("ANTHROPIC_API_KEY", "FAL_KEY")}

    def toolloop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TOOLLOOP, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [
                TOOLLOOP,
                "worker",
                "-c",
                "2",
                "--sim-policy",
                "examples.storyboard.policy:review_policy",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually(
            lambda: " ready." in log_path.read_text(errors="replace"), timeout=60
        )
        started = log_path.read_text(errors="replace")
        banner = started.split("[queues]", 1)[1].split("[tasks]", 1)[0]
        assert all(f".> {queue} " in banner for queue in ("llm", "tools", "control")), (
            banner
        )
        assert "maxmemory" not in started, started

        doctor = toolloop("doctor")
        assert "ok    maxmemory " in doctor.stdout and "warn" not in doctor.stdout, (
            doctor.stdout
        )

        began = time.monotonic()
        followed = toolloop(
            "run", "-f", "examples/storyboard/run.yaml", "--follow", timeout=90
        )
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert time.monotonic() - began < 60
        assert "asked    Shot 3 is the hero's entrance" in followed.stdout
        assert (
            "stdin is not a terminal, so no answer can be typed here: stopped following"
            in followed.stderr
        )
        run_id = followed.stdout.splitlines()[0]
        assert f"toolloop answer {run_id} 'TEXT'" in followed.stderr
        assert "Traceback" not in followed.stderr
        # parked, waiting for an answer
        assert "status      asked" in toolloop("status", run_id).stdout
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        toolloop("down")
