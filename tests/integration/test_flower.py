"""A real Flower process watching a real worker: a durable run's steps show as `toolloop.advance`
tasks whose arguments are ids only, seen through Flower's REST API with basic auth (and refused
without it)."""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import ROOT, WORKER_ENV, Worker, start_worker
from tests.integration.runs_kit import eventually, spec
from tests.support.flower import running_flower
from toolloop.embedded import EmbeddedServer, start_server
from workers.client import Client

pytestmark = pytest.mark.integration

AUTH = ("watcher", "s3cret-pass")
USER_TEXT = "Add 19 and 23, privately."
SYSTEM = "tools"  # the scripted model of tests/integration/agents.py: one `add` call, then the sum


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of this module only, so Flower sees only this module's worker and tasks."""
    server = start_server(tmp_path_factory.mktemp("flower-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def flower(redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`celery -A workers.app flower` on a free loopback port with basic auth; yields its URL."""
    log = tmp_path_factory.mktemp("flower") / "flower.log"
    env = {**os.environ, **WORKER_ENV, "REDIS_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    with running_flower(env, log, AUTH, timeout_s=30) as url:
        yield url


@pytest.fixture(scope="module")
def worker(
    redis_server: EmbeddedServer, flower: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """Started after Flower: Flower only knows the events it heard."""
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    process = start_worker(redis_server.url, tmp_path_factory.mktemp("flower-worker"), env)
    yield process
    process.stop()


def api(url: str, path: str, **params: Any) -> Any:
    response = httpx.get(f"{url}{path}", params=params, auth=AUTH, timeout=10)
    response.raise_for_status()
    return response.json()


def test_flower_api_needs_the_password(flower: str) -> None:
    assert httpx.get(f"{flower}/api/tasks", timeout=10).status_code == 401
    assert httpx.get(f"{flower}/api/tasks", auth=(AUTH[0], "wrong"), timeout=10).status_code == 401


def test_flower_lists_each_step_as_a_task_with_ids_only(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    prefix = worker.name.split("@")[0]
    eventually(lambda: any(prefix in name for name in api(flower, "/api/workers", refresh=1)))
    client = Client(redis_server.url)
    try:
        run_id = client.enqueue(spec(SYSTEM, USER_TEXT))
        status = client.wait(run_id, timeout=30)
        assert status.status == "done" and status.final_text == "The sum is 42."
    finally:
        client.close()

    def steps() -> dict[str, Any] | None:
        tasks: dict[str, Any] = api(flower, "/api/tasks", taskname="toolloop.advance")
        mine = {task_id: t for task_id, t in tasks.items() if run_id in task_id}
        done = len(mine) == 3 and all(t["state"] == "SUCCESS" for t in mine.values())
        return mine if done else None

    tasks = eventually(steps, timeout=20)  # model, tool, model: one task per step
    assert sorted(tasks) == [f"{run_id}:{n}" for n in (1, 2, 3)]
    for task_id, task in tasks.items():
        assert task["name"] == "toolloop.advance"
        assert ast.literal_eval(task["args"]) == [run_id, int(task_id.rsplit(":", 1)[1])]
        assert ast.literal_eval(task["kwargs"]) == {}
        assert task["worker"].startswith(worker.name.split("@")[0])
        assert "19" not in f"{task['args']}{task['kwargs']}{task['result']}".replace(run_id, "")
    assert "privately" not in json.dumps(tasks)  # no prompt reaches Flower
    info = api(flower, f"/api/task/info/{run_id}:1")
    assert info["name"] == "toolloop.advance" and info["state"] == "SUCCESS"


def test_flower_shows_a_refused_run_in_its_last_step_result(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    client = Client(redis_server.url)
    try:
        run_id = client.enqueue(spec("refuse", "Add, then refuse."))
        status = client.wait(run_id, timeout=30)
        assert status.status == "refused" and status.refusal == {
            "category": "cyber",
            "explanation": "Exploit development.",
        }
    finally:
        client.close()

    def last_step() -> dict[str, Any] | None:
        try:
            task: dict[str, Any] = api(flower, f"/api/task/info/{run_id}:3")
        except httpx.HTTPStatusError:  # Flower has not heard of it yet
            return None
        return task if task.get("state") == "SUCCESS" else None

    task = eventually(last_step, timeout=20)  # model, tool, then the refused model step
    assert ast.literal_eval(task["result"]) == "stop: refused (cyber)"
