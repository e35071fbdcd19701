"""The step consumer (workers/worker/consumer.py) against real worker processes on a private Redis: steps run
on it by default and in Celery's pool with `--step-queues none`, with the same run; a message that is
not a task is kept aside; a warm shutdown puts a running step back on its queue; the remote-control
commands add and cancel its queues."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import Worker, redis_in, start_worker
from tests.integration.runs_kit import client_on, eventually, redis_on, spec
from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol import names, wire
from workers.worker.consumer import REJECTED

pytestmark = pytest.mark.integration

AGENT = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
TOOLSET = "agents"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


@pytest.fixture
def client(server: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(server)


@pytest.fixture
def raw(server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from redis_on(server)


def run_with_a_tool(client: Client) -> str:
    return client.enqueue(spec("tools", "Add 2 and 3.", toolset=TOOLSET))


def check_done_with_a_tool(client: Client, run_id: str) -> None:
    status = client.wait(run_id, timeout=30)
    assert (status.status, status.final_text, status.steps) == (
        "done",
        "The sum is 5.",
        2,
    ), status
    history = client.history(run_id)
    assert [type(m) for m in history] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        AssistantMessage,
    ]
    assert [e.kind for e in client.events(run_id)] == [
        "queued",
        "model",
        "tool",
        "model",
        "finished",
    ]


@pytest.mark.parametrize("steps", ["step consumer", "Celery pool"])
def test_a_run_is_the_same_on_the_step_consumer_and_in_celerys_pool(
    steps: str, server: EmbeddedServer, client: Client, raw: redis.Redis, tmp_path: Path
) -> None:
    env = {
        **AGENT,
        **({"TOOLLOOP_STEP_QUEUES": "none"} if steps == "Celery pool" else {}),
    }
    worker = start_worker(server.url, tmp_path, env)
    try:
        run_id = run_with_a_tool(client)
        check_done_with_a_tool(client, run_id)
        log = worker.log.read_text()
        assert ("step consumer: queues llm,tools" in log) == (steps == "step consumer")
        assert eventually(lambda: raw.hlen(names.UNACKED) == 0), "a step stayed unacked"
    finally:
        worker.stop()


def test_a_message_that_is_not_a_task_is_kept_aside_and_runs_go_on(
    server: EmbeddedServer, client: Client, raw: redis.Redis, tmp_path: Path
) -> None:
    worker = start_worker(server.url, tmp_path, AGENT)
    try:
        raw.lpush("tools", "not a task message")
        raw.lpush(
            "tools", json.dumps({"properties": {"delivery_tag": "t1"}, "body": "??"})
        )
        assert eventually(lambda: raw.llen(REJECTED) == 2)
        assert "not a task message" in [
            json.loads(entry)["raw"] for entry in raw.lrange(REJECTED, 0, -1)
        ]
        assert raw.hlen(names.UNACKED) == 0
        assert "is not a task" in worker.log.read_text()
        check_done_with_a_tool(client, run_with_a_tool(client))
    finally:
        worker.stop()


def test_a_warm_shutdown_puts_a_running_step_back_on_its_queue(
    server: EmbeddedServer, client: Client, raw: redis.Redis, tmp_path: Path
) -> None:
    worker = start_worker(
        server.url, tmp_path, {**AGENT, "TOOLLOOP_SHUTDOWN_GRACE": "1"}
    )
    run_id = client.enqueue(spec("slow", "Sleep.", toolset=TOOLSET))  # a 30 s tool step
    eventually(
        lambda: raw.hlen(names.UNACKED) == 1 and client.status(run_id).steps == 1
    )
    worker.stop()  # SIGTERM: 1 s of grace, then the step goes back
    assert worker.process.returncode == 0
    assert raw.hlen(names.UNACKED) == 0
    waiting = [wire.parse(m) for m in raw.lrange("tools", 0, -1)]
    assert [(d.name, d.args[0]) for d in waiting] == [("toolloop.advance", run_id)]
    assert (
        "goes back on queue 'tools': the worker is shutting down"
        in worker.log.read_text()
    )
    assert client.status(run_id).status == "running"
    client.cancel(run_id)
    again = start_worker(server.url, tmp_path, AGENT)
    try:
        assert client.wait(run_id, timeout=60).status == "cancel"
    finally:
        again.stop()


def test_remote_control_adds_and_cancels_step_queues(
    server: EmbeddedServer, client: Client, raw: redis.Redis, tmp_path: Path
) -> None:
    worker = Worker(
        server.url, tmp_path / "w.log", AGENT, queues="tools,control"
    ).wait_ready()
    try:
        # its first step waits on "llm", which nobody takes
        run_id = run_with_a_tool(client)
        assert client.status(run_id).status == "queued"
        name = worker.name.replace("%h", socket.gethostname())
        replies: list[dict[str, Any]] = client.celery.control.broadcast(
            "add_step_queue",
            arguments={"queue": "llm"},
            destination=[name],
            reply=True,
            timeout=10,
        )
        assert replies == [{name: {"ok": "step queue 'llm' added"}}]
        check_done_with_a_tool(client, run_id)
        replies = client.celery.control.broadcast(
            "cancel_step_queue",
            arguments={"queue": "llm"},
            destination=[name],
            reply=True,
            timeout=10,
        )
        assert replies == [{name: {"ok": "step queue 'llm' cancelled"}}]
        later = run_with_a_tool(client)
        time.sleep(1.5)
        assert (client.status(later).status, raw.llen("llm")) == ("queued", 1)
    finally:
        worker.stop()
