"""A real Flower process (`celery -A workers.app flower`) on a free loopback port, with basic auth."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.procs import end
from toolloop.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running_flower(
    env: dict[str, str],
    log: Path,
    auth: tuple[str, str],
    timeout_s: float = 60,
    read_only: bool = False,
) -> Iterator[str]:
    """Start Flower with `env` (its REDIS_URL names the broker), wait until it is healthy, yield its
    URL; stop its process group at the end. The API stays closed without the basic-auth pair.
    `read_only`: as compose and the Procfile start it (`--read_only=true`)."""
    port = free_port()
    env = {**env}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "flower",
        "--address=127.0.0.1",
        f"--port={port}",
        f"--basic_auth={auth[0]}:{auth[1]}",
        f"--read_only={str(read_only).lower()}",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Flower did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        end(process, 10, group=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
