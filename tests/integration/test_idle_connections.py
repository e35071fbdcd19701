"""An idle worker closes the Redis connections a burst of steps opened (workers/trim.py
`drop_idle_connections`, from the sweeper's idle tick), and its next step opens what it needs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Worker, own_redis, start_worker
from tests.integration.runs_kit import client_on, eventually, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.trim import IDLE_CONNECTIONS

BURST = 1000


@pytest.fixture(scope="module")
def idle_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "idle-redis")


@pytest.fixture(scope="module")
def idle_worker(idle_redis: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    directory = tmp_path_factory.mktemp("idle-worker")
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    process = start_worker(idle_redis.url, directory, env)
    yield process
    process.stop()


@pytest.fixture
def client(idle_redis: EmbeddedServer, idle_worker: Worker) -> Iterator[Client]:
    yield from client_on(idle_redis)


def connections_to(pid: int, port: int) -> int:
    """The process's established TCP connections to `port` on loopback (from /proc: the OS's view)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:  # 01: ESTABLISHED
                found += 1
    return found


def test_an_idle_worker_closes_its_bursts_connections_and_its_next_step_works(
    client: Client, idle_redis: EmbeddedServer, idle_worker: Worker
) -> None:
    pid, port = idle_worker.process.pid, idle_redis.port
    first = client.enqueue(spec("ask"))
    assert client.wait(first, timeout=20).status == "asked"
    settled = eventually(lambda: connections_to(pid, port), timeout=5)
    peak = [settled]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(connections_to(pid, port))
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run_ids = client.enqueue_many([spec("ask")] * BURST)  # the worker takes up to 500 at once
        for run_id in run_ids:
            assert client.wait(run_id, timeout=60).status == "asked"
    finally:
        done.set()
        sampler.join()
    # the burst opened more connections than an idle worker keeps: the test can fail
    assert max(peak) > settled + IDLE_CONNECTIONS, (settled, max(peak))
    eventually(lambda: connections_to(pid, port) <= settled + IDLE_CONNECTIONS, timeout=15)
    client.answer(first, "Shot 3")  # the next step: its commands open what they need
    status = client.wait(first, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "You said: Shot 3"
