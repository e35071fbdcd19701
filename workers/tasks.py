"""The Celery tasks: thin adapters, ids in, a call into `workers.advance` / `workers.runs`.

Task ids are readable: `<run_id>:<n>` for the n-th step of a run. Arguments are ids only, so no
prompt, message or key ever appears in a broker message or in Flower.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Task

from workers import advance as advance_step
from workers import runs, runtime
from workers.app import ADVANCE, ANSWER, CANCEL, SWEEP, app

log = logging.getLogger("toolloop.workers")
_lock = threading.Lock()
_shared: Any = None
_RETRY = app.conf.task_publish_retry_policy


@app.task(name=ADVANCE, bind=True)  # type: ignore[untyped-decorator]
def advance(self: Task, run_id: str, n: int) -> str:
    """Run the n-th step of a run and send the next one (or finish, or park)."""

    def progress(producer: Any = None, **fields: Any) -> None:
        try:
            with _lock:
                dispatcher = _dispatcher(self.request.hostname)
                if producer is None:
                    dispatcher.send(
                        "task-progress", uuid=self.request.id, retry=True, retry_policy=_RETRY, **fields
                    )
                    return
            fields["uuid"] = self.request.id  # in the step's send batch: one round trip with its successor
            dispatcher.publish("task-progress", fields, producer, retry=True, retry_policy=_RETRY)
        except Exception as error:  # progress is for people watching; it never fails a step
            log.warning("task-progress event of %s not sent: %s", self.request.id, error)

    return advance_step.advance(app, run_id, int(n), progress)


def _dispatcher(hostname: str) -> Any:
    """The process's event dispatcher for progress events (call it under `_lock`: it is not
    thread-safe). `Task.send_event` opens one per event, about twice the CPU; one shared dispatcher
    costs one connection per process, where one per pool thread would cost hundreds."""
    global _shared
    if _shared is None:
        _shared = app.events.Dispatcher(app.connection_for_write(), hostname=hostname, enabled=True)
    return _shared


@app.task(name=ANSWER)  # type: ignore[untyped-decorator]
def answer(run_id: str, answer_id: str) -> str:
    """Apply an answer from the run's inbox: the first answer to a held ask wins."""
    return runs.answer(runtime.redis(), app, run_id, answer_id)


@app.task(name=CANCEL)  # type: ignore[untyped-decorator]
def cancel(run_id: str) -> str:
    """Finish the cancel of a parked run (a running one stops through its abort signal)."""
    return runs.cancel(runtime.redis(), app, run_id)


@app.task(name=SWEEP)  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    """Re-send lost successors and re-drive stalled runs (each worker also sweeps on a timer)."""
    return runs.sweep(runtime.redis(), app)
