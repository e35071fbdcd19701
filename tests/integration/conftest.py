"""Fixtures of the integration suite: a private Redis server, real worker processes.

Nothing here touches the shared Redis on 127.0.0.1:6379: every server is started by
`toolloop.embedded.start_server` on a free port in a temporary directory and stopped by its handle;
every worker is a `celery -A workers.app worker -P threads` subprocess in its own session, stopped by
its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.runs_kit import redis_on
from tests.support.procs import end
from toolloop.embedded import EmbeddedServer, start_server
from toolloop.sim import SimServer

ROOT = Path(__file__).resolve().parents[2]
if (
    str(ROOT) not in sys.path
):  # the toolsets of these tests are imported by path, as a worker does
    sys.path.insert(0, str(ROOT))

# Small delivery timers so that lost messages come back within seconds in tests.
WORKER_ENV = {
    "TOOLLOOP_VISIBILITY_TIMEOUT": "30",
    "TOOLLOOP_RESTORE_INTERVAL": "1",
    "TOOLLOOP_SWEEP_INTERVAL": "1",
    "TOOLLOOP_OUTBOX_AGE": "2",
    "TOOLLOOP_LEASE_MS": "20000",
}
# For the tests that kill a worker mid-step: a lost step comes back within seconds (a 6 s visibility
# timeout, kombu's unacked sweep every 1 s: CELERY-REDIS.md sections 1.1 and 5) and a 3 s lease.
FAST_RECOVERY = {
    "TOOLLOOP_VISIBILITY_TIMEOUT": "6",
    "TOOLLOOP_RESTORE_INTERVAL": "1",
    "TOOLLOOP_LEASE_MS": "3000",
    "TOOLLOOP_SWEEP_INTERVAL": "1",
    "TOOLLOOP_OUTBOX_AGE": "2",
}


def redis_in(directory: Path) -> Iterator[EmbeddedServer]:
    """A Redis server of its own in `directory`, stopped after: `yield from` it in a fixture, so that
    no other test's workers take its runs."""
    server = start_server(directory)
    try:
        yield server
    finally:  # also when a `for server in redis_in(...)` body raises and the generator is closed
        server.stop()


def own_redis(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[EmbeddedServer]:
    """`redis_in` a fresh directory `name` (for a module- or session-scoped fixture)."""
    yield from redis_in(tmp_path_factory.mktemp(name))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "redis")


@pytest.fixture(scope="session")
def runs_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """The Redis of the scripted `worker`: its own, so no other suite's workers take these runs."""
    yield from own_redis(tmp_path_factory, "runs-redis")


@pytest.fixture
def redis_client(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from redis_on(redis_server)


class Worker:
    """A real worker process: `celery -A workers.app worker -P threads`, in its own session."""

    def __init__(
        self,
        url: str,
        log: Path,
        env: dict[str, str],
        concurrency: int = 8,
        queues: str = "llm,tools,control",
    ) -> None:
        self.log = log
        self.tool_log: Path | None = None
        self.model_log: Path | None = None
        self.name = f"test-{uuid.uuid4().hex[:8]}@%h"
        paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        full_env = {
            **os.environ,
            **WORKER_ENV,
            **env,
            "REDIS_URL": url,
            "PYTHONPATH": os.pathsep.join(paths),
        }
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "-Q",
            queues,
            "-n",
            self.name,
            "--without-mingle",
            "--without-gossip",
            "-E",
            "-l",
            "INFO",
        ]
        self._file = log.open("wb")
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=full_env,
            stdout=self._file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30.0) -> Worker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"The worker exited at start:\n{self.log.read_text()[-3000:]}"
                )
            if " ready." in self.log.read_text(errors="replace"):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"The worker was not ready in {timeout} s:\n{self.log.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        end(self.process, 15)
        self._file.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._file.close()


def start_worker(
    url: str,
    log_dir: Path,
    env: dict[str, str] | None = None,
    queues: str = "llm,tools,control",
) -> Worker:
    log = log_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
    return Worker(url, log, env or {}, queues=queues).wait_ready()


def worker_on(url: str, directory: Path, env: dict[str, str]) -> Iterator[Worker]:
    """A ready worker on `url` with `env`, logging to `directory`, stopped after: `yield from` it."""
    process = start_worker(url, directory, env)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def worker(
    runs_redis: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """A worker whose model is the scripted one of tests/integration/agents.py. Its tools and model
    log what they run to `worker.tool_log` / `worker.model_log`."""
    directory = tmp_path_factory.mktemp("worker")
    env = {
        "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
        "TOOLLOOP_TEST_TOOL_LOG": str(directory / "tools.jsonl"),
        "TOOLLOOP_TEST_MODEL_LOG": str(directory / "model.jsonl"),
    }
    process = start_worker(runs_redis.url, directory, env)
    process.tool_log = directory / "tools.jsonl"
    process.model_log = directory / "model.jsonl"
    yield process
    process.stop()


def sim_env(
    sim: SimServer, tool_log: Path | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a worker whose model is `sim` over real HTTP (providers.from_env on the
    Anthropic wire, no scripted model), its tools logging to `tool_log`, with `extra` on top."""
    env = {
        "ANTHROPIC_BASE_URL": sim.base_url,
        "ANTHROPIC_API_KEY": "sim-key",
        "TOOLLOOP_PROMPT_GEN": "",
    }
    if tool_log is not None:
        env["TOOLLOOP_TEST_TOOL_LOG"] = str(tool_log)
    return {**env, **extra}


@pytest.fixture(scope="module")
def sim_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Redis of the module's own for its simulator-backed workers: no other module's worker (whose
    model is another) takes these runs."""
    yield from own_redis(tmp_path_factory, "sim-redis")


@pytest.fixture(scope="module")
def sim_worker(
    sim_redis: EmbeddedServer, sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """A worker on `sim_redis` whose model is the module's `sim` fixture; its tools log what they run
    to `sim_worker.tool_log`."""
    directory = tmp_path_factory.mktemp("sim-worker")
    process = start_worker(
        sim_redis.url, directory, sim_env(sim, directory / "tools.jsonl")
    )
    process.tool_log = directory / "tools.jsonl"
    yield process
    process.stop()
