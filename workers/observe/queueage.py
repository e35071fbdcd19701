"""How long the oldest step has waited on each step queue: `toolloop_queue_oldest_seconds{queue}`,
read from Redis when /metrics is scraped (workers/observe/metrics.py), beside the queue depth.

Every task message toolloop writes carries the time it was sent, the header `sent_at` (Unix seconds:
`workers.protocol.wire.task_message`, and `workers.config.celery.send` for the few that go through Celery's
producer). A queue's lists are LPUSHed and consumed from the right, so the message next in line
(`LINDEX <list> -1`) is the one that waited longest; the age of a queue is the oldest of its
priority lists' next messages (0 when none waits). A message kombu restored after a lost worker
keeps its first `sent_at`, so its age counts from its first send. A message without a usable
`sent_at` (written by another producer) counts from the first scrape of this process that found it
next in line. The age is the worker's clock minus the producer's: keep the hosts' clocks in sync
(NTP: milliseconds), or read it to the second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import orjson

from workers.protocol import names, wire

FUTURE_S = 86_400.0
"""A `sent_at` further ahead of this worker's clock than this is not a time (its message counts as
one without `sent_at`)."""


def sent_at(raw: bytes | str) -> float | None:
    """The `sent_at` header of a task message as it lies on a queue; None when it has none, or the
    message is not one (nothing in it runs: JSON is read, no more)."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    headers = message.get("headers") if isinstance(message, dict) else None
    value = headers.get(names.SENT_AT) if isinstance(headers, dict) else None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
    ):
        return None
    return float(value) if value > 0 else None


class OldestWaiting:
    """The age of each step queue's oldest waiting message, read in one pipeline of `LINDEX -1`.
    Keeps, between scrapes, when it first saw each next-in-line message without `sent_at` (at most
    one per priority list: the ones next in line now)."""

    def __init__(self, redis: Any, queues: Sequence[str] = names.STEP_QUEUES) -> None:
        self.redis = redis
        self.queues = list(queues)
        self.list_keys = wire.queue_keys(self.queues)
        self._first_seen: dict[tuple[str, bytes | str], float] = {}

    def __call__(self) -> dict[str, float]:
        pipe = self.redis.pipeline(transaction=False)
        for key in self.list_keys:
            pipe.lindex(key, -1)
        return self.ages(
            dict(zip(self.list_keys, pipe.execute(), strict=True)), time.time()
        )

    def ages(
        self, next_in_line: dict[str, bytes | str | None], now: float
    ) -> dict[str, float]:
        """Seconds the oldest message of each queue has waited, from each list's next message."""
        ages = dict.fromkeys(self.queues, 0.0)
        seen: dict[tuple[str, bytes | str], float] = {}
        for key, raw in next_in_line.items():
            if raw is None:
                continue
            when = sent_at(raw)
            if when is None or when > now + FUTURE_S:
                when = seen[(key, raw)] = self._first_seen.get((key, raw), now)
            queue = names.queue_of(key)
            ages[queue] = max(ages[queue], now - when)
        self._first_seen = seen
        return ages
