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
costs its own work plus its share of one Redis pipeline per loop turn (workers/redisio.py).

Poison messages: no message content stops the consumer. A message that is not a valid toolloop
task (not JSON, a body that is not base64 or not JSON, missing or mistyped headers or arguments, an
unknown task, a delivery tag that is not a string, larger than TOOLLOOP_MAX_TASK_BYTES) is moved to
the rejected list `toolloop:rejected` (keys.REJECTED: one JSON entry per message, newest first, with
the reason and the raw message) with an error log line, and the steps claimed beside it run.

What does not change: the steps are Celery task messages on the same queues (workers/wire.py), so a
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
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import click
import redis as redis_lib
import redis.asyncio as aredis
from celery import bootsteps
from celery.worker.control import Panel, control_command, inspect_command
from kombu import Queue  # type: ignore[attr-defined]

from toolloop.journal import keys as tl_keys
from workers import runtime, wire
from workers.errors import OOM_HINT, REDIS_LOST, failure_repr
from workers.live import Begun

log = logging.getLogger("toolloop.workers")

STEP_QUEUES = ("llm", "tools", "control")
"""The queues a worker gives its step consumer unless told otherwise (--step-queues)."""
_CLAIM_MAX = 256
_BLOCK_S = 1.0
_OOM_PAUSE_S = 1.0
"""How long a step Redis refused for OOM waits before it goes back on its queue."""
REJECTED = tl_keys.REJECTED
"""The rejected list (see the module docstring and docs/workers.md, "The rejected list")."""


class StepConsumer:
    """Runs the tasks of `queues` on the process loop, at most `capacity` at once."""

    def __init__(self, queues: list[str], capacity: int, hostname: str) -> None:
        self.queues = list(dict.fromkeys(queues))
        self.capacity = capacity
        self.hostname = hostname
        self.free = capacity
        self.stopping = False
        self.running: dict[str, asyncio.Task[None]] = {}
        self.in_flight: dict[str, tuple[str, wire.Delivery, float]] = {}
        """tag -> (queue, delivery, start time) of each running step, for `celery inspect active`
        (read from Celery's consumer thread: it copies the dict, never iterates it live)."""
        self.room: asyncio.Event | None = None
        self.main: asyncio.Future[None] | None = None
        self.wake_key = f"toolloop:wake:{hostname}"
        """A list only this consumer waits on, beside its queues: a push ends its BRPOP at once."""

    @contextlib.asynccontextmanager
    async def lend(self) -> AsyncIterator[None]:
        """While a running step only waits (for room under a rate limit: workers/flow.py), its slot
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
        self.main = asyncio.run_coroutine_threadsafe(self._consume(), runtime.loop())  # type: ignore[assignment]
        log.info("step consumer: queues %s, up to %d steps at once", ",".join(self.queues), self.capacity)

    def stop(self, timeout: float) -> None:
        """Stop taking steps; wait up to `timeout` s for running ones, then put the rest back."""
        future = asyncio.run_coroutine_threadsafe(self._shutdown(timeout), runtime.loop())
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
        """End a BRPOP that waits on the old queue list (thread-safe)."""
        runtime.loop().call_soon_threadsafe(lambda: runtime.batch().send("LPUSH", self.wake_key, "1"))

    # -- on the loop ------------------------------------------------------------------------------

    async def _restore_visible(self) -> None:
        """Every TOOLLOOP_RESTORE_INTERVAL s, put back on their queues the messages delivered longer
        than TOOLLOOP_VISIBILITY_TIMEOUT ago and never acked (a dead consumer's), as kombu does in a
        Celery consumer: a worker whose every queue is a step queue has no Celery consumer doing it."""
        settings = runtime.settings
        while not self.stopping:
            await asyncio.sleep(settings.restore_interval)
            try:
                ceiling = time.time() - settings.visibility_timeout
                restored = await runtime.batch().script(
                    wire.RESTORE_VISIBLE, [wire.UNACKED, wire.UNACKED_INDEX], [ceiling, 100]
                )
                if restored:
                    log.warning(
                        "step consumer: %d unacked steps were older than the visibility timeout (%g s) "
                        "and went back on their queues", restored, settings.visibility_timeout,
                    )  # fmt: skip
            except (OSError, redis_lib.RedisError) as error:
                log.warning("step consumer: restoring unacked steps failed (%s)", error)

    async def _consume(self) -> None:
        asyncio.get_running_loop().create_task(self._restore_visible())
        self.room = asyncio.Event()
        blocking = runtime.async_client()
        batch = runtime.batch()
        while not self.stopping:
            if self.free <= 0:
                self.room.clear()
                await self.room.wait()
                continue
            keys = wire.queue_keys(self.queues)
            if not keys:
                await asyncio.sleep(0.5)
                continue
            try:
                got = wire.claimed(await batch.script(
                    wire.CLAIM,
                    [wire.UNACKED, wire.UNACKED_INDEX, *keys],
                    [min(self.free, _CLAIM_MAX), time.time(), runtime.settings.max_task_bytes],
                ))  # fmt: skip
                if not got:
                    got = await self._wait_for_one(blocking, keys)
            except (OSError, redis_lib.RedisError) as error:
                log.warning("step consumer: Redis unreachable (%s); retrying in 1 s", error)
                await asyncio.sleep(1.0)
                continue
            except Exception:  # never ends the consumer: log and go on
                log.exception("step consumer: taking messages failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                continue
            for one in got:
                try:
                    self._dispatch(one)
                except Exception as error:  # a bug in dispatch must not strand the rest of the batch
                    log.exception("step consumer: a message on %r could not be dispatched", one.queue)
                    self.reject(one, f"dispatch failed: {type(error).__name__}")
        await blocking.aclose()
        await runtime.batch().call("DEL", self.wake_key)

    async def _wait_for_one(self, blocking: aredis.Redis, keys: list[str]) -> list[wire.Claimed]:
        """BRPOP one message when the queues are empty, and record it as delivered (as kombu does
        after its BRPOP: a crash between the two leaves it to the run's outbox and the sweeper)."""
        item = await blocking.brpop([*keys, self.wake_key], timeout=_BLOCK_S)
        if not item or item[0] == self.wake_key:
            return []
        queue, raw = str(item[0]).split("\x06\x16")[0], str(item[1])  # the client decodes: both str
        if len(raw) > runtime.settings.max_task_bytes:
            return [wire.Claimed(queue, raw, "")]
        try:
            tag = wire.parse(raw).tag
        except wire.BadMessage:
            return [wire.Claimed(queue, raw, "")]
        await _record_delivered(tag, raw, queue)
        return [wire.Claimed(queue, raw, tag)]

    def hand_off(self, queue: str, delivery: wire.Delivery) -> asyncio.Future[Any] | None:
        """Run a successor this process just produced here, without the round trip through its
        queue: it is recorded as delivered to this consumer (kombu's `unacked`, as CLAIM does) and
        started at once. Only for a queue this consumer takes, while it has room and is not
        stopping; None otherwise (the caller pushes it on its queue). A crash before the record
        lands leaves the successor in the run's outbox, which the sweeper sends again. The future
        is the record's write (the kill-point suite waits for it)."""
        if self.stopping or self.free <= 1 or queue not in self.queues:
            return None
        recorded = _record_delivered(delivery.tag, delivery.raw, queue)
        self._start(queue, delivery)
        return recorded

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

    def _dispatch(self, one: wire.Claimed) -> None:
        reason = wire.problem(one.raw, runtime.settings.max_task_bytes)
        if reason is not None:
            self.reject(one, reason)
            return
        delivery = wire.parse(one.raw)
        if delivery.tag != one.tag:  # Lua's JSON read another tag than ours (a duplicate key, NaN...)
            self.reject(
                one, f"delivery_tag reads as {one.tag[:40]!r} in Redis and {delivery.tag[:40]!r} here"
            )
            return
        self._start(one.queue, delivery)

    def reject(self, one: wire.Claimed, reason: str) -> None:
        """Move a message that is not a valid toolloop task to the rejected list, with a log line."""
        log.error(
            "step consumer: a message on queue %r is not a task (%s); moved to the list %r.\n"
            "  Only toolloop tasks belong on toolloop queues; inspect it with "
            "`redis-cli LRANGE %s 0 9`.", one.queue, reason, REJECTED, REJECTED,
        )  # fmt: skip
        batch = runtime.batch()
        batch.send("LPUSH", REJECTED, wire.rejected_entry(one.queue, one.raw, reason, self.hostname))
        batch.send("LTRIM", REJECTED, 0, wire.REJECTED_KEEP - 1)
        self._forget(one.tag)  # CLAIM recorded it as delivered: forget it, or it would come back

    def _forget(self, tag: str) -> None:
        if tag:
            batch = runtime.batch()
            batch.send("ZREM", wire.UNACKED_INDEX, tag)
            batch.send("HDEL", wire.UNACKED, tag)

    def _start(self, queue: str, delivery: wire.Delivery, begun: Begun | None = None) -> None:
        self.free -= 1
        task = asyncio.get_running_loop().create_task(self._handle(queue, delivery, begun))
        self.running[delivery.tag] = task
        self.in_flight[delivery.tag] = (queue, delivery, time.time())

    async def _handle(self, queue: str, delivery: wire.Delivery, begun: Begun | None = None) -> None:
        events = runtime.events(self.hostname)
        task_id = delivery.task_id
        events.send("task-received", {
            "uuid": task_id, "name": delivery.name, "args": delivery.argsrepr, "kwargs": delivery.kwargsrepr,
            "root_id": task_id, "parent_id": None, "retries": 0, "eta": None, "expires": None,
        })  # fmt: skip
        events.send("task-started", {"uuid": task_id, "pid": os.getpid()})
        started = time.monotonic()
        chatty = log.isEnabledFor(logging.INFO)
        if chatty:  # the lines Celery logs for a task, so that one grep finds a step either way
            log.info("Task %s[%s] received", delivery.name, task_id)
        try:
            result = await self._run(delivery, begun)
        except asyncio.CancelledError:  # shutdown: somebody else runs it
            await self._restore(queue, delivery, "the worker is shutting down")
            raise
        except REDIS_LOST as error:  # Redis or the network: run it again
            if isinstance(error, redis_lib.exceptions.OutOfMemoryError):
                log.error("step %s could not run: %s", task_id, OOM_HINT)
                await asyncio.sleep(_OOM_PAUSE_S)  # not at once: Redis refuses it again until freed
            await self._restore(queue, delivery, f"{type(error).__name__}: {error}")
            events.send("task-rejected", {"uuid": task_id, "requeue": True})
        except Exception as error:  # a bug: acked, as Celery acks a failed task
            log.exception("step %s failed", task_id)
            events.send("task-failed", {
                "uuid": task_id, "exception": repr(error), "traceback": "",
            })  # fmt: skip
            self._ack(delivery)
        else:
            took = time.monotonic() - started
            failure = getattr(result, "failure", None)
            if failure is not None:  # the step ended its run `failed`: committed, acked, reported failed
                events.send("task-failed", {
                    "uuid": task_id, "exception": failure_repr(*failure), "traceback": "", "runtime": took,
                })  # fmt: skip
                self._ack(delivery)
                return
            events.send("task-succeeded", {
                "uuid": task_id, "result": repr(result), "runtime": took,
            })  # fmt: skip
            self._ack(delivery)
            if chatty:
                log.info("Task %s[%s] succeeded in %ss: %r", delivery.name, task_id, round(took, 6), result)
        finally:
            self.running.pop(delivery.tag, None)
            self.in_flight.pop(delivery.tag, None)
            self.free += 1
            if self.room is not None:
                self.room.set()

    async def _run(self, delivery: wire.Delivery, begun: Begun | None = None) -> Any:
        from workers import advance  # not at import: workers.app installs this module
        from workers.app import ADVANCE, app

        if delivery.name == ADVANCE:
            run_id, n = delivery.args
            step = advance.Task(delivery.task_id, self.hostname)
            return await advance.advance(str(run_id), int(n), step, begun)

        task = app.tasks.get(delivery.name)
        if task is None:
            raise LookupError(f"no task named {delivery.name!r} is registered in workers.app")
        return await asyncio.to_thread(task, *delivery.args, **delivery.kwargs)

    def _ack(self, delivery: wire.Delivery) -> None:
        batch = runtime.batch()
        batch.send("ZREM", wire.UNACKED_INDEX, delivery.tag)
        batch.send("HDEL", wire.UNACKED, delivery.tag)

    async def _restore(self, queue: str, delivery: wire.Delivery, why: str) -> None:
        """Put the message back on its queue now (retried while Redis is away); if that never
        works, it stays in `unacked` and a Celery worker restores it after the visibility timeout."""
        log.warning("step %s goes back on queue %r: %s", delivery.task_id, queue, why)
        for attempt in range(30):
            try:
                await runtime.batch().script(
                    wire.RESTORE, [wire.UNACKED, wire.UNACKED_INDEX, queue], [delivery.tag, delivery.raw]
                )
                return
            except (OSError, redis_lib.RedisError) as error:
                if attempt == 29 or self.stopping:
                    log.warning("step %s stays in unacked (%s): restored after the visibility timeout",
                                delivery.task_id, error)  # fmt: skip
                    return
                await asyncio.sleep(1.0)

    async def _shutdown(self, timeout: float) -> None:
        self.stopping = True
        runtime.batch().send("LPUSH", self.wake_key, "1")
        if self.room is not None:
            self.room.set()
        running = list(self.running.values())
        if running:
            log.info("step consumer: waiting up to %g s for %d running steps", timeout, len(running))
            _, pending = await asyncio.wait(running, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
        if self.main is not None:
            await asyncio.wait_for(asyncio.wrap_future(self.main), _BLOCK_S + 5)


# -- in the Celery worker -------------------------------------------------------------------------

_current: StepConsumer | None = None


def hand_off(queue: str, delivery: wire.Delivery) -> asyncio.Future[Any] | None:
    """`StepConsumer.hand_off` of this process's step consumer (None when it has none)."""
    return None if _current is None else _current.hand_off(queue, delivery)


def current() -> StepConsumer | None:
    """This process's step consumer, when it runs one."""
    return _current


def _record_delivered(tag: str, raw: str, queue: str) -> asyncio.Future[Any]:
    """Record a message taken off its queue as delivered (kombu's `unacked` and its index), in the
    process's next batch; the future resolves once both writes landed."""
    batch = runtime.batch()
    index = batch.call("ZADD", wire.UNACKED_INDEX, time.time(), tag)
    value = batch.call("HSET", wire.UNACKED, tag, wire.unacked_value(raw, queue))
    return asyncio.gather(index, value)


class StepConsumerStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """The worker bootstep that runs a `StepConsumer` when the worker has step queues."""

    label = "toolloop step consumer"

    def __init__(
        self, worker: Any, step_queues: str | None = None, steps_in_flight: int | None = None, **kw: Any
    ) -> None:
        super().__init__(worker, **kw)
        from workers.settings import Settings, no_redis_message

        if not Settings.from_env().redis_source:  # the rule of every entry point (find_redis_url)
            raise RuntimeError(no_redis_message())
        # Toolsets import from the worker's working directory, as the `toolloop` commands do, so
        # `celery -A workers.app worker` run in a checkout serves examples.storyboard.tools as is.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        named = step_queues if step_queues is not None else os.environ.get("TOOLLOOP_STEP_QUEUES")
        selected = worker.app.amqp.queues
        consumed = list(selected.consume_from or selected)
        if named is None:  # the default: toolloop's step queues among those the worker consumes
            self.queues = [name for name in STEP_QUEUES if name in consumed]
        else:
            self.queues = [q.strip() for q in named.split(",") if q.strip() and q.strip().lower() != "none"]
        self.capacity = steps_in_flight or int(os.environ.get("TOOLLOOP_STEPS_IN_FLIGHT", "") or 500)
        if self.capacity < 1:
            raise ValueError(f"--steps-in-flight must be at least 1, not {self.capacity}.")
        for name in self.queues:  # Celery's own consumer keeps the rest (the control queue), if any
            if name in consumed:
                selected.deselect(name)

    def include_if(self, worker: Any) -> bool:
        return bool(self.queues)

    def create(self, worker: Any) -> StepConsumer:
        global _current
        timeout = float(worker.app.conf.worker_soft_shutdown_timeout or 30)
        _current = _Service(self.queues, self.capacity, worker.hostname, timeout)
        return _current


class _Service(StepConsumer):
    """A `StepConsumer` with the start/stop/terminate of a bootstep's object."""

    def __init__(self, queues: list[str], capacity: int, hostname: str, timeout: float) -> None:
        super().__init__(queues, capacity, hostname)
        self.timeout = timeout

    def stop(self, timeout: float | None = None) -> None:
        super().stop(self.timeout if timeout is None else timeout)

    def terminate(self) -> None:
        super().stop(0.0)


@control_command(args=[("queue", str)], signature="<queue>")  # type: ignore[untyped-decorator]
def add_step_queue(state: Any, queue: str) -> dict[str, str]:
    """Remote control: the step consumer takes tasks from `queue` too (`celery control add_step_queue`)."""
    return _change_queue(queue, "added")


@control_command(args=[("queue", str)], signature="<queue>")  # type: ignore[untyped-decorator]
def cancel_step_queue(state: Any, queue: str) -> dict[str, str]:
    """Remote control: the step consumer stops taking tasks from `queue`."""
    return _change_queue(queue, "cancelled")


# Celery's own `active`, `active_queues` and `revoke` know only Celery's consumer and pool: these
# replace them (same names, same replies) and add what the step consumer holds.
_celery_active = Panel.data["active"]
_celery_active_queues = Panel.data["active_queues"]
_celery_revoke = Panel.data["revoke"]


@inspect_command(alias="dump_active")  # type: ignore[untyped-decorator]
def active(state: Any, safe: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """List of tasks currently being executed: Celery's pool's and the step consumer's steps."""
    found: list[dict[str, Any]] = list(_celery_active(state, safe=safe, **kwargs))
    if _current is None:
        return found
    for queue, delivery, started in dict(_current.in_flight).values():
        found.append({
            "id": delivery.task_id, "name": delivery.name,
            "args": delivery.argsrepr if safe else delivery.args,
            "kwargs": delivery.kwargsrepr if safe else _literal(delivery.kwargsrepr),
            "type": delivery.name, "hostname": _current.hostname, "time_start": started,
            "acknowledged": False, "delivery_info": {"exchange": "", "routing_key": queue,
                                                     "priority": 0, "redelivered": None},
            "worker_pid": os.getpid(),
        })  # fmt: skip
    return found


@inspect_command()  # type: ignore[untyped-decorator]
def active_queues(state: Any) -> list[dict[str, Any]]:
    """List the task queues a worker is currently consuming from: Celery's consumer's and the step
    consumer's (`llm`, `tools`, `control` by default), so Flower's broker page lists their lengths."""
    found: list[dict[str, Any]] = list(_celery_active_queues(state))
    if _current is None:
        return found
    known = {q.get("name") for q in found}
    declared = state.app.amqp.queues
    for name in list(_current.queues):
        if name not in known:
            queue = declared[name] if name in declared else Queue(name)  # type: ignore[no-untyped-call]
            found.append(dict(queue.as_dict(recurse=True)))
    return found


@control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")  # type: ignore[untyped-decorator]
def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any) -> Any:
    """Revoke task by task id (or list of ids). A toolloop step's id (`<run_id>:<n>`) cancels its run
    (as `toolloop cancel`: the step consumer never consults Celery's revoked set, so that is what a
    revoke of a step can honour); any other id goes to Celery's own revoke."""
    ids = [task_id] if isinstance(task_id, str) else list(task_id or [])
    others = [one for one in ids if not _step_run(one)]
    cancelled = [run for one in ids if (run := _step_run(one)) and _cancel_run(run)]
    reply: Any = {"ok": f"cancelled runs {', '.join(cancelled) or 'none'} (a revoked step cancels its run)"}
    if others:
        reply = _celery_revoke(state, others, terminate=terminate, signal=signal, **kwargs)
    return reply


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _step_run(task_id: str) -> str | None:
    """The run id of a `toolloop.advance` task id (`<32 hex>:<n>`), else None."""
    run, _, n = task_id.partition(":")
    return run if n.isdigit() and len(run) == 32 and all(c in "0123456789abcdef" for c in run) else None


def _cancel_run(run_id: str) -> bool:
    """Cancel a run as `Client.cancel` does (idempotent: every worker gets a broadcast revoke)."""
    from workers import runs
    from workers.app import CANCEL, app, send
    from workers.records import FINAL
    from workers.scripts.control import RUN_CANCEL, parse_cancel

    client = runtime.redis()
    status = parse_cancel(
        runs.script(client, RUN_CANCEL)(keys=[tl_keys.state(run_id)], args=[tl_keys.CANCEL_CHANNEL, run_id])
    )
    if status is None or status in FINAL:
        return False
    send(app, CANCEL, [run_id], queue="control", task_id=f"{run_id}:cancel")
    log.warning("run %s cancelled: a step of it was revoked (celery control revoke)", run_id)
    return True


def _change_queue(queue: str, change: str) -> dict[str, str]:
    if _current is None:
        return {"error": "this worker has no step consumer (start it with --step-queues)"}
    (_current.add_queue if change == "added" else _current.cancel_queue)(queue)
    return {"ok": f"step queue {queue!r} {change}"}


def install(app: Any) -> None:
    """Give `app`'s worker the --step-queues and --steps-in-flight options and the bootstep."""
    app.user_options["worker"].add(click.Option(
        ["--step-queues"], default=None,
        help="Queues whose toolloop steps this worker runs as coroutines on its asyncio loop (env "
             "TOOLLOOP_STEP_QUEUES; default: llm,tools,control when -Q has them; none: every queue through "
             "Celery's pool).",
    ))  # fmt: skip
    app.user_options["worker"].add(click.Option(
        ["--steps-in-flight"], type=int, default=None,
        help="Most steps the step consumer runs at once (env TOOLLOOP_STEPS_IN_FLIGHT, default 500).",
    ))  # fmt: skip
    app.steps["worker"].add(StepConsumerStep)
