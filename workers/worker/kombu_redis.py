"""`KombuRedisQueue`: the step queues on kombu's Redis transport (the `StepQueue` of workers/worker/queue.py),
and the check that the broker uses the layout it writes.

The layout is kombu 5.7's (names from kombu itself: workers/protocol/names.py): a queue is a list (LPUSH by
producers, RPOP/BRPOP by consumers; its priority lists `<queue><sep><n>`), a delivered message waits
in the `unacked` hash (tag -> [message, exchange, routing key]) and the `unacked_index` zset (tag ->
time delivered) until it is acked, and any Celery worker restores it once it is older than the
visibility timeout. A stock Celery worker, Flower and `celery inspect` see what they always see.

Transport options that change that layout (`sep`, `unacked_key`, `priority_steps`,
`global_keyprefix`, ...) are refused when a worker starts (`check_transport_options`): the step
consumer would read and write other keys than kombu.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis.asyncio as aredis
from kombu.transport.redis import Channel

from workers.process.redisio import Batch
from workers.protocol import names, wire
from workers.protocol.scripts.queue import CLAIM, RESTORE, RESTORE_VISIBLE
from workers.worker.queue import Claimed


def claimed(reply: list[Any]) -> list[Claimed]:
    """CLAIM's reply, parsed once."""
    return [
        Claimed(names.queue_of(str(reply[i])), str(reply[i + 1]), str(reply[i + 2]))
        for i in range(0, len(reply) - 2, 3)
    ]


class KombuRedisQueue:
    """The `StepQueue` on kombu's Redis transport. `batch`: the process's Redis batch (every
    command but the blocking wait goes through it); `connect`: makes the client of the blocking
    wait (BRPOP on the queues and `wake_key`, at most `block_s`); a message over `max_task_bytes`
    is returned unrecorded (the consumer rejects it)."""

    def __init__(
        self,
        batch: Batch,
        connect: Callable[[], aredis.Redis],
        wake_key: str,
        max_task_bytes: int,
        block_s: float = 1.0,
    ) -> None:
        self.batch = batch
        self.connect = connect
        self.wake_key = wake_key
        self.max_task_bytes = max_task_bytes
        self.block_s = block_s
        self._blocking: aredis.Redis | None = None

    async def claim(self, queues: list[str], most: int) -> list[Claimed]:
        keys = wire.queue_keys(queues)
        if not keys:
            await asyncio.sleep(0.5)
            return []
        got = claimed(
            await self.batch.script(
                CLAIM,
                [names.UNACKED, names.UNACKED_INDEX, *keys],
                [most, time.time(), self.max_task_bytes],
            )
        )
        return got or await self._wait_for_one(keys)

    async def _wait_for_one(self, keys: list[str]) -> list[Claimed]:
        """BRPOP one message when the queues are empty, and record it as delivered (as kombu does
        after its BRPOP: a crash between the two leaves it to the run's outbox and the sweeper)."""
        if self._blocking is None:
            self._blocking = self.connect()
        item = await self._blocking.brpop([*keys, self.wake_key], timeout=self.block_s)
        if not item or item[0] == self.wake_key:
            return []
        # the client decodes: both str
        queue, raw = (
            names.queue_of(str(item[0])),
            str(item[1]),
        )
        if len(raw) > self.max_task_bytes:
            return [Claimed(queue, raw, "")]
        try:
            delivery = wire.parse(raw)
        except wire.BadMessage:
            return [Claimed(queue, raw, "")]
        await self.record(queue, delivery)
        return [Claimed(queue, raw, delivery.tag)]

    def record(self, queue: str, delivery: wire.Delivery) -> asyncio.Future[Any]:
        index = self.batch.call("ZADD", names.UNACKED_INDEX, time.time(), delivery.tag)
        value = self.batch.call(
            "HSET", names.UNACKED, delivery.tag, wire.unacked_value(delivery.raw, queue)
        )
        return asyncio.gather(index, value)

    def ack(self, tag: str) -> None:
        if tag:
            self.batch.send("ZREM", names.UNACKED_INDEX, tag)
            self.batch.send("HDEL", names.UNACKED, tag)

    async def restore(self, queue: str, delivery: wire.Delivery) -> bool:
        keys = [names.UNACKED, names.UNACKED_INDEX, queue]
        return (
            int(await self.batch.script(RESTORE, keys, [delivery.tag, delivery.raw]))
            == 1
        )

    async def restore_visible(self, delivered_before: float, most: int) -> int:
        keys = [names.UNACKED, names.UNACKED_INDEX]
        return int(
            await self.batch.script(RESTORE_VISIBLE, keys, [delivered_before, most])
        )

    def wake(self) -> None:
        self.batch.send("LPUSH", self.wake_key, "1")

    async def close(self) -> None:
        if self._blocking is not None:
            await self._blocking.aclose()
        await self.batch.call("DEL", self.wake_key)


# -- the transport options a worker accepts ---------------------------------------------------------

_LAYOUT = (
    "sep",
    "ack_emulation",
    "unacked_key",
    "unacked_index_key",
    "priority_steps",
    "global_keyprefix",
    "fanout_prefix",
    "fanout_patterns",
)
"""kombu's Redis transport options that change where or how messages, deliveries and events lie in
Redis: the step consumer and the event sender write that layout themselves (workers/protocol/wire.py)."""


class UnsupportedTransportOption(ValueError):
    """`broker_transport_options` changes kombu's Redis layout, which toolloop's worker writes itself."""


def _as_default(name: str, value: Any) -> bool:
    default = getattr(Channel, name)
    if name == "priority_steps":
        return isinstance(value, list | tuple) and [int(v) for v in value] == [
            int(v) for v in default
        ]
    if (
        name == "fanout_prefix"
    ):  # True means kombu's prefix; the same prefix spelled out is the same
        return value is True or value == Channel.keyprefix_fanout
    return bool(value == default)


def check_transport_options(options: Mapping[str, Any] | None) -> None:
    """Refuse, with what to do, `broker_transport_options` this worker cannot honour (see _LAYOUT);
    any other option (visibility_timeout, the restore cadence, socket and health settings) is kombu's."""
    changed = {name: options[name] for name in _LAYOUT if options and name in options}
    refused = {
        name: value for name, value in changed.items() if not _as_default(name, value)
    }
    if not refused:
        return
    listed = ", ".join(
        f"{name}={value!r} (kombu's default: {getattr(Channel, name)!r})"
        for name, value in refused.items()
    )
    raise UnsupportedTransportOption(
        f"broker_transport_options sets {listed}.\n"
        "  toolloop's worker writes kombu's Redis layout itself (task messages, deliveries in "
        "`unacked`, events) and supports only kombu's defaults for "
        f"{', '.join(_LAYOUT)}.\n"
        "  Remove these options from broker_transport_options (every worker, client and Flower on this "
        "Redis must agree), or give toolloop a Redis database of its own instead of a key prefix."
    )
