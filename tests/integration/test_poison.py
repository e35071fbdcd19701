"""Poison messages cannot stop the fleet: every malformed message shape, pushed onto every toolloop
queue (llm, tools, control) of a real worker, lands in the rejected list with its reason; the worker
keeps running, and runs enqueued beside the bad messages (claimed in the same batch) finish.

Both ways a worker reads its queues: the step consumer (the default, every toolloop queue) and
Celery's own consumer (`--step-queues none`, every queue through kombu, where a message kombu cannot
decode used to end the worker with "Unrecoverable error").
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import redis_in, start_worker
from tests.integration.runs_kit import client_on, eventually, redis_on, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol import names, wire
from workers.worker.consumer import REJECTED

pytestmark = pytest.mark.integration

AGENT = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
QUEUES = ("llm", "tools", "control")


def _task(body: Any = None, **change: Any) -> str:
    """A task message like Celery's, with `change` applied (None values delete a key)."""
    good = wire.task_message("toolloop.cancel", ["no-such-run"], "poison-id", "control")
    message = json.loads(good.raw)
    if body is not None:
        message["body"] = body
    for path, value in change.items():
        target = message
        *parents, last = path.split("__")
        for parent in parents:
            target = target[parent]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return json.dumps(message)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


SHAPES: dict[str, bytes | str] = {
    "not JSON": "not a task message",
    "not UTF-8": b"\xff\xfe\x00\x81 binary garbage",
    "JSON array": "[1, 2, 3]",
    "JSON null": "null",
    "JSON string": '"a string"',
    "properties a number": json.dumps({"properties": 5, "headers": {}, "body": ""}),
    "body not base64": _task(body="!!! not base64 !!!"),
    "body not JSON": _task(body=_b64(b"not json at all")),
    "body not [args, kwargs, embed]": _task(body=_b64(b'{"a": 1}')),
    "missing headers": _task(headers=None),
    "headers a list": _task(headers=[1, 2]),
    "task not a string": _task(headers__task=5),
    "embed not an object": _task(body=_b64(json.dumps([["r"], {}, [1]]).encode())),
    "wrong argument types": _task(body=_b64(json.dumps([[1, 2], {}, {}]).encode())),
    "unknown task": _task(headers__task="os.system"),
    "delivery_tag a number": _task(properties__delivery_tag=12345),
    "delivery_tag an object": _task(properties__delivery_tag={"a": 1}),
    "delivery_tag missing": _task(properties__delivery_tag=None),
    "huge (10 MB)": _task(headers__argsrepr="x" * 10_000_000),
    "delivery_info a list": _task(properties__delivery_info=[1]),
    "content-encoding unknown": _task(**{"content-encoding": "rot13"}),
    "timelimit a string": _task(headers__timelimit="abc"),
    "eta not a date": _task(headers__eta="not a date"),
    "expires a list": _task(headers__expires=[1]),
    "retries a string": _task(headers__retries="many"),
    "priority a string": _task(properties__priority="high"),
    "stamps a list": _task(headers__stamps=[1]),
    # Lua's JSON reads NaN (so CLAIM records the tag), Python's does not: the record must go too.
    "NaN (JSON to Lua only)": _task()[:-1] + ', "x": NaN}',
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


@pytest.fixture
def client(server: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(server)


@pytest.fixture
def raw(server: EmbeddedServer) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(server.url)  # bytes: some shapes are not UTF-8
    yield made
    made.close()


def push_every_shape(raw: redis.Redis) -> int:
    for queue in QUEUES:
        for shape in SHAPES.values():
            raw.lpush(queue, shape)
    return len(QUEUES) * len(SHAPES)


def rejected(server: EmbeddedServer) -> list[dict[str, Any]]:
    text = next(redis_on(server))
    try:
        return [json.loads(entry) for entry in text.lrange(REJECTED, 0, -1)]
    finally:
        text.close()


@pytest.mark.parametrize("steps", ["step consumer", "Celery pool"])
def test_every_malformed_shape_on_every_queue_is_rejected_and_runs_go_on(
    steps: str, server: EmbeddedServer, client: Client, raw: redis.Redis, tmp_path: Path
) -> None:
    # Bad messages and good runs wait together, so the worker's first claim takes them in one batch.
    bad = push_every_shape(raw)
    first = [
        client.enqueue(spec("tools", "Add 2 and 3.", toolset="agents"))
        for _ in range(3)
    ]
    env = {
        **AGENT,
        **({"TOOLLOOP_STEP_QUEUES": "none"} if steps == "Celery pool" else {}),
    }
    worker = start_worker(server.url, tmp_path, env)
    try:
        for run_id in first:
            assert client.wait(run_id, timeout=60).status == "done"
        # ... and again while it runs (a blocking read takes them one at a time).
        bad += push_every_shape(raw)
        later = [
            client.enqueue(spec("tools", "Add 2 and 3.", toolset="agents"))
            for _ in range(3)
        ]
        for run_id in later:
            assert client.wait(run_id, timeout=60).status == "done"
        assert eventually(lambda: len(rejected(server)) == bad, timeout=30), len(
            rejected(server)
        )
        assert worker.process.poll() is None, "the worker exited"
        entries = rejected(server)
        assert {entry["queue"] for entry in entries} == set(QUEUES)
        assert all(entry["reason"] and "raw" in entry for entry in entries)
        assert any(entry["raw"] == "not a task message" for entry in entries)
        huge = [entry for entry in entries if entry["size"] > 10_000_000]
        assert len(huge) == 2 * len(QUEUES) and all(
            entry["truncated"] for entry in huge
        )
        assert eventually(lambda: raw.hlen(names.UNACKED) == 0), (
            "a rejected message stayed unacked"
        )
        assert all(raw.llen(queue) == 0 for queue in QUEUES)
        log = worker.log.read_text(errors="replace")
        assert "Unrecoverable error" not in log
        assert "is not a task" in log
    finally:
        worker.stop()
