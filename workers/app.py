"""The Celery app of a toolloop worker: configuration only (workers/config/celery.py has it all).

Start a worker with `celery -A workers.app worker -P threads -c 8 -Q llm,tools,control -E`.
Its bootsteps (workers/worker/bootsteps.py, named here, loaded by the worker only) build the process's
`WorkerProcess` (workers/process/worker_process.py) and its step consumer (workers/worker/consumer.py),
which runs the
llm and tools steps as coroutines on one long-lived asyncio loop per process and the control
queue's tasks in threads; the threads pool runs what the step consumer does not take (every step
with `--step-queues none`). `workers.worker.remote` registers the remote-control commands, for the
worker and for `celery -A workers.app control` alike. A setting the worker refuses (a malformed
TOOLLOOP_RATE_LIMITS, a number out of range) stops it as it loads, with the setting's two-line
error and no traceback.
"""

from __future__ import annotations

from workers.config.celery import make_app, worker_options
from workers.worker import remote as control

try:
    app = make_app()
except ValueError as error:  # a setting refused (workers/config/settings.py): its two lines, no traceback
    raise SystemExit(str(error)) from None
worker_options(app)
app.steps["worker"].add("workers.worker.bootsteps:ProcessStep")
app.steps["worker"].add("workers.worker.bootsteps:StepConsumerStep")
app.steps["consumer"].add("workers.worker.bootsteps:PoisonGuardStep")

__all__ = ["app", "control"]
