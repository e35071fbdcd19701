"""The one module that knows every part of a worker: its bootsteps and its threads.

`workers.app` names these bootsteps by dotted path; Celery loads this module in the worker only
(not in a client, Flower or `celery control`):

- `ProcessStep` refuses broker transport options that change kombu's Redis layout
  (workers/worker/kombu_redis.py), builds the process's `WorkerProcess` (workers/process/worker_process.py)
  once, attaches it to the Celery app (its tasks and remote-control commands find it there) and,
  as the worker starts, starts its asyncio loop thread, the cancel listener and the sweeper.
- `StepConsumerStep` runs a `StepConsumer` (workers/worker/consumer.py) on that process when the worker
  has step queues (`--step-queues`, default: toolloop's queues among `-Q`).
- `PoisonGuardStep` guards Celery's own consumer against messages that are not tasks
  (workers/worker/guard.py).

Threads of a worker process:
- the cancel listener subscribes to `keys.CANCEL_CHANNEL`; a run id published there aborts that
  run's live step if this process runs it, and drops its kept loop;
- the sweeper runs `runs.sweep` every TOOLLOOP_SWEEP_INTERVAL s, one worker at a time (a Redis lock,
  kept while it sweeps),
  so recorded successors are re-sent and stalled runs re-driven without a beat process; once a
  second it also settles the parked runs whose deadline is due (workers/runs/approvals.py) and fires the
  due schedules (workers/runs/scheduler.py: in every worker, fenced per tick, no lock).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import re
import sys
import threading
import time
from typing import Any

import redis as redis_lib
from celery import bootsteps

from toolloop.defaults import no_redis_message
from workers.config.settings import Settings
from workers.observe import tracing
from workers.process.worker_process import WorkerProcess, attach, process_of
from workers.protocol import keys, names
from workers.runs import approvals
from workers.runs import lifecycle as runs
from workers.runs.scheduler import Scheduler
from workers.worker import guard
from workers.worker.consumer import StepConsumer
from workers.worker.kombu_redis import check_transport_options
from workers.worker.trim import IdleTrim

log = logging.getLogger("toolloop.workers")


class ProcessStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: the process's `WorkerProcess`, built once, started with the worker."""

    label = "toolloop worker process"

    def __init__(self, worker: Any, **kw: Any) -> None:
        super().__init__(worker, **kw)
        settings = Settings.from_env()
        if not settings.redis_source:  # the rule of every entry point (find_redis_url)
            raise RuntimeError(no_redis_message())
        # the layout wire.py writes
        check_transport_options(worker.app.conf.broker_transport_options)
        # Toolsets import from the worker's working directory, as the `toolloop` commands do, so
        # `celery -A workers.app worker` run in a checkout serves examples.storyboard.tools as is.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        self.process = WorkerProcess(worker.app, settings)
        attach(worker.app, self.process)

    def start(self, worker: Any) -> None:
        start_threads(self.process)


class StepConsumerStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: runs a `StepConsumer` when the worker has step queues."""

    label = "toolloop step consumer"
    requires = (ProcessStep,)

    def __init__(
        self,
        worker: Any,
        step_queues: str | None = None,
        steps_in_flight: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(worker, **kw)
        named = (
            step_queues
            if step_queues is not None
            else os.environ.get("TOOLLOOP_STEP_QUEUES")
        )
        selected = worker.app.amqp.queues
        consumed = list(selected.consume_from or selected)
        if (
            named is None
        ):  # the default: toolloop's step queues among those the worker consumes
            self.queues = [name for name in names.STEP_QUEUES if name in consumed]
        else:
            self.queues = [
                q.strip()
                for q in named.split(",")
                if q.strip() and q.strip().lower() != "none"
            ]
        self.capacity = steps_in_flight or int(
            os.environ.get("TOOLLOOP_STEPS_IN_FLIGHT", "") or 500
        )
        if self.capacity < 1:
            raise ValueError(
                f"--steps-in-flight must be at least 1, not {self.capacity}."
            )
        self.taken = [name for name in self.queues if name in consumed]

    def include_if(self, worker: Any) -> bool:
        return bool(self.queues)

    def start(self, worker: Any) -> Any:
        """Take the step queues from Celery's own consumer (it keeps the rest, if any), then start.
        Done here, not at init: the worker's banner (printed as the blueprint starts, before any step
        starts) lists the queues the worker takes from, these included."""
        selected = worker.app.amqp.queues
        for name in self.taken:
            if name in (selected.consume_from or selected):
                selected.deselect(name)
        return super().start(worker)

    def create(self, worker: Any) -> StepConsumer:
        process = process_of(worker.app)
        timeout = float(worker.app.conf.worker_soft_shutdown_timeout or 30)
        service = _Service(
            process, self.queues, self.capacity, worker.hostname, timeout
        )
        process.consumer = service
        return service


class _Service(StepConsumer):
    """A `StepConsumer` with the start/stop/terminate of a bootstep's object."""

    def __init__(
        self,
        process: WorkerProcess,
        queues: list[str],
        capacity: int,
        hostname: str,
        timeout: float,
    ) -> None:
        super().__init__(process, queues, capacity, hostname)
        self.timeout = timeout

    def stop(self, timeout: float | None = None) -> None:
        super().stop(self.timeout if timeout is None else timeout)

    def terminate(self) -> None:
        super().stop(0.0)


class PoisonGuardStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Consumer bootstep: guard the task consumer's channel (workers/worker/guard.py)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "toolloop poison guard"

    def start(self, c: Any) -> None:
        process = process_of(c.app)
        channel = getattr(getattr(c, "task_consumer", None), "channel", None)
        if channel is not None and not guard.guard_channel(
            channel, c.hostname, process.settings.max_task_bytes, process.redis
        ):
            log.warning(
                "celery consumer: the broker channel has no BRPOP reader; poison guard not installed"
            )


# -- the threads of a worker process -----------------------------------------------------------------


def start_threads(process: WorkerProcess) -> None:
    """What a worker process runs beside its consumers: tracing, the loop, cancels, the sweeper."""
    tracing.configure()  # before gc.freeze: the SDK's objects are frozen with the rest
    if os.environ.get("TOOLLOOP_GC", "1") == "1":
        gc.freeze()
        gc.set_threshold(
            *collector_thresholds(getattr(process.consumer, "capacity", 0))
        )
    check_redis(process.redis)
    settings = process.settings
    if settings.metrics_port:
        process.start_metrics(settings.metrics_port, settings.metrics_host)
    process.start_loop()
    threading.Thread(
        target=_listen_for_cancels, args=(process,), name="toolloop-cancel", daemon=True
    ).start()
    if settings.sweep_interval > 0:
        threading.Thread(
            target=_sweep_forever, args=(process,), name="toolloop-sweep", daemon=True
        ).start()
        threading.Thread(
            target=_fire_forever,
            args=(process,),
            name="toolloop-schedules",
            daemon=True,
        ).start()


YOUNG_PER_STEP = 200
"""Generation-0 threshold per step the process may run at once (at least 100,000 in all)."""


def collector_thresholds(steps_in_flight: int) -> tuple[int, int, int]:
    """The worker's collector thresholds (with TOOLLOOP_GC=1, after `gc.freeze()`).

    A generation-0 collection walks every young object still alive, and between two steps of a run
    nearly all of a step's own objects are young and alive (its coroutines, futures, request and
    answer): at 2,000 steps in flight that is ~130,000 objects each time, found alive again (a few
    hundred collected in a whole `bench/scale.py` trial), so a fixed threshold of 100,000 walked them
    once per ~2,000 steps. The threshold grows with the steps in flight (YOUNG_PER_STEP each), so
    the walk stays a small part of what a collection finds. Memory: nothing the worker makes per
    step lives in a reference cycle (they die by refcount); a cycle that does form waits at most that
    many more allocations for its collection, as it did for 100,000 at 500 steps in flight."""
    return max(100_000, YOUNG_PER_STEP * steps_in_flight), 50, 1000


def _listen_for_cancels(process: WorkerProcess) -> None:
    while True:
        try:
            pubsub = process.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            pubsub.subscribe(keys.CANCEL_CHANNEL, keys.INTERRUPT_CHANNEL)
            while True:
                message = pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "message":
                    if str(message.get("channel")) == keys.INTERRUPT_CHANNEL:
                        process.interrupted(str(message["data"]))
                    else:
                        process.cancelled(str(message["data"]))
        except redis_lib.RedisError as error:
            log.warning("cancel listener lost Redis (%s); reconnecting", error)
            time.sleep(1.0)


def _sweep_forever(process: WorkerProcess) -> None:
    """The full sweep every TOOLLOOP_SWEEP_INTERVAL s (one worker at a time); in between, once a
    second, the waits whose deadline is due (a cheap range read when none is), and the idle
    worker's free memory given back to the OS (workers/worker/trim.py)."""
    settings = process.settings
    tick = min(1.0, settings.sweep_interval)
    last = time.monotonic()
    idle = IdleTrim(process.leases, shed=process.shed_tool_threads)
    while True:
        time.sleep(tick)
        try:
            idle.tick()
            client = process.redis
            approvals.sweep_due(client, process.celery, settings.retention)
            if time.monotonic() - last < settings.sweep_interval:
                continue
            last = time.monotonic()
            held = int(settings.sweep_interval * 1000)
            owner = process.new_owner()
            if client.set(keys.SWEEP_LOCK, owner, nx=True, px=held):
                # kept while it sweeps (a sweep of many live runs outlasts the interval): the
                # other workers' sweepers wait for it rather than sweep the same runs beside it
                done = runs.sweep(
                    client,
                    process.celery,
                    settings,
                    between=functools.partial(
                        runs.keep_sweep_lock, client, owner, held
                    ),
                )
                if process.metrics is not None:
                    process.metrics.swept(done)
        except Exception as error:  # the sweeper must outlive any one failure
            log.warning("sweep failed: %s: %s", type(error).__name__, error)


FIRE_BUDGET_S = 0.25
"""How long one round of `_fire_forever` fires due schedules before it reads the due index again
(10,000 on one tick: a few rounds, back to back)."""
FIRE_LAG_S = 0.005
"""How long after a schedule's tick `_fire_forever` looks."""
FIRE_MIN_WAIT_S = 0.05
"""The shortest wait between two looks (a tick that came due while it fired: soon after)."""


def _fire_forever(process: WorkerProcess) -> None:
    """The due schedules, fired by a thread of their own (workers/runs/scheduler.py): it waits until the
    earliest tick in the due index (a cron tick falls on a whole second) or a second at most (every
    TOOLLOOP_SWEEP_INTERVAL s when that is shorter), then fires in rounds of FIRE_BUDGET_S, back to
    back while due ones are left. The full sweep (`_sweep_forever`, seconds with many live runs)
    does not hold a tick back, and a tick of many schedules does not hold back the sweep."""
    settings = process.settings
    tick = min(1.0, settings.sweep_interval)
    scheduler: Scheduler | None = (
        None  # made in the loop: a failure to make it is logged, and tried again
    )
    wait = tick
    while True:
        if wait > 0:
            time.sleep(wait)
        wait = tick
        try:
            scheduler = scheduler or Scheduler(process.redis, settings, process.metrics)
            done = scheduler.fire_due(budget_s=FIRE_BUDGET_S)
            if scheduler.more:
                wait = 0.0
            elif tick >= 1.0 and not done.get(
                "error"
            ):  # (a failing fire: once a second)
                wait = _until_due(process.redis, tick)
        except Exception as error:  # the thread must outlive any one failure
            log.warning("firing schedules failed: %s: %s", type(error).__name__, error)


def _until_due(client: redis_lib.Redis, most: float) -> float:
    """How long to wait for the earliest tick in the due index (FIRE_LAG_S after it), `most` at most."""
    first: list[tuple[str, float]] = client.zrange(  # type: ignore[assignment]
        keys.SCHEDULES_DUE, 0, 0, withscores=True
    )
    if not first:
        return most
    return min(most, max(FIRE_MIN_WAIT_S, first[0][1] - time.time() + FIRE_LAG_S))


MIN_REDIS = (6, 2)
"""The oldest Redis the workers' commands run on: the sweeper re-dates outbox records with `ZADD XX
LT` (workers/runs/lifecycle.py `flush_outbox`), new in 6.2; an older server refuses it, and a sweep that
re-dates a record (an enqueuing process with a longer TOOLLOOP_REDRIVE_AGE, or a clock ahead of the
sweeper's) fails from that run on."""


def too_old(version: str) -> bool:
    """True when `version` (INFO's `redis_version`, "6.0.16") is older than MIN_REDIS."""
    parts = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    return len(parts) == 2 and parts < MIN_REDIS


def check_redis(client: redis_lib.Redis) -> None:
    """Warn when Redis is older than MIN_REDIS, or can lose the journal: AOF off, an eviction policy
    other than noeviction, or no maxmemory."""
    with contextlib.suppress(
        redis_lib.RedisError
    ):  # INFO may be renamed away on a managed Redis
        version = str(client.info("server").get("redis_version", ""))
        if too_old(version):
            log.warning(
                "Redis %s is older than %d.%d, which toolloop needs (ZADD LT): sweeps can fail, and lost "
                "steps then are not sent again.\n  Run Redis >= 6.2 or Valkey (docs/operations.md).",
                version,
                *MIN_REDIS,
            )
    try:
        config: dict[str, str] = client.config_get("appendonly")  # type: ignore[assignment]
        config.update(client.config_get("maxmemory-policy"))  # type: ignore[arg-type]
        config.update(client.config_get("maxmemory"))  # type: ignore[arg-type]
    except redis_lib.RedisError:
        return  # CONFIG is often disabled on managed Redis
    if config.get("appendonly") != "yes":
        log.warning(
            "Redis runs without AOF (appendonly=%s): a Redis restart can lose journal steps and queued "
            "tasks.\n  Set appendonly yes (appendfsync everysec), see docs/operations.md.",
            config.get("appendonly"),
        )
    if config.get("maxmemory") == "0":
        log.warning(
            "Redis has no maxmemory: it grows until the OS kills it.\n"
            "  Set maxmemory (with maxmemory-policy noeviction a full Redis refuses writes instead); "
            "`toolloop doctor` checks this."
        )
    if config.get("maxmemory-policy") not in (None, "noeviction"):
        log.warning(
            "Redis may evict keys (maxmemory-policy=%s): an evicted journal or queue is lost silently.\n"
            "  Set maxmemory-policy noeviction.",
            config.get("maxmemory-policy"),
        )
