"""The Celery tasks: thin adapters, ids in, a call into `workers.advance` / `workers.runs`.

Task ids are readable: `<run_id>:<n>` for the n-th step of a run. Arguments are ids only, so no
prompt, message or key ever appears in a broker message or in Flower.
"""

from __future__ import annotations

import logging
import time

import redis
from celery import Task
from celery.exceptions import Reject

from workers import advance as advance_step
from workers import approvals, runs, runtime
from workers.app import ADVANCE, ANSWER, CANCEL, DECIDE, SWEEP, app
from workers.errors import OOM_HINT, REDIS_LOST, StepFailedError

log = logging.getLogger("toolloop.workers")


@app.task(name=ADVANCE, bind=True)  # type: ignore[untyped-decorator]
def advance(self: Task, run_id: str, n: int) -> str:
    """Run the n-th step of a run and send the next one (or finish, or park); the step runs on the
    process's asyncio loop while this pool thread waits (workers/runtime.py)."""
    task = advance_step.Task(task_id=self.request.id, hostname=self.request.hostname)
    try:
        outcome = runtime.run(advance_step.advance(run_id, int(n), task))
    except REDIS_LOST as error:  # Redis or the network went away: back on the queue, not acked
        log.warning("step %s goes back on its queue: %s: %s", self.request.id, type(error).__name__, error)
        if isinstance(error, redis.exceptions.OutOfMemoryError):
            log.error("%s", OOM_HINT)
            time.sleep(1.0)  # not at once: Redis refuses it again until memory is freed
        raise Reject(f"{type(error).__name__}: {error}", requeue=True) from error
    if outcome.failure is not None:  # committed as `failed`: Celery acks it and reports FAILURE
        raise StepFailedError(*outcome.failure)
    return str(outcome)


@app.task(name=ANSWER)  # type: ignore[untyped-decorator]
def answer(run_id: str, answer_id: str) -> str:
    """Apply an answer from the run's inbox: the first answer to a held ask wins."""
    return runs.answer(runtime.redis(), app, run_id, answer_id)


@app.task(name=DECIDE)  # type: ignore[untyped-decorator]
def decide(run_id: str, decision_id: str) -> str:
    """Apply a decision on a held call (approve, reject, edit): the first per call wins."""
    return approvals.apply(runtime.redis(), app, run_id, decision_id, runtime.toolsets().for_worker)


@app.task(name=CANCEL)  # type: ignore[untyped-decorator]
def cancel(run_id: str) -> str:
    """Finish the cancel of a parked run (a running one stops through its abort signal)."""
    return runs.cancel(runtime.redis(), app, run_id)


@app.task(name=SWEEP)  # type: ignore[untyped-decorator]
def sweep() -> dict[str, int]:
    """Re-send lost successors and re-drive stalled runs (each worker also sweeps on a timer)."""
    return runs.sweep(runtime.redis(), app)
