"""A turn's WAIT (TOOLLOOP_COMMIT_WAIT, workers/process/redisio.py) is answered by the durable
commands' replies; when it fails (a primary demoted in a failover answers "UNBLOCKED", a lost
connection), nothing is left for asyncio to report as "Future exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import socket
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from workers.process.redisio import Batch
from workers.protocol.errors import NotReplicatedError
from workers.protocol.lua import Lua

ONE = Lua("return 1")


def refused_port() -> int:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        return int(held.getsockname()[1])


async def test_a_failed_wait_leaves_no_future_unretrieved() -> None:
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    client = aredis.Redis(
        port=refused_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    batch = Batch(client, wait=(1, 100))
    commit = batch.script(ONE, [], [], durable=True)
    with pytest.raises((RedisConnectionError, NotReplicatedError)):
        await asyncio.wait_for(commit, 10)
    await asyncio.sleep(0.05)  # the flush's task ends
    del commit
    gc.collect()
    await asyncio.sleep(0)
    assert not reported, [str(context.get("message")) for context in reported]
    await client.aclose()
