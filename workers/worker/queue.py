"""The step consumer's view of its broker: `StepQueue`, a small interface, and `Claimed`.

The consumer (workers/worker/consumer.py) schedules: how many steps run at once, what a failure does, when
a shutdown puts steps back. The queue moves messages: it claims them (each recorded as delivered
until acked), acks, restores one to its queue, restores those delivered too long ago, and records a
message handed to this consumer without a trip through its queue. The implementation on kombu's
Redis transport is workers/worker/kombu_redis.py; an in-memory one could stand in for it in a test.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from workers.protocol.wire import Delivery


@dataclass(frozen=True)
class Claimed:
    """One message a claim took: its queue (without the priority suffix), the message, and the tag
    it was recorded under as delivered ("" when it recorded none: forget only a recorded one)."""

    queue: str
    raw: str
    tag: str


class StepQueue(Protocol):
    async def claim(self, queues: list[str], most: int) -> list[Claimed]:
        """Up to `most` messages of `queues` (in their consume order), each recorded as delivered;
        when all are empty, wait a short while for one (`wake` ends the wait early)."""
        ...

    def record(self, queue: str, delivery: Delivery) -> asyncio.Future[Any]:
        """Record `delivery` as delivered to this consumer without taking it off `queue` (a message
        this process produced and runs itself); the future resolves once the record landed."""
        ...

    def ack(self, tag: str) -> None:
        """Forget the delivery recorded under `tag` (its step committed, or it was rejected)."""
        ...

    async def restore(self, queue: str, delivery: Delivery) -> bool:
        """Put a delivered message back at the consuming end of `queue`, unless it was acked or
        restored already (False then). Raises what Redis raises: the caller decides on retries."""
        ...

    async def restore_visible(self, delivered_before: float, most: int) -> int:
        """Put back on their queues up to `most` messages delivered before `delivered_before` (a
        time.time()) and never acked (a dead consumer's); how many went back."""
        ...

    def wake(self) -> None:
        """End a `claim` that waits (call it on the loop)."""
        ...

    async def close(self) -> None:
        """Release what the queue holds (its blocking connection)."""
        ...
