"""workers/worker/kombu_redis.py against a real Redis and kombu itself: what the step consumer's queue claims
is recorded where kombu's own restore finds it (a dead consumer's step comes back through any Celery
worker), and its ack, restore and restore_visible leave the queue and `unacked` as kombu would."""

from __future__ import annotations

import time
import uuid

import redis
import redis.asyncio as aredis
from kombu import Connection

from toolloop.embedded import EmbeddedServer
from workers.process.redisio import Batch
from workers.protocol import names, wire
from workers.worker.kombu_redis import KombuRedisQueue


def _queue(url: str) -> tuple[KombuRedisQueue, aredis.Redis]:
    client = aredis.Redis.from_url(url, decode_responses=True)
    connect = lambda: aredis.Redis.from_url(url, decode_responses=True)  # noqa: E731
    return KombuRedisQueue(
        Batch(client), connect, f"toolloop:wake:{uuid.uuid4().hex}", 262_144, 0.2
    ), client


def _sent(raw: redis.Redis, queue: str, n: int) -> wire.Delivery:
    made = wire.task_message(names.ADVANCE, [uuid.uuid4().hex, n], f"r:{n}", queue)
    raw.lpush(queue, made.raw)
    return made


async def test_a_claimed_step_left_unacked_is_restored_by_kombus_own_sweep(
    redis_server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    redis_client.delete(names.UNACKED, names.UNACKED_INDEX)
    name = f"q-{uuid.uuid4().hex[:8]}"
    made = _sent(redis_client, name, 1)
    queue, client = _queue(redis_server.url)
    try:
        (got,) = await queue.claim([name], 10)
        assert (got.queue, got.raw, got.tag) == (name, made.raw, made.tag)
        assert redis_client.llen(name) == 0 and redis_client.hexists(
            names.UNACKED, made.tag
        )
    finally:
        await queue.close()
        await client.aclose()
    # the consumer died: kombu's sweep (any Celery worker's) puts it back, as it would its own
    with Connection(
        redis_server.url, transport_options={"visibility_timeout": 0}
    ) as connection:
        connection.default_channel.qos.restore_visible(num=10)
    assert redis_client.hlen(names.UNACKED) == 0
    (back,) = redis_client.lrange(name, 0, -1)
    assert wire.parse(back).task_id == made.task_id and wire.parse(back).tag == made.tag


async def test_ack_restore_and_restore_visible_move_what_kombu_would(
    redis_server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    redis_client.delete(names.UNACKED, names.UNACKED_INDEX)
    name = f"q-{uuid.uuid4().hex[:8]}"
    first, second, third = (_sent(redis_client, name, n) for n in (1, 2, 3))
    queue, client = _queue(redis_server.url)
    try:
        got = await queue.claim([name], 10)
        # the consuming end first
        assert [one.tag for one in got] == [
            first.tag,
            second.tag,
            third.tag,
        ]
        queue.ack(first.tag)
        assert await queue.restore(name, second) is True
        assert await queue.restore(name, second) is False  # restored already: not twice
        # delivered just now
        assert await queue.restore_visible(time.time() - 3600, 10) == 0
        # the third, never acked
        assert await queue.restore_visible(time.time() + 1, 10) == 1
        assert (
            redis_client.hlen(names.UNACKED) == 0
            and redis_client.zcard(names.UNACKED_INDEX) == 0
        )
        assert [wire.parse(raw).tag for raw in redis_client.lrange(name, 0, -1)] == [
            second.tag,
            third.tag,
        ]
        assert await queue.claim([], 10) == []
    finally:
        await queue.close()
        await client.aclose()
