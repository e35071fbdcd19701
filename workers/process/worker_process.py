"""`WorkerProcess`: everything one worker process owns, built once when the process starts.

- Settings, read once (`Settings.from_env()` when none are given).
- One long-lived asyncio loop (uvloop when installed) in a daemon thread (`start_loop`); or, in a
  test, the test's own running loop (`loop=`). The step consumer (workers/worker/consumer.py) runs steps on
  it; with `--step-queues none` each thread of Celery's pool submits its step here (`run`) and
  blocks on the future. Many slow model calls share one loop, one keep-alive HTTP client (`http`)
  and one Redis pipeline per loop turn (`batch`, workers/process/redisio.py).
- Redis: a sync client (`redis`, for threads), the loop's async client behind `batch`, `leases`.
- Celery task events per worker hostname (`events`), the armed cancels (`arm` / `disarm`: a run id
  published on `keys.CANCEL_CHANNEL` aborts that run's live step here), the kept run loops
  (`kept`, TOOLLOOP_KEPT_LOOPS), the model factory (`prompt_gen`, TOOLLOOP_PROMPT_GEN), the toolsets
  (`toolsets`) and the MCP connections they need (`mcp`, workers/process/mcpservers.py), the redelivered
  steps' one turn (`suspects`, workers/process/suspects.py), the metrics (`metrics`, TOOLLOOP_METRICS_PORT),
  the hooks (`hooks`: no-op unless a kill plan installs its own) and the step consumer, when the
  worker runs one (`consumer`).

Nothing of it lives in a module global: the step (`workers.step.advance`), the consumer and the tasks
take the process, which the worker's bootstep attaches to its Celery app (`process_of(app)`).
Tests build one against a private Redis (tests/support/harness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import redis as redis_lib
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from toolloop import redisurl
from toolloop import sentinel as following
from toolloop.abort import AbortController, AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.http import HttpClient, client_from_env
from toolloop.providers import from_env
from toolloop.providers.models_file import catalog_from_env
from workers.config.settings import Settings
from workers.config.toolsets import Registry
from workers.observe.hooks import NO_HOOKS, Hooks
from workers.observe.metrics import Metrics
from workers.observe.queueage import OldestWaiting
from workers.process import deltas
from workers.process.deadlines import StepDeadlines
from workers.process.leases import Leases
from workers.process.live import Begun, KeptLoops
from workers.process.mcpservers import McpServers
from workers.process.redisio import Batch, packed_pool
from workers.process.suspects import Suspects
from workers.protocol import names, wire
from workers.testing.killpoints import KillPlan

log = logging.getLogger("toolloop.workers")

Generate = Callable[[PromptGenRequest, AbortSignal], Awaitable[PromptGenResult]]
_ATTR = names.PROCESS_ATTR
CANCELS_HEARD = 4096
"""How many cancelled runs a process remembers (a run's steps arm within seconds of its cancel)."""


class StepRunner(Protocol):
    """What a step sees of the step consumer that runs it (workers/worker/consumer.py `StepConsumer`)."""

    def hand_off(
        self, queue: str, delivery: wire.Delivery
    ) -> asyncio.Future[Any] | None: ...

    def can_go_on(self, queue: str) -> bool: ...

    def run_begun(self, queue: str, delivery: wire.Delivery, begun: Begun) -> None: ...

    def lend(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    def steps_running(self) -> int: ...


class TaskEvents:
    """Celery task events of worker `hostname`, sent with the process's batch: every event of one
    loop turn goes out in that turn's batch, as few `task.multi` messages (wire.Events)."""

    def __init__(self, events: wire.Events, batch: Batch) -> None:
        self.events = events
        self.batch = batch

    def send(self, type_: str, fields: dict[str, Any]) -> None:
        if self.events.add(type_, fields):
            self.batch.at_flush(self._drain)

    def _drain(self) -> None:
        for channel, payload in self.events.drain():
            self.batch.send("PUBLISH", channel, payload)


class WorkerProcess:
    """The resources of one worker process (see the module docstring)."""

    def __init__(
        self,
        celery: Any,
        settings: Settings | None = None,
        *,
        hooks: Hooks | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        prompt_gen: Any = None,
        http: HttpClient | None = None,
    ) -> None:
        self.celery = celery
        self.settings = settings = settings or Settings.from_env()
        if hooks is None:
            hooks = (
                KillPlan(settings.kill_plan, settings.redis_url)
                if settings.kill_plan
                else NO_HOOKS
            )
        self.hooks = hooks
        self.watcher = redisurl.watcher(settings.redis_url)
        """For a Sentinel URL: the `+switch-master` listener every client of the process follows."""
        self.redis = redisurl.sync_client(
            settings.redis_url, decode_responses=True, watcher=self.watcher
        )
        self.toolsets = Registry(settings.toolsets, settings.toolsets_file)
        self.mcp = McpServers()
        """The MCP servers' connections (stdio children, HTTP sessions) on the process loop."""
        self.kept = KeptLoops(settings.kept_loops)
        self.deadlines = StepDeadlines(settings.step_timeout)
        self.metrics: Metrics | None = None
        self.consumer: StepRunner | None = None
        self.loop = loop
        self.batch = Batch(
            self.async_client(), wait=(settings.commit_wait, settings.commit_wait_ms)
        )
        self.flow_watcher = (
            redisurl.watcher(settings.flow_redis_url)
            if settings.flow_redis_url
            else None
        )
        self.flow_batch = (
            Batch(self.async_client(settings.flow_redis_url, self.flow_watcher))
            if settings.flow_redis_url
            else self.batch
        )
        """Where accounts and rate limits are booked (workers/flow/limiter.py): TOOLLOOP_FLOW_REDIS_URL's
        own batch, shared by every shard that names it, else the journal's."""
        self.leases = Leases(self.batch, settings.lease_ms)
        self.suspects = Suspects()
        self.db = int(self.redis.connection_pool.connection_kwargs.get("db", 0))
        self._events: dict[str, TaskEvents] = {}
        self._armed: dict[str, AbortController] = {}
        self._interrupts: OrderedDict[str, int] = OrderedDict()
        """Runs whose interrupt this process heard, with the segment it stops (newest last)."""
        self._cancels: OrderedDict[str, None] = OrderedDict()
        """Runs whose cancel this process heard, newest last (at most CANCELS_HEARD): a step of one
        is aborted when it arms, though the state it read at its begin had no cancel yet."""
        self._prompt_gen = prompt_gen
        self._lock = threading.Lock()
        self._threads = _tool_threads()
        """The loop's default executor once `start_loop` made the loop (`shed_tool_threads`)."""
        self.catalog = catalog_from_env()
        """The model catalogue in force (TOOLLOOP_MODELS over the built-in rows), read once: a bad
        operator file stops the worker at start (ModelsFileError), not a run at its first step."""
        self.http = http or client_from_env()
        """The process's HTTP client for model calls: keep-alive connections on the process loop
        (`KeepAliveClient`, on httptools), handed to the providers of the default model factory."""
        self._owners = wire.Ids()
        self.open_buckets: dict[str, float] = {}
        """Rate-limit buckets (workers/flow/limiter.py) whose provider named no limit and none is configured
        -> until when (monotonic) this process books nothing there."""

    def new_owner(self) -> str:
        """A lease owner no other step of any process has (`wire.Ids`: no `os.urandom` per step)."""
        return self._owners.new()

    # -- the loop -----------------------------------------------------------------------------------

    def start_loop(self) -> asyncio.AbstractEventLoop:
        """Start the process's loop in a daemon thread (once); it is `loop` from then on."""
        with self._lock:
            if self.loop is None:
                self.loop = loop = new_loop()
                loop.set_default_executor(self._threads)
                threading.Thread(
                    target=loop.run_forever, name="toolloop-asyncio", daemon=True
                ).start()
            return self.loop

    def shed_tool_threads(self) -> None:
        """From any thread, once the worker is idle (workers/worker/trim.py): the loop's sync-tool threads
        end (a fresh pool starts new ones on demand), so that a burst's threads, up to 64, do not
        keep their stacks resident while nothing runs. Work already handed to the old pool runs."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._renew_tool_threads, loop)

    def _renew_tool_threads(self, loop: asyncio.AbstractEventLoop) -> None:
        old, self._threads = self._threads, _tool_threads()
        loop.set_default_executor(self._threads)
        old.shutdown(wait=False)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the process loop from another thread (a Celery pool thread) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.start_loop()).result()

    def async_client(
        self, url: str | None = None, watcher: following.SwitchWatcher | None = None
    ) -> aredis.Redis:
        """An asyncio Redis client for the process loop (on REDIS_URL unless `url`). A cut connection is
        retried within ~2 s in all (redis-py's default backoff waits up to 1, 2 and 4 s), well inside a
        step's lease: a step stuck in its client's backoff would let its lease lapse under it while it
        still runs."""
        retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=6)
        client = redisurl.async_client(
            url or self.settings.redis_url,
            watcher=watcher if url else self.watcher,
            decode_responses=True,
            retry=retry,
            retry_on_error=[redis_lib.ConnectionError, redis_lib.TimeoutError],
            encoding_errors="replace",  # a message that is not UTF-8 is rejected, not a decode error
        )
        packed_pool(client.connection_pool)
        return client

    def events(self, hostname: str) -> TaskEvents:
        """Celery task events sent as worker `hostname` (the clock is numbered per process; call it
        on the process loop)."""
        found = self._events.get(hostname)
        if found is None:
            found = self._events.setdefault(
                hostname, TaskEvents(wire.Events(hostname, self.db), self.batch)
            )
        return found

    # -- the model --------------------------------------------------------------------------------

    @property
    def prompt_gen(self) -> Any:
        """This process's PromptGen (or plain generate), made once: TOOLLOOP_PROMPT_GEN's factory,
        else `toolloop.providers.from_env()` on the process's HTTP client (`http`)."""
        with self._lock:
            if self._prompt_gen is None:
                if self.settings.prompt_gen:
                    module, _, name = self.settings.prompt_gen.partition(":")
                    self._prompt_gen = getattr(importlib.import_module(module), name)()
                else:
                    self._prompt_gen = from_env(
                        http_client=self.http, catalog=self.catalog
                    )
            return self._prompt_gen

    def generate_for(
        self, provider: str | None, fallback: list[str], *, stream: bool = False
    ) -> Generate:
        """The model of a run: `prompt_gen` for `provider`, with the run's fallback providers.
        `stream`: the call passes on the `on_delta` of workers/process/deltas.py's ON_DELTA
        (RunSpec.stream)."""
        prompt_gen = self.prompt_gen
        if stream:
            return deltas.streamed_from(prompt_gen, provider, fallback)
        if not hasattr(
            prompt_gen, "generate"
        ):  # a plain generate(request, signal[, on_delta])
            return deltas.without_deltas(prompt_gen)
        prompt_gen = deltas.with_fallback(prompt_gen, provider, fallback)

        async def generate(
            request: PromptGenRequest, signal: AbortSignal
        ) -> PromptGenResult:
            result: PromptGenResult = await prompt_gen.generate(
                request, signal=signal, provider=provider
            )
            return result

        return generate

    # -- cancellation -----------------------------------------------------------------------------

    def arm(self, run_id: str, controller: AbortController) -> None:
        """Route cancels of `run_id` to `controller` while its live step runs in this process. A cancel
        heard before (published after the step read the run's state, delivered before this) aborts it
        now: a cancel wins wherever it lands (tests/unit/test_races.py)."""
        with self._lock:
            self._armed[run_id] = controller
            heard = run_id in self._cancels
        if heard:
            controller.abort("cancel")

    def disarm(self, run_id: str, controller: AbortController) -> None:
        with self._lock:
            if self._armed.get(run_id) is controller:
                del self._armed[run_id]

    def interrupt_heard(self, run_id: str, segment: int, state: dict[str, str]) -> bool:
        """Whether segment `segment` of the run was interrupted: its state says so (read when the step
        began), or this process heard it since (workers/client/talk.py)."""
        if state.get("interrupt") == str(segment):
            return True
        with self._lock:
            return self._interrupts.get(run_id) == segment

    def interrupted(self, message: str) -> None:
        """An interrupt ("<run id>|<segment>") was published: abort that run's live step here with the
        reason "interrupt" (it stops as a cancel would, and the run ends `interrupted`), and note it
        for a step of that segment that arms later. A kept loop stays: its next step stops there."""
        run_id, _, segment = message.rpartition("|")
        if not segment.isdigit():
            return
        with self._lock:
            controller = self._armed.get(run_id)
            self._interrupts[run_id] = int(segment)
            self._interrupts.move_to_end(run_id)
            while len(self._interrupts) > CANCELS_HEARD:
                self._interrupts.popitem(last=False)
        if controller is not None:
            controller.abort("interrupt")

    def cancelled(self, run_id: str) -> None:
        """A cancel of `run_id` was published: abort its live step here (or the next one it arms), and
        drop its kept loop. (A run's cancel flag is never cleared, so a cancel heard stays true.)"""
        with self._lock:
            controller = self._armed.get(run_id)
            self._cancels[run_id] = None
            self._cancels.move_to_end(run_id)
            while len(self._cancels) > CANCELS_HEARD:
                self._cancels.popitem(last=False)
        if controller is not None:
            controller.abort("cancel")
        if self.loop is not None and run_id in self.kept:
            self.loop.call_soon_threadsafe(self.kept.release, run_id)

    # -- metrics ----------------------------------------------------------------------------------

    def start_metrics(self, port: int, host: str = "127.0.0.1") -> Metrics:
        """Count this process's metrics and serve them on `host`:`port` (once; TOOLLOOP_METRICS_HOST)."""
        with self._lock:
            if self.metrics is None:
                self.metrics = Metrics(
                    self.queue_depths, self.steps_in_flight, OldestWaiting(self.redis)
                )
                self.metrics.serve(port, host)
            return self.metrics

    def steps_in_flight(self) -> int:
        """Steps the process's step consumer runs now (0 without one)."""
        consumer = self.consumer
        return 0 if consumer is None else consumer.steps_running()

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting on each step queue, every priority list summed (one pipeline)."""
        pipe = self.redis.pipeline(transaction=False)
        list_keys = wire.queue_keys(list(names.STEP_QUEUES))
        for key in list_keys:
            pipe.llen(key)
        depths = dict.fromkeys(names.STEP_QUEUES, 0)
        for key, length in zip(list_keys, pipe.execute(), strict=True):
            depths[names.queue_of(key)] += int(length)
        return depths

    # -- the end ----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop what runs on the loop (lease renewals, kept loops) and close the Redis clients (tests;
        a worker's process ends with its process)."""
        self.kept.clear()
        await self.mcp.aclose()
        task = self.leases.task
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self.batch.client.aclose()
        if self.flow_batch is not self.batch:
            await self.flow_batch.client.aclose()
        if self.flow_watcher is not None:
            self.flow_watcher.close()
        self.redis.close()
        if self.watcher is not None:
            self.watcher.close()


def _tool_threads() -> ThreadPoolExecutor:
    """Where sync tools run (workers.config.toolsets.for_worker): room for many at once."""
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="toolloop-tool")


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (about half the loop's CPU per step at hundreds in flight; see
    docs/operations.md), else the standard loop; TOOLLOOP_LOOP=asyncio forces the standard one."""
    if os.environ.get("TOOLLOOP_LOOP", "").strip() != "asyncio":
        try:
            import uvloop  # optional at run time: the standard loop where it is missing
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def attach(celery: Any, process: WorkerProcess) -> None:
    """Make `process` the one of `celery`'s worker (its tasks and remote-control commands find it)."""
    setattr(celery, _ATTR, process)


def process_of(celery: Any) -> WorkerProcess:
    """The worker process attached to `celery` (by the worker's bootstep, workers/worker/bootsteps.py)."""
    found = getattr(celery, _ATTR, None)
    if not isinstance(found, WorkerProcess):
        raise RuntimeError(
            "This Celery app has no toolloop worker process: toolloop's tasks run in a worker.\n"
            "  Start one with `celery -A workers.app worker` (or `toolloop worker`)."
        )
    return found


def attached(celery: Any) -> WorkerProcess | None:
    """`process_of(celery)`, or None when no worker process is attached (a client, Flower)."""
    found = getattr(celery, _ATTR, None)
    return found if isinstance(found, WorkerProcess) else None
