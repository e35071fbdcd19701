"""The Celery tasks: thin adapters, ids in, a call into `workers.step.advance` / `workers.runs.lifecycle`.

Task ids are readable: `<run_id>:<n>` for the n-th step of a run (workers/protocol/names.py). Arguments are
ids only, so no prompt, message or key ever appears in a broker message or in Flower. Each task
finds the worker's `WorkerProcess` on its app (`process_of`, attached by workers/worker/bootsteps.py).
"""

from __future__ import annotations

import logging
import time

import redis
from celery import Task
from celery.exceptions import Reject

from workers.app import app
from workers.process.worker_process import process_of
from workers.protocol.errors import OOM_HINT, REDIS_LOST, StepFailedError
from workers.protocol.names import ADVANCE, ANSWER, CANCEL, DECIDE, SWEEP
from workers.runs import approvals
from workers.runs import lifecycle as runs
from workers.runs.scheduler import Scheduler
from workers.step import advance as advance_step
from workers.step.mcptools import journaled_tools

log = logging.getLogger("toolloop.workers")


@app.task(name=ADVANCE, bind=True)  # type: ignore[untyped-decorator]
def advance(self: Task, run_id: str, n: int) -> str:
    """Run the n-th step of a run and send the next one (or finish, or park); the step runs on the
    process's asyncio loop while this pool thread waits (workers/process/worker_process.py)."""
    process = process_of(self.app)
    task = advance_step.Task(task_id=self.request.id, hostname=self.request.hostname)
    try:
        outcome = process.run(advance_step.advance(process, run_id, int(n), task))
    except (
        REDIS_LOST
    ) as error:  # Redis or the network went away: back on the queue, not acked
        log.warning(
            "step %s goes back on its queue: %s: %s",
            self.request.id,
            type(error).__name__,
            error,
        )
        if isinstance(error, redis.exceptions.OutOfMemoryError):
            log.error("%s", OOM_HINT)
            time.sleep(1.0)  # not at once: Redis refuses it again until memory is freed
        raise Reject(f"{type(error).__name__}: {error}", requeue=True) from error
    if (
        outcome.failure is not None
    ):  # committed as `failed`: Celery acks it and reports FAILURE
        raise StepFailedError(*outcome.failure)
    return str(outcome)


@app.task(name=ANSWER, bind=True)  # type: ignore[untyped-decorator]
def answer(self: Task, run_id: str, answer_id: str) -> str:
    """Apply an answer from the run's inbox: the first answer to a held ask wins."""
    process = process_of(self.app)
    return runs.answer(process.redis, self.app, run_id, answer_id, process.hooks)


@app.task(name=DECIDE, bind=True)  # type: ignore[untyped-decorator]
def decide(self: Task, run_id: str, decision_id: str) -> str:
    """Apply a decision on a held call (approve, reject, edit): the first per call wins."""
    process = process_of(self.app)
    return approvals.apply(
        process.redis,
        self.app,
        run_id,
        decision_id,
        lambda name: journaled_tools(process, run_id, name),
        process.settings.retention,
        process.settings.max_early_decisions,
    )


@app.task(name=CANCEL, bind=True)  # type: ignore[untyped-decorator]
def cancel(self: Task, run_id: str) -> str:
    """Finish the cancel of a parked run (a running one stops through its abort signal)."""
    process = process_of(self.app)
    return runs.cancel(process.redis, self.app, run_id, process.hooks)


@app.task(name=SWEEP, bind=True)  # type: ignore[untyped-decorator]
def sweep(self: Task) -> dict[str, int]:
    """Re-send lost successors and re-drive stalled runs, settle due waits, fire due schedules (each
    worker also sweeps on a timer)."""
    process = process_of(self.app)
    settled = approvals.sweep_due(process.redis, self.app, process.settings.retention)
    done = runs.sweep(process.redis, self.app, process.settings)
    fires = Scheduler(process.redis, process.settings, process.metrics).fire_due()
    return {**done, "settled": settled, "fired": fires.get("fired", 0)}
