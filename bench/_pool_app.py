"""The Celery app of bench/pools.py: a self-chaining "model step" that makes one slow HTTP call.

How the call is made is what bench/pools.py compares (BENCH_CALL_MODE):
- `loop`: the threads pool; each task thread blocks on a coroutine submitted to ONE asyncio loop per
  worker process (a daemon thread owning one `httpx.AsyncClient`), the shape an async provider needs;
- `loopfresh`: as `loop`, but a new AsyncClient (and connection) per call;
- `threadloop`: the threads pool; each pool thread keeps its own event loop and AsyncClient;
- `sync`: a thread-safe `httpx.Client` shared by the pool's threads (or greenlets under gevent, or
  one per child under prefork).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import time
from typing import Any

import httpx
import redis
from _bare_app import make_app

QUEUE = "bench-model"
URL = os.environ["BENCH_REDIS_URL"]
MODEL_URL = os.environ.get("BENCH_MODEL_URL", "")
MODE = os.environ.get("BENCH_CALL_MODE", "loop")
TRACE = bool(os.environ.get("BENCH_TRACE"))
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=2000)
TIMEOUT = httpx.Timeout(30.0)
PAYLOAD = {
    "model": "bench",
    "max_tokens": 1024,
    "system": "You review storyboards. " * 40,
    "messages": [{"role": "user", "content": "Review shot 3. " * 20}],
}

app = make_app("bench_pool", URL)
app.conf.task_default_queue = QUEUE
_redis = redis.Redis.from_url(URL, max_connections=None)
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_async_client: httpx.AsyncClient | None = None
_sync_client: httpx.Client | None = None


def _process_loop() -> tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]:
    """The worker process's one event loop (started on first use) and its one AsyncClient."""
    global _loop, _async_client
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="model-loop", daemon=True
            ).start()

            async def make() -> httpx.AsyncClient:
                return httpx.AsyncClient(limits=LIMITS, timeout=TIMEOUT)

            _async_client = asyncio.run_coroutine_threadsafe(make(), loop).result()
            _loop = loop
    assert _loop is not None and _async_client is not None
    return _loop, _async_client


_local = threading.local()


def _thread_loop() -> tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]:
    """This pool thread's own event loop and AsyncClient (created on the thread's first task)."""
    if not hasattr(_local, "loop"):
        _local.loop = asyncio.new_event_loop()
        _local.client = httpx.AsyncClient(limits=LIMITS, timeout=TIMEOUT)
    return _local.loop, _local.client


def _client() -> httpx.Client:
    global _sync_client
    with _lock:
        if _sync_client is None:
            _sync_client = httpx.Client(limits=LIMITS, timeout=TIMEOUT)
    return _sync_client


_ssl: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """One SSL context for every fresh client (as toolloop.http.HttpxClient keeps): one costs ~10 ms."""
    global _ssl
    if _ssl is None:
        _ssl = ssl.create_default_context()
    return _ssl


def call_model() -> Any:
    if MODE == "sleep":  # no HTTP at all: the floor of the pool itself
        time.sleep(float(os.environ.get("BENCH_SLEEP_S", "1")))
        return None
    if MODE in ("loop", "loopfresh", "threadloop"):
        loop, client = _thread_loop() if MODE == "threadloop" else _process_loop()

        async def post() -> Any:
            if (
                MODE == "loopfresh"
            ):  # a client per call, as toolloop.http.HttpxClient does
                async with httpx.AsyncClient(
                    timeout=TIMEOUT, verify=_ssl_context()
                ) as fresh:
                    response = await fresh.post(MODEL_URL, json=PAYLOAD)
            else:
                response = await client.post(MODEL_URL, json=PAYLOAD)
            response.raise_for_status()
            return response.json()

        if MODE == "threadloop":
            return loop.run_until_complete(post())
        return asyncio.run_coroutine_threadsafe(post(), loop).result(timeout=60)
    response = _client().post(
        MODEL_URL,
        content=json.dumps(PAYLOAD).encode(),
        headers={"content-type": "application/json"},
    )
    response.raise_for_status()
    return response.json()


@app.task(name="bench.model_step")
def model_step(run_id: str, n: int, total: int) -> None:
    started = time.time()
    call_model()
    if TRACE:
        _redis.rpush("bench:trace", f"{run_id} {n} {started} {time.time()}")
    if n + 1 >= total:
        _redis.rpush(f"bench:done:{run_id.split(':')[0]}", repr(time.time()))
        return
    model_step.apply_async((run_id, n + 1, total))
