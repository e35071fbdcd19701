"""A worker whose broker transport options move kombu's Redis layout does not start: it exits at
once with what to change (workers/worker/kombu_redis.py `check_transport_options`), before it takes a step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import ROOT, WORKER_ENV
from toolloop.embedded import EmbeddedServer

APP = """
from workers.app import app

app.conf.broker_transport_options = {**app.conf.broker_transport_options, "sep": ":"}
"""


def test_a_worker_with_another_priority_separator_refuses_to_start(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    (tmp_path / "moved_layout.py").write_text(APP)
    env = {
        **os.environ,
        **WORKER_ENV,
        "REDIS_URL": redis_server.url,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "moved_layout",
            "worker",
            "-P",
            "threads",
            "-c",
            "1",
            "-Q",
            "llm,tools,control",
            "--without-mingle",
            "--without-gossip",
            "-n",
            "layout@%h",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert "broker_transport_options sets sep=':'" in out, out[-2000:]
    assert "Remove these options from broker_transport_options" in out
    assert " ready." not in out
