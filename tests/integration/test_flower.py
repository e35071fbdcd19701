"""A real Flower process watching a real worker: a durable run's steps show as `toolloop.advance`
tasks whose arguments are ids only, seen through Flower's REST API with basic auth (and refused
without it)."""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import ROOT, WORKER_ENV, Worker, own_redis, start_worker
from tests.integration.runs_kit import eventually, spec
from tests.support.flower import running_flower
from toolloop.embedded import EmbeddedServer
from workers.client import Client

pytestmark = pytest.mark.integration

AUTH = ("watcher", "s3cret-pass")
USER_TEXT = "Add 19 and 23, privately."
SYSTEM = "tools"  # the scripted model of tests/integration/agents.py: one `add` call, then the sum


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of this module only, so Flower sees only this module's worker and tasks."""
    yield from own_redis(tmp_path_factory, "flower-redis")


@pytest.fixture(scope="module")
def flower(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`celery -A workers.app flower` on a free loopback port with basic auth; yields its URL."""
    log = tmp_path_factory.mktemp("flower") / "flower.log"
    env = {
        **os.environ,
        **WORKER_ENV,
        "REDIS_URL": redis_server.url,
        "PYTHONPATH": str(ROOT),
    }
    with running_flower(env, log, AUTH, timeout_s=30) as url:
        yield url


@pytest.fixture(scope="module")
def worker(
    redis_server: EmbeddedServer, flower: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """Started after Flower: Flower only knows the events it heard."""
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    process = start_worker(
        redis_server.url, tmp_path_factory.mktemp("flower-worker"), env
    )
    yield process
    process.stop()


def api(url: str, path: str, **params: Any) -> Any:
    response = httpx.get(f"{url}{path}", params=params, auth=AUTH, timeout=10)
    response.raise_for_status()
    return response.json()


def test_flower_api_needs_the_password(flower: str) -> None:
    assert httpx.get(f"{flower}/api/tasks", timeout=10).status_code == 401
    assert (
        httpx.get(
            f"{flower}/api/tasks", auth=(AUTH[0], "wrong"), timeout=10
        ).status_code
        == 401
    )


def test_flower_lists_each_step_as_a_task_with_ids_only(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    prefix = worker.name.split("@")[0]
    eventually(
        lambda: any(prefix in name for name in api(flower, "/api/workers", refresh=1))
    )
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
    labels = {task_id: ast.literal_eval(t["kwargs"]) for task_id, t in tasks.items()}
    assert labels == {  # each row says what the step is; the arguments stay ids
        f"{run_id}:1": {"step": "model 1"},
        f"{run_id}:2": {"step": "tool add"},
        f"{run_id}:3": {"step": "model 2"},
    }
    for task_id, task in tasks.items():
        assert task["name"] == "toolloop.advance"
        assert ast.literal_eval(task["args"]) == [
            run_id,
            int(task_id.rsplit(":", 1)[1]),
        ]
        assert task["worker"].startswith(worker.name.split("@")[0])
        assert "19" not in f"{task['args']}{task['kwargs']}{task['result']}".replace(
            run_id, ""
        )
    assert "privately" not in json.dumps(tasks)  # no prompt reaches Flower
    info = api(flower, f"/api/task/info/{run_id}:1")
    assert info["name"] == "toolloop.advance" and info["state"] == "SUCCESS"


def test_flower_reports_the_step_that_failed_its_run_as_failure(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    client = Client(redis_server.url)
    try:  # the scripted model has no scenario "nosuch": its call raises, the run fails at step 1
        run_id = client.enqueue(spec("nosuch", "A secret prompt, privately."))
        status = client.wait(run_id, timeout=30)
        assert status.status == "failed" and status.error_class == "AssertionError"
    finally:
        client.close()

    def failed() -> Any:
        task = api(flower, "/api/tasks", taskname="toolloop.advance").get(f"{run_id}:1")
        return task if task and task["state"] == "FAILURE" else None

    task = eventually(failed, timeout=20)
    assert task["exception"] == "AssertionError(\"No scripted scenario 'nosuch'.\")"
    assert ast.literal_eval(task["kwargs"]) == {"step": "model 1"}
    assert "privately" not in json.dumps(task)
    # the worker's counters (Flower's dashboard) count it
    dashboard = api(flower, "/api/workers")
    assert any(name.startswith(worker.name.split("@")[0]) for name in dashboard)


def test_flower_lists_the_step_queues_with_their_lengths(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    eventually(
        lambda: any(
            "llm" in str(w) for w in api(flower, "/api/workers", refresh=1).values()
        )
    )
    queues = {q["name"]: q for q in api(flower, "/api/queues/length")["active_queues"]}
    assert {"llm", "tools", "control"} <= set(queues)
    assert all(isinstance(q["messages"], int) for q in queues.values())


def test_celery_inspect_shows_the_steps_in_flight_and_the_step_queues(
    redis_server: EmbeddedServer, worker: Worker
) -> None:
    client = Client(redis_server.url)
    inspect = client.celery.control.inspect(timeout=3)
    try:
        declared = eventually(lambda: inspect.active_queues(), timeout=10)
        names = {q["name"] for queues in declared.values() for q in queues}
        assert {"llm", "tools", "control"} <= names
        # a tool that sleeps 30 s unless the run is cancelled
        run_id = client.enqueue(spec("slow"))

        def in_flight() -> Any:
            found = [t for tasks in (inspect.active() or {}).values() for t in tasks]
            return [
                t
                for t in found
                if t["id"].startswith(run_id) and t["kwargs"] == {"step": "tool slow"}
            ]

        [task] = eventually(in_flight, timeout=20)
        assert task["name"] == "toolloop.advance" and task["args"] == [run_id, 2]
        # a revoke of a step cancels its run (the step consumer honours that, not Celery's revoked set)
        client.celery.control.revoke(task["id"])
        assert client.wait(run_id, timeout=20).status == "cancel"
    finally:
        client.close()


def test_flower_started_as_compose_and_the_procfile_do_is_read_only(
    redis_server: EmbeddedServer, worker: Worker, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        **WORKER_ENV,
        "REDIS_URL": redis_server.url,
        "PYTHONPATH": str(ROOT),
    }
    with running_flower(
        env, tmp_path / "flower.log", AUTH, timeout_s=30, read_only=True
    ) as url:
        for path in (
            "/api/task/revoke/x:1",
            f"/api/worker/shutdown/{worker.name}",
            "/api/task/async-apply/toolloop.sweep",
        ):
            refused = httpx.post(f"{url}{path}", auth=AUTH, timeout=10)
            assert refused.status_code == 403, (path, refused.status_code)
        # it still shows
        assert httpx.get(f"{url}/api/tasks", auth=AUTH, timeout=10).status_code == 200


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


def test_the_step_after_an_answer_is_labelled_with_its_number(
    redis_server: EmbeddedServer, flower: str, worker: Worker
) -> None:
    client = Client(redis_server.url)
    try:  # "ask2": model 1 asks, the answer resumes it, model 2 asks again, model 3 ends it
        run_id = client.enqueue(spec("ask2"))
        client.wait(run_id, timeout=30)
        client.answer(run_id, "first")
        eventually(
            lambda: (s := client.status(run_id)).status == "asked" and s.segment == 1,
            timeout=30,
        )
        client.answer(run_id, "second")
        assert client.wait(run_id, timeout=30).status == "done"
    finally:
        client.close()

    def models() -> dict[str, Any] | None:
        tasks: dict[str, Any] = api(flower, "/api/tasks", taskname="toolloop.advance")
        mine = {task_id: t for task_id, t in tasks.items() if run_id in task_id}
        done = len(mine) == 3 and all(t["state"] == "SUCCESS" for t in mine.values())
        return mine if done else None

    tasks = eventually(models, timeout=20)
    labels = [ast.literal_eval(tasks[f"{run_id}:{n}"]["kwargs"]) for n in (1, 2, 3)]
    # as `toolloop events` numbers them
    assert labels == [
        {"step": "model 1"},
        {"step": "model 2"},
        {"step": "model 3"},
    ]
