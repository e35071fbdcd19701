"""Each step task sends a `task-progress` event (what Flower shows as the task's PROGRESS state).

Its `replayed` counts the stored steps the task replayed to reach its own: 0 for every step of a run
that stays on one worker, which goes on from where the run's loop paused at its last commit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.runs_kit import celery_events, client_on, eventually, spec
from workers.client import Client


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_each_step_task_reports_its_progress(client: Client) -> None:
    with celery_events(client, "task-progress") as seen:
        run_id = client.enqueue(spec("tools", user="Add 2 and 40."))
        assert client.wait(run_id, timeout=20).status == "done"
        eventually(lambda: len([e for e in seen if e.get("run_id") == run_id]) == 3)
    mine = sorted((e for e in seen if e.get("run_id") == run_id), key=lambda e: e["n"])
    assert [(e["uuid"], e["key"], e["phase"]) for e in mine] == [
        (f"{run_id}:1", "s0/model:1", "next"),
        (f"{run_id}:2", f"s0/tool:{mine[0]['next'].removeprefix('tool:')}", "next"),
        (f"{run_id}:3", "s0/model:2", "stop"),
    ]
    assert [e["replayed"] for e in mine] == [0, 0, 0]
