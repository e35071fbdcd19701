"""Redis full (maxmemory 20mb, noeviction) under enqueues and steps: nothing half-written, nothing paid
twice, every accepted run finishes once memory is freed.

A private Redis is filled with filler keys to 4 MB under 20 MB while two workers run steps (the
simulated model answers after 0.2 s, so calls are in flight); runs are then enqueued until Redis
refuses one. Redis stays full for a few seconds: step commits are refused for OOM (each step keeps its
paid value and retries while its lease holds), step starts are refused and put back. Then the filler
keys are deleted, as an operator would free memory. What must hold:

- `enqueue` fails with an error (the other half of issue 12 words it) and leaves no key of a run
  behind: every run found in Redis is an accepted one, with its spec, state and input;
- the workers logged that Redis was out of memory, and what to do (raise maxmemory / free memory);
- every accepted run ends `done`, and the simulator served each model call of each run once
  (counted per run and turn: 0 model calls paid twice).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from faults.policy import FaultPolicy
from faults.runs import spec_for
from faults.shapes import Call, Shape
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import start_server
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol.records import FINAL

pytestmark = pytest.mark.faults

MAXMEMORY = 20 * 1024 * 1024
# ~18 KB per run's prompt
PADDING = "Frame notes: " + "the light falls left to right, " * 600
FULL_FOR_S = 4.0


def _shape(tag: str) -> Shape:
    note = Call("note", {"tag": f"{tag}.0.0", "text": "shot 4 is too dark"})
    render = Call("render", {"tag": f"{tag}.1.0", "frames": 8})
    return Shape(
        tag=tag, turns=((note,), (render,)), final=f"Reviewed {tag}.", latency_s=0.2
    )


def _spec(shape: Shape) -> dict[str, object]:
    spec = spec_for(shape)
    spec["messages"] = [{"role": "user", "content": f"{shape.first_message} {PADDING}"}]
    return spec


def _run_ids(client: redis.Redis) -> set[str]:
    return {
        key.split("{", 1)[1].split("}", 1)[0]
        for key in client.scan_iter("tl:{*", count=1000)
    }


@pytest.mark.timeout(420)
def test_a_full_redis_loses_no_run_and_pays_no_model_call_twice(tmp_path: Path) -> None:
    server = start_server(tmp_path / "redis")
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    policy = FaultPolicy(tmp_path / "sim")
    try:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", MAXMEMORY)
        with SimServer(policy) as sim:
            env = {**base_env(sim.base_url), "TOOLLOOP_FAULTS_DIR": str(tmp_path)}
            client = Client(server.url)
            with WorkerPool(server.url, tmp_path, env, size=2, concurrency=16) as pool:
                accepted, refusal = _fill(admin, client, policy)
                time.sleep(FULL_FOR_S)  # full: commits and starts are refused meanwhile
                stored = _run_ids(admin)
                for key in list(
                    admin.scan_iter("filler:*", count=1000)
                ):  # the operator frees memory
                    admin.delete(key)
                statuses = _wait_all(client, accepted, timeout=180)
                logs = "".join(path.read_text(errors="replace") for path in pool.logs)
    finally:
        admin.close()
        server.stop()
    assert refusal is not None, (
        "Redis never refused an enqueue: the test did not fill it"
    )
    assert "OOM" in refusal or "memory" in refusal.lower(), refusal
    assert stored == set(accepted), (
        f"runs in Redis that enqueue did not accept: {sorted(stored - set(accepted))}"
    )
    ended = Counter(status for status in statuses.values())
    assert ended == {"done": len(accepted)}, ended
    calls = {
        tag: count for (phase, tag), count in policy.counts.items() if phase == "ref"
    }
    twice = {tag: count for tag, count in calls.items() if count > 1}
    assert not twice, f"model calls paid more than once: {twice}"
    assert len(calls) == 3 * len(accepted) >= 150, (len(calls), len(accepted))
    assert "Redis is out of memory" in logs and "Raise maxmemory" in logs, (
        "no worker said what to do"
    )
    assert "the commit retried while the lease holds" in logs, (
        "no commit was refused: Redis was not full"
    )


def _fill(
    admin: redis.Redis, client: Client, policy: FaultPolicy
) -> tuple[list[str], str | None]:
    """Filler keys to ~4 MB under maxmemory, then runs until an enqueue is refused."""
    index = 0
    while int(admin.info("memory")["used_memory"]) < MAXMEMORY - 4_000_000:
        admin.set(f"filler:{index}", "x" * 100_000)
        index += 1
    accepted: list[str] = []
    refusal: str | None = None
    for number in range(2000):
        shape = _shape(f"full{number}")
        policy.add(shape)
        try:
            accepted.append(client.enqueue(_spec(shape)))
        except (
            Exception
        ) as error:  # the refusal: what the caller sees is checked by the test
            refusal = f"{type(error).__name__}: {error}"
            break
        time.sleep(0.01)
    return accepted, refusal


def _run_status(client: Client, run_id: str) -> str:
    try:
        return client.status(run_id).status
    except redis.RedisError:
        return "?"


def _wait_all(client: Client, run_ids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    statuses = {run_id: "?" for run_id in run_ids}
    while time.monotonic() < deadline:
        statuses = {run_id: _run_status(client, run_id) for run_id in run_ids}
        if all(status in FINAL for status in statuses.values()):
            break
        time.sleep(0.5)
    return statuses


@pytest.mark.timeout(240)
def test_redis_away_longer_than_the_clients_retries_loses_no_paid_result(
    tmp_path: Path,
) -> None:
    """Redis is killed while model calls are in flight and comes back (AOF) 3 s later: longer than the
    workers' Redis clients retry a lost connection (~2 s), shorter than the lease (10 s here). Each step
    whose call came back meanwhile keeps its result and retries its commit until Redis answers: every
    run ends done, and the simulator served each model call of each run once."""
    server = start_server(tmp_path / "redis")
    policy = FaultPolicy(tmp_path / "sim")
    shapes = [
        Shape(
            tag=f"away{i}",
            turns=((Call("note", {"tag": f"away{i}.0.0", "text": "ok"}),),),
            latency_s=1.0,
        )
        for i in range(12)
    ]
    for shape in shapes:
        policy.add(shape)
    timers = {"TOOLLOOP_LEASE_MS": "10000", "TOOLLOOP_VISIBILITY_TIMEOUT": "15"}
    try:
        with SimServer(policy) as sim:
            env = {
                **base_env(sim.base_url),
                **timers,
                "TOOLLOOP_FAULTS_DIR": str(tmp_path),
            }
            with WorkerPool(server.url, tmp_path, env, size=2, concurrency=16) as pool:
                client = Client(server.url)
                run_ids = [client.enqueue(spec_for(shape)) for shape in shapes]
                deadline = time.monotonic() + 30
                while (
                    sum(policy.counts.values()) < len(shapes)
                    and time.monotonic() < deadline
                ):
                    # every run's first call is in flight (answered after 1 s)
                    time.sleep(0.02)
                server.kill()
                time.sleep(3.0)
                server.start()
                statuses = _wait_all(client, run_ids, timeout=120)
                not_done = {
                    run_id: (record.status, record.error_class, record.error_message)
                    for run_id, status in statuses.items()
                    if status != "done"
                    for record in [client.status(run_id)]
                }
                logs = "".join(path.read_text(errors="replace") for path in pool.logs)
    finally:
        server.stop()
    said = [
        line for line in logs.splitlines() if any(run_id in line for run_id in not_done)
    ]
    assert Counter(statuses.values()) == {"done": len(shapes)}, (not_done, said[-20:])
    twice = {tag: count for tag, count in policy.counts.items() if count > 1}
    assert not twice, f"model calls paid more than once: {twice}"
    assert len(policy.counts) == 2 * len(shapes)
    assert "the commit retried while the lease holds" in logs
