"""The floor of bench/durable.py: a bare self-chaining no-op Celery task on the same Redis, with the
same production settings as `workers.app` (late ack, prefetch 1, events on, JSON, no results).

    celery -A _bare_app worker ...      (bench/ on PYTHONPATH, BENCH_REDIS_URL set)

A chain of `hop(chain_id, n, total)` tasks: each hop enqueues the next; the last one pushes the wall
clock time onto `bench:done:<chain_id>`, which the benchmark waits for with BLPOP.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

QUEUE = "bench-hop"

# What workers.app sets, when it cannot be imported (kept in step with CELERY-REDIS.md section 8).
FALLBACK_CONF: dict[str, Any] = {
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "worker_prefetch_multiplier": 1,
    "worker_send_task_events": True,
    "task_send_sent_event": True,
    "task_serializer": "json",
    "accept_content": ["json"],
    "task_ignore_result": True,
    "broker_connection_retry_on_startup": True,
    "broker_transport_options": {"visibility_timeout": 3600},
}
_NOT_COPIED = {
    "broker_url",
    "result_backend",
    "task_routes",
    "include",
    "imports",
    "task_default_queue",
}


def production_conf() -> tuple[dict[str, Any], str]:
    """The settings of the production app (and where they came from)."""
    try:
        from workers.app import app as production
    except ImportError:
        return dict(FALLBACK_CONF), "fallback (workers.app not importable)"
    changes = {
        key: value
        for key, value in production.conf.changes.items()
        if key not in _NOT_COPIED
    }
    return changes, "workers.app"


def make_app(name: str, url: str) -> Celery:
    app = Celery(name, broker=url, set_as_current=False)
    conf, _ = production_conf()
    app.conf.update(conf)
    app.conf.task_default_queue = QUEUE
    return app


# set by bench/durable.py: a private server, never the shared one
URL = os.environ["BENCH_REDIS_URL"]
app = make_app("bench_bare", URL)
_redis = redis.Redis.from_url(URL)


@app.task(name="bench.hop")
def hop(chain_id: str, n: int, total: int, extra_round_trips: int = 0) -> None:
    for _ in range(
        extra_round_trips
    ):  # what-if: a hop that also makes k Redis round trips
        _redis.ping()
    if n >= total:
        _redis.rpush(f"bench:done:{chain_id}", repr(time.time()))
        return
    hop.apply_async((chain_id, n + 1, total, extra_round_trips))
