"""The step consumer: a worker takes its step queues' tasks itself and runs each as a coroutine on the
process's asyncio loop, hundreds at once, with no thread per step and no Celery machinery per step.

A worker has one unless told otherwise: of the queues it consumes (`-Q`), toolloop's queues `llm`,
`tools` and `control` go to the step consumer (control tasks run in a thread of the loop's executor)
and any other stays with Celery's own consumer and its pool. `--step-queues a,b` (or
TOOLLOOP_STEP_QUEUES) names them; `--step-queues none` runs every step as a Celery task in the pool
instead (the slower path, same results):

    celery -A workers.app worker -P threads -c 8 -Q llm,tools,control --steps-in-flight 500 -E

Why: a Celery task costs ~2-6 ms of CPU in the worker (its consumer, request, pool hand-off, four
events, the ack), the same whether the task waits 1 s on a model or not; 500 runs in flight at 1 s
per call need ~1,000 steps/s from one process (docs/operations.md has the figures). Here a step
costs its own work plus its share of one Redis pipeline per loop turn (workers/process/redisio.py).

Poison messages: no message content stops the consumer. A message that is not a valid toolloop
task (not JSON, a body that is not base64 or not JSON, missing or mistyped headers or arguments, an
unknown task, a delivery tag that is not a string, larger than TOOLLOOP_MAX_TASK_BYTES) is moved to
the rejected list `toolloop:rejected` (keys.REJECTED: one JSON entry per message, newest first, with
the reason and the raw message) with an error log line, and the steps claimed beside it run.

What does not change: the steps are Celery task messages on the same queues (workers/protocol/wire.py), so a
stock Celery worker can run them too, Flower lists them (task-received/started/succeeded/failed
events from this worker's hostname) and every delivery guarantee holds as with Celery's late ack:
- a message is popped and recorded in kombu's `unacked` hash in one script (CLAIM), and acked only
  after its step committed; a crash leaves it there, and any Celery worker restores it once it is
  older than the visibility timeout (the run's outbox and the sweeper bring it back sooner);
- a step that fails on Redis or the network (not a failure of the run: those commit as `failed`) is
  put back on its queue at once, retried until Redis answers;
- at warm shutdown the consumer stops taking steps, lets running ones finish for
  `worker_soft_shutdown_timeout` s, then puts the rest back on their queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import redis as redis_lib

from workers.process.live import Begun
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys, names, wire
from workers.protocol.errors import OOM_HINT, REDIS_LOST, failure_repr
from workers.step import advance
from workers.worker.kombu_redis import KombuRedisQueue
from workers.worker.queue import Claimed, StepQueue

log = logging.getLogger("toolloop.workers")

_CLAIM_MAX = 256
_CONTROL_MAX = 64
"""Control tasks (answers, decisions, cancels) running at once beside the steps: they take no step
slot, so a decision reaches a worker whose steps fill every slot (`Client.approve` waits for it)."""
_BLOCK_S = 1.0
_OOM_PAUSE_S = 1.0
"""How long a step Redis refused for OOM waits before it goes back on its queue."""
REJECTED = keys.REJECTED
"""The rejected list (see the module docstring and docs/workers.md, "The rejected list")."""


class StepConsumer:
    """Runs the tasks of `queues` on the process loop, at most `capacity` at once."""

    def __init__(
        self,
        process: WorkerProcess,
        queues: list[str],
        capacity: int,
        hostname: str,
        transport: StepQueue | None = None,
    ) -> None:
        self.process = process
        self.queues = list(dict.fromkeys(queues))
        self.capacity = capacity
        self.hostname = hostname
        self.free = capacity
        self.control_free = _CONTROL_MAX
        self.control_only = False
        """The consumer waits on the control queue alone (every step slot taken)."""
        self.stopping = False
        self.running: dict[str, asyncio.Task[None]] = {}
        self.in_flight: dict[str, tuple[str, wire.Delivery, float]] = {}
        """tag -> (queue, delivery, start time) of each running step, for `celery inspect active`
        (read from Celery's consumer thread: it copies the dict, never iterates it live)."""
        self.room: asyncio.Event | None = None
        self.main: asyncio.Future[None] | None = None
        self.wake_key = keys.wake_key(hostname)
        """A list only this consumer waits on, beside its queues: a push ends its BRPOP at once."""
        self.transport: StepQueue = transport or KombuRedisQueue(
            process.batch,
            process.async_client,
            self.wake_key,
            process.settings.max_task_bytes,
            _BLOCK_S,
        )
        """Where the messages come from and go back to (workers/worker/queue.py); the consumer schedules."""

    @contextlib.asynccontextmanager
    async def lend(self) -> AsyncIterator[None]:
        """While a running step only waits (for room under a rate limit: workers/flow/limiter.py), its slot
        is lent to the next message; it is taken back when the wait ends, so `free` may dip below 0
        for as long as the borrowers run (at most `capacity` more steps, all of them waiting)."""
        self.free += 1
        if self.room is not None:
            self.room.set()
        try:
            yield
        finally:
            self.free -= 1

    # -- from the worker's threads ----------------------------------------------------------------

    def start(self) -> None:
        self.main = asyncio.run_coroutine_threadsafe(
            self._consume(), self.process.start_loop()
        )  # type: ignore[assignment]
        log.info(
            "step consumer: queues %s, up to %d steps at once",
            ",".join(self.queues),
            self.capacity,
        )

    def stop(self, timeout: float) -> None:
        """Stop taking steps; wait up to `timeout` s for running ones, then put the rest back."""
        future = asyncio.run_coroutine_threadsafe(
            self._shutdown(timeout), self.process.start_loop()
        )
        future.result(timeout=timeout + 30)

    def add_queue(self, queue: str) -> None:
        if queue not in self.queues:
            self.queues.append(queue)
            self._wake()

    def cancel_queue(self, queue: str) -> None:
        if queue in self.queues:
            self.queues.remove(queue)
            self._wake()

    def _wake(self) -> None:
        """End a claim that waits on the old queue list (thread-safe)."""
        self.process.start_loop().call_soon_threadsafe(self.transport.wake)

    # -- on the loop ------------------------------------------------------------------------------

    async def _restore_visible(self) -> None:
        """Every TOOLLOOP_RESTORE_INTERVAL s, put back on their queues the messages delivered longer
        than TOOLLOOP_VISIBILITY_TIMEOUT ago and never acked (a dead consumer's), as kombu does in a
        Celery consumer: a worker whose every queue is a step queue has no Celery consumer doing it."""
        settings = self.process.settings
        while not self.stopping:
            await asyncio.sleep(settings.restore_interval)
            try:
                restored = await self.transport.restore_visible(
                    time.time() - settings.visibility_timeout, 100
                )
                if restored:
                    log.warning(
                        "step consumer: %d unacked steps were older than the visibility timeout (%g s) "
                        "and went back on their queues",
                        restored,
                        settings.visibility_timeout,
                    )
            except (OSError, redis_lib.RedisError) as error:
                log.warning("step consumer: restoring unacked steps failed (%s)", error)

    async def _consume(self) -> None:
        asyncio.get_running_loop().create_task(self._restore_visible())
        self.room = asyncio.Event()
        while not self.stopping:
            queues, most = self._claimable()
            if not most:
                self.room.clear()
                await self.room.wait()
                continue
            try:
                got = await self.transport.claim(queues, most)
            except (OSError, redis_lib.RedisError) as error:
                log.warning(
                    "step consumer: Redis unreachable (%s); retrying in 1 s", error
                )
                await asyncio.sleep(1.0)
                continue
            except Exception:  # never ends the consumer: log and go on
                log.exception("step consumer: taking messages failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                continue
            for one in got:
                try:
                    self._dispatch(one)
                except (
                    Exception
                ) as error:  # a bug in dispatch must not strand the rest of the batch
                    log.exception(
                        "step consumer: a message on %r could not be dispatched",
                        one.queue,
                    )
                    self.reject(one, f"dispatch failed: {type(error).__name__}")
        await self.transport.close()

    def _claimable(self) -> tuple[list[str], int]:
        """The queues to take messages from now and how many at most (0: wait for room). A consumer
        whose step slots are all taken still takes control tasks: they have slots of their own."""
        self.control_only = self.free <= 0 and names.CONTROL in self.queues
        if self.free > 0:
            return list(self.queues), min(self.free, _CLAIM_MAX)
        return [names.CONTROL], min(
            self.control_free, _CLAIM_MAX
        ) if self.control_only else 0

    def hand_off(
        self, queue: str, delivery: wire.Delivery
    ) -> asyncio.Future[Any] | None:
        """Run a successor this process just produced here, without the round trip through its
        queue: it is recorded as delivered to this consumer (`StepQueue.record`, as a claim does) and
        started at once. Only for a queue this consumer takes, while it has room and is not
        stopping; None otherwise (the caller pushes it on its queue). A crash before the record
        lands leaves the successor in the run's outbox, which the sweeper sends again. The future
        is the record's write (the kill-point suite waits for it)."""
        if self.stopping or self.free <= 1 or queue not in self.queues:
            return None
        recorded = self.transport.record(queue, delivery)
        self._start(queue, delivery)
        return recorded

    def steps_running(self) -> int:
        """Steps running now (what `toolloop_steps_in_flight` reports)."""
        return self.capacity - self.free

    def can_go_on(self, queue: str) -> bool:
        """True when a run's next step for `queue` can go on here as its predecessor commits
        (`run_begun`). It takes its predecessor's place, which has nothing left but its events and
        its ack: so it needs no room, and a run under way is never held back by new work."""
        return not self.stopping and queue in self.queues

    def run_begun(self, queue: str, delivery: wire.Delivery, begun: Begun) -> None:
        """Run a successor whose delivery record and RUN_BEGIN its predecessor's commit made already
        (`begun`). It runs even if the consumer began to stop meanwhile: its lease is held, and a
        shutdown puts it back on its queue like any running step."""
        self._start(queue, delivery, begun)

    def _dispatch(self, one: Claimed) -> None:
        reason = wire.problem(one.raw, self.process.settings.max_task_bytes)
        if reason is not None:
            self.reject(one, reason)
            return
        delivery = wire.parse(one.raw)
        if (
            delivery.tag != one.tag
        ):  # Lua's JSON read another tag than ours (a duplicate key, NaN...)
            self.reject(
                one,
                f"delivery_tag reads as {one.tag[:40]!r} in Redis and {delivery.tag[:40]!r} here",
            )
            return
        self._start(one.queue, delivery)

    def reject(self, one: Claimed, reason: str) -> None:
        """Move a message that is not a valid toolloop task to the rejected list, with a log line."""
        log.error(
            "step consumer: a message on queue %r is not a task (%s); moved to the list %r.\n"
            "  Only toolloop tasks belong on toolloop queues; inspect it with "
            "`redis-cli LRANGE %s 0 9`.",
            one.queue,
            reason,
            REJECTED,
            REJECTED,
        )
        batch = self.process.batch
        batch.send(
            "LPUSH",
            REJECTED,
            wire.rejected_entry(one.queue, one.raw, reason, self.hostname),
        )
        batch.send("LTRIM", REJECTED, 0, wire.REJECTED_KEEP - 1)
        # the claim recorded it as delivered: forget it, or it comes back
        self.transport.ack(one.tag)

    def _start(
        self, queue: str, delivery: wire.Delivery, begun: Begun | None = None
    ) -> None:
        if queue == names.CONTROL:
            self.control_free -= 1
        else:
            self.free -= 1
        task = asyncio.get_running_loop().create_task(
            self._handle(queue, delivery, begun)
        )
        self.running[delivery.tag] = task
        self.in_flight[delivery.tag] = (queue, delivery, time.time())

    async def _handle(
        self, queue: str, delivery: wire.Delivery, begun: Begun | None = None
    ) -> None:
        events = self.process.events(self.hostname)
        task_id = delivery.task_id
        events.send(
            "task-received",
            {
                "uuid": task_id,
                "name": delivery.name,
                "args": delivery.argsrepr,
                "kwargs": delivery.kwargsrepr,
                "root_id": task_id,
                "parent_id": None,
                "retries": 0,
                "eta": None,
                "expires": None,
            },
        )
        events.send("task-started", {"uuid": task_id, "pid": os.getpid()})
        started = time.monotonic()
        chatty = log.isEnabledFor(logging.INFO)
        if (
            chatty
        ):  # the lines Celery logs for a task, so that one grep finds a step either way
            log.info("Task %s[%s] received", delivery.name, task_id)
        try:
            result = await self._run(delivery, begun)
        except asyncio.CancelledError:  # shutdown: somebody else runs it
            await self._restore(queue, delivery, "the worker is shutting down")
            raise
        except REDIS_LOST as error:  # Redis or the network: run it again
            if isinstance(error, redis_lib.exceptions.OutOfMemoryError):
                log.error("step %s could not run: %s", task_id, OOM_HINT)
                # not at once: Redis refuses it again until freed
                await asyncio.sleep(_OOM_PAUSE_S)
            await self._restore(queue, delivery, f"{type(error).__name__}: {error}")
            events.send("task-rejected", {"uuid": task_id, "requeue": True})
        except Exception as error:  # a bug: acked, as Celery acks a failed task
            log.exception("step %s failed", task_id)
            events.send(
                "task-failed",
                {
                    "uuid": task_id,
                    "exception": repr(error),
                    "traceback": "",
                },
            )
            self._ack(delivery)
        else:
            took = time.monotonic() - started
            failure = getattr(result, "failure", None)
            if (
                failure is not None
            ):  # the step ended its run `failed`: committed, acked, reported failed
                events.send(
                    "task-failed",
                    {
                        "uuid": task_id,
                        "exception": failure_repr(*failure),
                        "traceback": "",
                        "runtime": took,
                    },
                )
                self._ack(delivery)
                return
            events.send(
                "task-succeeded",
                {
                    "uuid": task_id,
                    "result": repr(result),
                    "runtime": took,
                },
            )
            self._ack(delivery)
            if chatty:
                log.info(
                    "Task %s[%s] succeeded in %ss: %r",
                    delivery.name,
                    task_id,
                    round(took, 6),
                    result,
                )
        finally:
            self.running.pop(delivery.tag, None)
            self.in_flight.pop(delivery.tag, None)
            self._freed(queue)

    def _freed(self, queue: str) -> None:
        """A slot is free again; a consumer that waited on the control queue alone (every step slot
        taken) is woken to take steps again at once."""
        if queue == names.CONTROL:
            self.control_free += 1
        else:
            self.free += 1
            if self.control_only:
                self.control_only = False
                self.transport.wake()
        if self.room is not None:
            self.room.set()

    async def _run(self, delivery: wire.Delivery, begun: Begun | None = None) -> Any:
        if delivery.name == names.ADVANCE:
            run_id, n = delivery.args
            step = advance.Task(delivery.task_id, self.hostname)
            return await advance.advance(self.process, str(run_id), int(n), step, begun)

        task = self.process.celery.tasks.get(delivery.name)
        if task is None:
            raise LookupError(
                f"no task named {delivery.name!r} is registered in workers.app"
            )
        return await asyncio.to_thread(task, *delivery.args, **delivery.kwargs)

    def _ack(self, delivery: wire.Delivery) -> None:
        self.transport.ack(delivery.tag)

    async def _restore(self, queue: str, delivery: wire.Delivery, why: str) -> None:
        """Put the message back on its queue now (retried while Redis is away); if that never
        works, it stays in `unacked` and a Celery worker restores it after the visibility timeout."""
        log.warning("step %s goes back on queue %r: %s", delivery.task_id, queue, why)
        for attempt in range(30):
            try:
                await self.transport.restore(queue, delivery)
                return
            except (OSError, redis_lib.RedisError) as error:
                if attempt == 29 or self.stopping:
                    log.warning(
                        "step %s stays in unacked (%s): restored after the visibility timeout",
                        delivery.task_id,
                        error,
                    )
                    return
                await asyncio.sleep(1.0)

    async def _shutdown(self, timeout: float) -> None:
        self.stopping = True
        self.transport.wake()
        if self.room is not None:
            self.room.set()
        running = list(self.running.values())
        if running:
            log.info(
                "step consumer: waiting up to %g s for %d running steps",
                timeout,
                len(running),
            )
            _, pending = await asyncio.wait(running, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
        if self.main is not None:
            await asyncio.wait_for(asyncio.wrap_future(self.main), _BLOCK_S + 5)
