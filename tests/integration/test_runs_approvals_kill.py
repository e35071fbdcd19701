"""Approvals across worker deaths and restarts: a worker SIGKILLed while a run waits for a decision,
and again between the decision and the tool's run; a deadline that passes while no worker runs."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import FAST_RECOVERY, Worker, redis_in, start_worker
from tests.integration.runs_kit import client_on, eventually, kinds, logged, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test only: no other suite's worker may take these runs' steps."""
    yield from redis_in(tmp_path / "redis")


@pytest.fixture
def client(redis_server: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(redis_server)


def worker(
    redis_server: EmbeddedServer, tmp_path: Path, plan: Path | None = None
) -> Worker:
    env = {
        **FAST_RECOVERY,
        "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
        "TOOLLOOP_TEST_TOOL_LOG": str(tmp_path / "tools.jsonl"),
        "TOOLLOOP_KILL_PLAN": str(plan) if plan else "",
    }
    return start_worker(redis_server.url, tmp_path, env)


def published(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        line for line in logged(tmp_path / "tools.jsonl") if line["tool"] == "publish"
    ]


def held_call(client: Client, run_id: str) -> dict[str, Any]:
    status = client.wait(run_id, timeout=30)
    assert status.status == "asked" and status.approvals, status
    return status.approvals[0]


def test_killed_while_waiting_and_between_the_decision_and_the_tool(
    redis_server: EmbeddedServer, client: Client, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("[]")
    first = worker(redis_server, tmp_path, plan)
    run_id = client.enqueue(spec("approve"))
    held = held_call(client, run_id)
    first.kill()  # dies while the run waits: nothing of the wait lives in a worker

    n = int(client.redis.hget(f"tl:{{{run_id}}}:state", "n") or 0)
    plan.write_text(json.dumps([{"point": "advance:begin", "run": run_id, "n": n + 1}]))
    second = worker(redis_server, tmp_path, plan)
    try:
        assert client.status(run_id).approvals == [held]
        # the worker that applies it dies as the resumed step begins (maybe before it replies)
        with contextlib.suppress(TimeoutError):
            client.edit(run_id, held["call_id"], {"a": 6, "b": 6}, wait_s=3)
        eventually(lambda: second.process.poll() is not None, timeout=20)
        assert published(tmp_path) == []  # killed before the tool ran
    finally:
        second.kill()
    third = worker(redis_server, tmp_path, plan)
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        assert (status.final_text or "").endswith("published 6+6"), status
        # once, as decided
        assert published(tmp_path) == [
            {"tool": "publish", "ran_with": {"a": 6.0, "b": 6.0}}
        ]
        assert kinds(client, run_id).count("approval_decided") == 1
    finally:
        third.stop()


def test_a_deadline_that_passes_with_no_worker_running_is_applied_when_one_starts(
    redis_server: EmbeddedServer, client: Client, tmp_path: Path
) -> None:
    first = worker(redis_server, tmp_path)
    run_id = client.enqueue(spec("approve", approval_timeout_s=2))
    held = held_call(client, run_id)
    first.stop()
    time.sleep(max(0.0, held["deadline"] + 1 - time.time()))
    assert client.status(run_id).status == "asked"  # nobody swept it: no worker runs
    second = worker(redis_server, tmp_path)
    try:
        status = eventually(
            lambda: (s := client.status(run_id)).finished and s, timeout=30
        )
        assert (
            status.final_text
            == "Model read: Rejected by the person: no decision before the deadline."
        )
        assert published(tmp_path) == []
        assert "approval_expired" in kinds(client, run_id)
    finally:
        second.stop()
