"""Per-process resources of a worker: one asyncio loop, its Redis batch and leases, the model,
cancellation.

- One long-lived asyncio loop per process (uvloop when installed), in a daemon thread. The step
  consumer (workers/consumer.py) runs steps on it directly; with `--step-queues none` each thread of
  the threads pool submits its step's coroutine here (`run`) and blocks on the future. Either way
  many slow model calls share one loop, one keep-alive HTTP client (`KeepAliveClient`) and one
  Redis pipeline per loop turn (`batch`, workers/redisio.py).
- Cancellation: a listener thread subscribes to `keys.CANCEL_CHANNEL`; a run id published there
  aborts the controller of that run's live step if this process runs it (`arm` / `disarm`).
- A sweeper thread runs `runs.sweep` every TOOLLOOP_SWEEP_INTERVAL s, one worker at a time (a
  Redis lock), so recorded successors are re-sent and stalled runs re-driven without a beat process;
  once a second it also settles the parked runs whose deadline is due (workers/approvals.py).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis as redis_lib
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from toolloop.abort import AbortController, AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.journal import keys
from toolloop.providers.client import client_from_env
from workers import deltas, tracing, wire
from workers.metrics import STEP_QUEUES, Metrics
from workers.redisio import Batch, Leases, packed_pool
from workers.settings import Settings
from workers.toolsets import Registry

log = logging.getLogger("toolloop.workers")

Generate = Callable[[PromptGenRequest, AbortSignal], Awaitable[PromptGenResult]]

settings = Settings.from_env()
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_redis: redis_lib.Redis | None = None
_prompt_gen: Any = None
_armed: dict[str, AbortController] = {}
_batch: Batch | None = None
_leases: Leases | None = None
_events: dict[str, TaskEvents] = {}
_toolsets: Registry | None = None
_metrics: Metrics | None = None


def metrics() -> Metrics | None:
    """This process's metrics (workers/metrics.py); None unless TOOLLOOP_METRICS_PORT serves them."""
    return _metrics


def start_metrics(port: int) -> Metrics:
    """Count this process's metrics and serve them on `port` (once per process)."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = Metrics(_queue_depths)
            _metrics.serve(port)
        return _metrics


def _queue_depths() -> dict[str, int]:
    """Messages waiting on each step queue, every priority list summed (one pipeline)."""
    pipe = redis().pipeline(transaction=False)
    for key in wire.queue_keys(list(STEP_QUEUES)):
        pipe.llen(key)
    lengths = pipe.execute()
    depths = dict.fromkeys(STEP_QUEUES, 0)
    for key, length in zip(wire.queue_keys(list(STEP_QUEUES)), lengths, strict=True):
        depths[key.split("\x06\x16")[0]] += int(length)
    return depths


def toolsets() -> Registry:
    """The toolsets this worker serves (TOOLLOOP_TOOLSETS), each imported when a run first names it."""
    global _toolsets
    with _lock:
        if _toolsets is None:
            _toolsets = Registry(settings.toolsets)
        return _toolsets


def redis() -> redis_lib.Redis:
    global _redis
    with _lock:
        if _redis is None:
            _redis = redis_lib.Redis.from_url(settings.redis_url, decode_responses=True)
        return _redis


def loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = _new_loop()
            # sync tools run in threads (workers.toolsets.for_worker): room for many at once
            _loop.set_default_executor(ThreadPoolExecutor(max_workers=64, thread_name_prefix="toolloop-tool"))
            threading.Thread(target=_loop.run_forever, name="toolloop-asyncio", daemon=True).start()
        return _loop


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (about half the loop's CPU per step at hundreds in flight; see
    docs/operations.md), else the standard loop; TOOLLOOP_LOOP=asyncio forces the standard one."""
    if os.environ.get("TOOLLOOP_LOOP", "").strip() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on the process loop from another thread (a Celery pool thread) and wait for it."""
    return asyncio.run_coroutine_threadsafe(coro, loop()).result()


def batch() -> Batch:
    """The process's Redis batch for steps (call it on the process loop)."""
    global _batch
    if _batch is None:
        _batch = Batch(async_client())
    return _batch


def async_client() -> aredis.Redis:
    """An asyncio Redis client for the process loop. A cut connection is retried within ~2 s in all
    (redis-py's default backoff waits up to 1, 2 and 4 s), well inside a step's lease: a step stuck
    in its client's backoff would let its lease lapse under it while it still runs."""
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=6)
    client = aredis.Redis.from_url(
        settings.redis_url, decode_responses=True, retry=retry,
        retry_on_error=[redis_lib.ConnectionError, redis_lib.TimeoutError],
        encoding_errors="replace",  # a message that is not UTF-8 is rejected, not a decode error
    )  # fmt: skip
    packed_pool(client.connection_pool)
    return client


def leases() -> Leases:
    """The leases of the steps this process runs, renewed together (call it on the process loop)."""
    global _leases
    if _leases is None:
        _leases = Leases(batch(), settings.lease_ms)
    return _leases


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


def events(hostname: str) -> TaskEvents:
    """Celery task events sent as worker `hostname` (the numbering of the clock is per process;
    call it on the process loop)."""
    found = _events.get(hostname)
    if found is None:
        db = int(redis().connection_pool.connection_kwargs.get("db", 0))
        found = _events.setdefault(hostname, TaskEvents(wire.Events(hostname, db), batch()))
    return found


def generate_for(provider: str | None, fallback: list[str], *, stream: bool = False) -> Generate:
    """The model of a run: the factory named by TOOLLOOP_PROMPT_GEN, else `providers.from_env()`.
    `stream`: the call passes on the `on_delta` of workers/deltas.py's ON_DELTA (RunSpec.stream)."""
    prompt_gen = _get_prompt_gen()
    if stream:
        return deltas.streamed_from(prompt_gen, provider, fallback)
    if not hasattr(prompt_gen, "generate"):  # a plain generate(request, signal[, on_delta])
        return deltas.without_deltas(prompt_gen)
    if fallback:
        prompt_gen = type(prompt_gen)(
            {name: prompt_gen.handler(name) for name in prompt_gen.providers()},
            provider or prompt_gen.default_provider,
            fallback,
        )

    async def generate(request: PromptGenRequest, signal: AbortSignal) -> PromptGenResult:
        result: PromptGenResult = await prompt_gen.generate(request, signal=signal, provider=provider)
        return result

    return generate


def prompt_gen() -> Any:
    """This process's PromptGen (or plain generate), made once (TOOLLOOP_PROMPT_GEN)."""
    return _get_prompt_gen()


def _get_prompt_gen() -> Any:
    global _prompt_gen
    with _lock:
        if _prompt_gen is None:
            if settings.prompt_gen:
                module, _, name = settings.prompt_gen.partition(":")
                _prompt_gen = getattr(importlib.import_module(module), name)()
            else:
                from toolloop.providers import from_env

                _prompt_gen = from_env(http_client=client_from_env())  # keep-alive, for the kept loop
        return _prompt_gen


# -- cancellation ---------------------------------------------------------------------------------


def arm(run_id: str, controller: AbortController) -> None:
    """Route cancels of `run_id` to `controller` while its live step runs in this process."""
    with _lock:
        _armed[run_id] = controller


def disarm(run_id: str, controller: AbortController) -> None:
    with _lock:
        if _armed.get(run_id) is controller:
            del _armed[run_id]


def _listen_for_cancels() -> None:
    while True:
        try:
            pubsub = redis().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            pubsub.subscribe(keys.CANCEL_CHANNEL)
            while True:
                message = pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "message":
                    with _lock:
                        controller = _armed.get(str(message["data"]))
                    if controller is not None:
                        controller.abort("cancel")
        except redis_lib.RedisError as error:
            log.warning("cancel listener lost Redis (%s); reconnecting", error)
            time.sleep(1.0)


# -- the worker's start ---------------------------------------------------------------------------


def _sweep_forever() -> None:
    """The full sweep every TOOLLOOP_SWEEP_INTERVAL s (one worker at a time); in between, once a
    second, the waits whose deadline is due (workers/approvals.py: a cheap range read when none is)."""
    from workers import approvals, runs
    from workers.app import app

    tick = min(1.0, settings.sweep_interval)
    last = time.monotonic()
    while True:
        time.sleep(tick)
        try:
            client = redis()
            approvals.sweep_due(client, app)
            if time.monotonic() - last < settings.sweep_interval:
                continue
            last = time.monotonic()
            if client.set(keys.SWEEP_LOCK, "1", nx=True, px=int(settings.sweep_interval * 1000)):
                done = runs.sweep(client)
                if _metrics is not None:
                    _metrics.swept(done)
        except Exception as error:  # the sweeper must outlive any one failure
            log.warning("sweep failed: %s: %s", type(error).__name__, error)


def check_redis(client: redis_lib.Redis) -> None:
    """Warn when Redis can lose the journal: AOF off, an eviction policy other than noeviction, or
    no maxmemory."""
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


def start_worker_threads(**_: Any) -> None:
    tracing.configure()  # before gc.freeze: the SDK's objects are frozen with the rest
    if os.environ.get("TOOLLOOP_GC", "1") == "1":
        import gc

        gc.freeze()
        gc.set_threshold(100_000, 50, 1000)
    check_redis(redis())
    if settings.metrics_port:
        start_metrics(settings.metrics_port)
    loop()
    threading.Thread(target=_listen_for_cancels, name="toolloop-cancel", daemon=True).start()
    if settings.sweep_interval > 0:
        threading.Thread(target=_sweep_forever, name="toolloop-sweep", daemon=True).start()


def connect_signals() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(start_worker_threads, weak=False)
