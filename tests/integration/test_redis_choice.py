"""One way to find Redis for every entry point: `REDIS_URL`, else the embedded server of
$TOOLLOOP_HOME (default ./.toolloop). The CLI (`toolloop up`), `Client()`, the web example, the
worker's settings and Flower's (the same `workers.config.settings`) name the same server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from workers.client import Client
from workers.protocol.errors import NoRedisError

pytestmark = pytest.mark.integration

TOOLLOOP = str(Path(sys.executable).with_name("toolloop"))


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return {**env, "TOOLLOOP_HOME": str(home), "PYTHONPATH": str(ROOT), **extra}


def _settings_url(env: dict[str, str], cwd: Path) -> str:
    """The URL `workers.config.settings` finds in a fresh process (what a worker, Flower and Client use)."""
    code = "from workers.config.settings import Settings; print(Settings.from_env().redis_url)"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_every_entry_point_finds_the_same_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "state"
    env = _env(home)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("TOOLLOOP_HOME", str(home))
    with pytest.raises(
        NoRedisError, match="toolloop up"
    ):  # nothing runs yet: refused, not 6379
        Client()
    up = subprocess.run(
        [TOOLLOOP, "up"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    cli_url = json.loads(up.stdout)["url"]
    try:
        # the worker's and Flower's settings
        assert _settings_url(env, tmp_path) == cli_url
        with Client() as client:
            assert client.settings.redis_url == cli_url
            assert client.redis.ping()
        sys.path.insert(0, str(ROOT))
        from examples.web import create_app

        app = create_app(token="t")  # the web example with no REDIS_URL
        assert app.state.client.settings.redis_url == cli_url
        asyncio.run(app.state.client.aclose())
        # REDIS_URL wins everywhere
        monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
        assert (
            _settings_url({**env, "REDIS_URL": "redis://127.0.0.1:1/0"}, tmp_path)
            == "redis://127.0.0.1:1/0"
        )
        assert Client().settings.redis_url == "redis://127.0.0.1:1/0"
    finally:
        subprocess.run(
            [TOOLLOOP, "down"], env=env, cwd=tmp_path, capture_output=True, check=True
        )


def test_a_worker_without_redis_says_what_to_do(tmp_path: Path) -> None:
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            "-P",
            "threads",
            "-Q",
            "llm,tools,control",
        ],
        env=_env(tmp_path / "none"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0
    assert (
        "REDIS_URL is not set and no embedded Redis runs"
        in worker.stdout + worker.stderr
    )
