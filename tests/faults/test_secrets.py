"""Secrets: with fake provider keys set, the keys appear nowhere a user or an operator can look.

Runs go through real workers (logging at DEBUG) and `providers.from_env()`, watched by a real Flower
process with basic auth. Some runs succeed, one is refused by the provider with an error body that
echoes the key back (as a careless API might), one fails on arguments that are not JSON. Then the
keys must not appear in: any Redis key or value (every key scanned, every type read in full: the
journal, run state, events, outbox, Celery's queues and unacked messages), the runs' event streams
and statuses, the worker logs, or Flower's REST API (tasks with their args, task details, workers).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from faults.policy import FaultPolicy
from faults.runs import drive, spec_for
from faults.shapes import make_shape
from faults.twins import base_env
from faults.workerpool import FAST, ROOT, WorkerPool
from tests.support.flower import running_flower
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.faults

ANTHROPIC_KEY = f"sk-ant-FAKE-{uuid.uuid4().hex}"
FAL_KEY = f"fal-FAKE-{uuid.uuid4().hex}"
KEYS = (ANTHROPIC_KEY, FAL_KEY, ANTHROPIC_KEY[-16:], FAL_KEY[-16:])
AUTH = ("operator", f"pw-{uuid.uuid4().hex[:8]}")


def _redis_dump(client: redis.Redis) -> str:
    """Every key and every value of the server, as text."""
    parts: list[str] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        parts.append(str(key))
        if kind == "string":
            parts.append(str(client.get(key)))
        elif kind == "hash":
            parts.append(str(client.hgetall(key)))
        elif kind == "list":
            parts.append(str(client.lrange(key, 0, -1)))
        elif kind == "set":
            parts.append(str(client.smembers(key)))
        elif kind == "zset":
            parts.append(str(client.zrange(key, 0, -1, withscores=True)))
        elif kind == "stream":
            parts.append(str(client.xrange(key)))
        else:
            parts.append(f"<{kind}>")
    return "\n".join(parts)


def _found(text: str) -> list[str]:
    return [key for key in KEYS if key in text]


@pytest.fixture
def flower(redis_server: EmbeddedServer, work_dir: Path) -> Iterator[str]:
    env = {
        **os.environ,
        **FAST,
        "REDIS_URL": redis_server.url,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "FAL_KEY": FAL_KEY,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
    }
    with running_flower(env, work_dir / "flower.log", AUTH) as url:
        yield url


@pytest.mark.timeout(300)
def test_keys_appear_nowhere(
    redis_server: EmbeddedServer, work_dir: Path, flower: str
) -> None:
    rng = random.Random(53)
    echo = {
        "kind": "error",
        "status": 401,
        "times": None,
        "message": f"invalid x-api-key {ANTHROPIC_KEY}",
    }
    shapes = [make_shape(f"sec{i}", rng) for i in range(3)] + [
        dataclasses.replace(make_shape("secauth", rng), extra={"faults": {0: echo}}),
        dataclasses.replace(
            make_shape("secraw", rng, need="note"), extra={"raw_once": [0]}
        ),
    ]
    policy = FaultPolicy(work_dir / "secrets")
    policy.phase = "fault"
    for shape in shapes:
        policy.add(shape)
    client = Client(redis_server.url)
    seen: dict[str, Any] = {}
    with SimServer(policy) as sim:
        env = {
            **base_env(sim.base_url, ANTHROPIC_KEY),
            "TOOLLOOP_PROMPT_GEN": "",
            "FAL_KEY": FAL_KEY,
            "FAL_RUN_URL": sim.base_url,
            "TOOLLOOP_FAULTS_DIR": str(work_dir / "secrets"),
        }
        with WorkerPool(
            redis_server.url, work_dir, env, size=1, concurrency=4, loglevel="DEBUG"
        ) as pool:
            runs = {client.enqueue(spec_for(shape)): shape for shape in shapes}
            last = drive(client, runs, timeout=120)
            time.sleep(1.0)  # let Flower take in the last events
            auth = httpx.BasicAuth(*AUTH)
            tasks = httpx.get(
                f"{flower}/api/tasks", params={"limit": 1000}, auth=auth, timeout=10
            )
            assert tasks.status_code == 200, tasks.text
            seen["tasks"] = tasks.text
            task_ids = list(tasks.json())
            assert any(run_id in task_id for task_id in task_ids for run_id in runs), (
                "Flower saw no step"
            )
            seen["infos"] = [
                httpx.get(
                    f"{flower}/api/task/info/{task_id}", auth=auth, timeout=10
                ).text
                for task_id in task_ids[:50]
            ]
            seen["workers"] = httpx.get(
                f"{flower}/api/workers", params={"refresh": 1}, auth=auth, timeout=20
            ).text
            seen["types"] = httpx.get(
                f"{flower}/api/task/types", auth=auth, timeout=10
            ).text
            logs = "\n".join(path.read_text(errors="replace") for path in pool.logs)
    statuses = {runs[run_id].tag: status for run_id, status in last.items()}
    print("\nsecrets: refused run says:", statuses["secauth"].error_message)
    assert statuses["secauth"].status == "failed" and "401" in (
        statuses["secauth"].error_message or ""
    )
    assert (
        statuses["secraw"].status == "failed"
        and statuses["secraw"].error_class == "ToolArgumentsError"
    )
    assert all(statuses[f"sec{i}"].status == "done" for i in range(3)), statuses
    assert "HTTP Request: POST" in logs, (
        "the worker log is not the one that made the calls"
    )
    events = [
        record.model_dump_json() for run_id in runs for record in client.events(run_id)
    ]
    places = {
        "redis": _redis_dump(client.redis),
        "events": "\n".join(events),
        "statuses": "\n".join(status.model_dump_json() for status in last.values()),
        "worker logs": logs,
        "flower tasks": seen["tasks"],
        "flower task info": "\n".join(seen["infos"]),
        "flower workers": seen["workers"],
        "flower task types": seen["types"],
        "flower log": (work_dir / "flower.log").read_text(errors="replace"),
    }
    client.close()
    leaks = {place: _found(text) for place, text in places.items() if _found(text)}
    assert not leaks, f"provider keys found in: {leaks}"
    assert len(places["redis"]) > 1000 and len(places["flower tasks"]) > 100
