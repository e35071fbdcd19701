"""workers/process/redisio.py `Batch` against a real Redis whose script cache is emptied under it (SCRIPT
FLUSH on a live connection, or a restart): the effects of a batch land in the batch's order, each
once, and every caller gets the reply its command would have had."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from tests.integration.conftest import own_redis
from toolloop.embedded import EmbeddedServer
from workers.config.celery import make_app
from workers.config.settings import Settings
from workers.process.redisio import Batch
from workers.process.worker_process import WorkerProcess
from workers.protocol.lua import Lua

pytestmark = pytest.mark.timeout(60)

APPEND = Lua("redis.call('XADD', KEYS[1], '*', 'e', ARGV[1]) return 1")
"""A script that writes one entry to a stream, as DELTA_FLUSH and RUN_COMMIT write a run's events."""
AFTER = ["warm", "a", "b", "c", "d", "g", "e", "f"]
"""The entries after `_one_turn`: a turn's fire-and-forget writes go last (one SEND_MANY script)."""
APPEND_TOO = Lua("-- another script, first run after the flush\n" + APPEND)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "noscript-redis")  # this module restarts it


@contextlib.asynccontextmanager
async def _batch(server: EmbeddedServer) -> AsyncIterator[Batch]:
    """A worker process's own batch (its client: retried connections, hiredis packing)."""
    settings = dataclasses.replace(
        Settings.from_env(), redis_url=server.url, sweep_interval=0, kill_plan=""
    )
    process = WorkerProcess(
        make_app(settings), settings, loop=asyncio.get_running_loop()
    )
    try:
        yield process.batch
    finally:
        await process.aclose()
        process.celery.close()


def _entries(raw: redis.Redis, stream: str) -> list[str]:
    return [fields["e"] for _, fields in raw.xrange(stream)]


async def _one_turn(batch: Batch, stream: str, box: str) -> list[Any]:
    """Queue, in one loop turn (one batch), scripts and plain commands that all write to `stream`,
    and an HSETNX whose reply says who set the field first."""
    replies = [
        batch.script(APPEND, [stream], ["a"]),
        batch.call("XADD", stream, "*", "e", "b"),
        batch.script(APPEND_TOO, [stream], ["c"]),
        batch.call("HSETNX", box, "k", "v"),
        batch.script(APPEND, [stream], ["d"]),
    ]
    batch.send("XADD", stream, "*", "e", "e")
    batch.send("XADD", stream, "*", "e", "f")
    replies.append(batch.call("XADD", stream, "*", "e", "g"))
    out = await asyncio.gather(*replies, return_exceptions=True)
    await batch.call("PING")  # the fire-and-forget writes went before it
    return out


async def test_a_flushed_script_cache_keeps_the_batchs_order(
    server: EmbeddedServer,
) -> None:
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    stream, box = f"s:{uuid.uuid4().hex}", f"h:{uuid.uuid4().hex}"
    async with _batch(server) as batch:
        # the batch knows it is loaded
        assert await batch.script(APPEND, [stream], ["warm"]) == 1
        raw.script_flush()  # as a Redis restart behind a proxy, or an operator: the connection stays
        replies = await _one_turn(batch, stream, box)
        assert not [r for r in replies if isinstance(r, BaseException)], replies
        assert replies[3] == 1  # HSETNX set it: it ran once
        assert _entries(raw, stream) == AFTER
    raw.close()


async def test_a_redis_restart_keeps_the_batchs_order(server: EmbeddedServer) -> None:
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    stream, box = f"s:{uuid.uuid4().hex}", f"h:{uuid.uuid4().hex}"
    async with _batch(server) as batch:
        assert await batch.script(APPEND, [stream], ["warm"]) == 1
        server.stop()  # a clean shutdown: the AOF has the stream (a SIGKILL may lose its last second)
        server.start()  # the script cache is empty, the batch's connection gone
        replies = await _one_turn(batch, stream, box)
        assert not [r for r in replies if isinstance(r, BaseException)], replies
        assert replies[3] == 1
        assert _entries(raw, stream) == AFTER
    raw.close()


async def test_batches_in_flight_together_run_again_in_their_order(
    server: EmbeddedServer,
) -> None:
    """The first batch is large (Redis reads it in pieces, and answers the second one first): its
    command runs again before the second batch's all the same."""
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    stream = f"s:{uuid.uuid4().hex}"
    async with _batch(server) as batch:
        warm = [batch.script(APPEND, [stream], ["w"])]
        await asyncio.sleep(0)
        # two batches at once: two connections
        warm.append(batch.script(APPEND, [stream], ["w"]))
        assert await asyncio.gather(*warm) == [1, 1]
        raw.script_flush()
        first = batch.script(APPEND, [stream], ["a" * 8_000_000])
        # the first batch is taken: the next command goes in a batch of its own
        await asyncio.sleep(0)
        second = batch.script(APPEND, [stream], ["b"])
        assert await asyncio.gather(first, second) == [1, 1]
        assert [e[:1] for e in _entries(raw, stream)] == ["w", "w", "a", "b"]
    raw.close()
