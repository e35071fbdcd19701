"""Each step task sends a `task-progress` event (what Flower shows as the task's PROGRESS state).

Its `replayed` counts the stored steps the task replayed to reach its own: 0 for every step of a run
that stays on one worker, which goes on from where the run's loop paused at its last commit."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.integration.runs_kit import eventually, spec
from workers.client import Client


def test_each_step_task_reports_its_progress(runs_redis, worker) -> None:  # type: ignore[no-untyped-def]
    client = Client(runs_redis.url)
    seen: list[dict[str, Any]] = []
    with client.celery.connection_for_read() as connection:
        receiver = client.celery.events.Receiver(
            connection, handlers={"task-progress": seen.append}, app=client.celery
        )
        listening = threading.Thread(target=receiver.capture, kwargs={"wakeup": False}, daemon=True)
        listening.start()
        time.sleep(0.5)  # the receiver's queue is bound
        try:
            run_id = client.enqueue(spec("tools", user="Add 2 and 40."))
            assert client.wait(run_id, timeout=20).status == "done"
            eventually(lambda: len([e for e in seen if e.get("run_id") == run_id]) == 3)
        finally:
            receiver.should_stop = True
            listening.join(timeout=5)
    mine = sorted((e for e in seen if e.get("run_id") == run_id), key=lambda e: e["n"])
    assert [(e["uuid"], e["key"], e["phase"]) for e in mine] == [
        (f"{run_id}:1", "s0/model:1", "next"),
        (f"{run_id}:2", f"s0/tool:{mine[0]['next'].removeprefix('tool:')}", "next"),
        (f"{run_id}:3", "s0/model:2", "stop"),
    ]
    assert [e["replayed"] for e in mine] == [0, 0, 0]
    client.close()
