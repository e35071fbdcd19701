"""The drivers that run the operations of workers/ops.py against Redis: `SyncDriver` (redis-py,
for `Client`) and `AsyncDriver` (redis.asyncio, for `AsyncClient`). Each request is one round trip:
a `Call` one command, a `Batch` one pipeline (MULTI when asked), an `Eval` one EVALSHA (a script
Redis does not hold yet, after a restart or on a new server, is loaded and the call repeated once:
a script that was not found never ran).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import redis as redis_lib
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from workers.ops import Batch, Call, Emit, Eval, Lua, Op, Request, Stream

T = TypeVar("T")


def _commands(batch: Batch) -> list[tuple[Any, ...]]:
    return [c.command() if isinstance(c, Eval) else c for c in batch.commands]


def _missing(batch: Batch, replies: list[Any]) -> list[int]:
    """The places of the batch's scripts that Redis did not hold (not run: run them again)."""
    if batch.transaction and any(isinstance(r, NoScriptError) for r in replies):
        raise RuntimeError("A script in a MULTI batch was not loaded; load it before the batch.")
    return [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]


def _scripts(batch: Batch, places: list[int]) -> list[Lua]:
    found = {c.script.sha: c.script for i in places if isinstance(c := batch.commands[i], Eval)}
    return list(found.values())


def _raise_first(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


class SyncDriver:
    """Runs operations with redis-py: `redis` for commands, `blocking` (no read timeout) for the
    blocking reads (XREAD BLOCK, BLPOP)."""

    def __init__(self, client: redis_lib.Redis, blocking: redis_lib.Redis) -> None:
        self.redis, self.blocking = client, blocking

    def run(self, op: Op[T]) -> T:
        reply: Any = None
        while True:
            try:
                request = op.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = self.do(request)

    def stream(self, op: Stream) -> Iterator[Any]:
        reply: Any = None
        while True:
            try:
                request = op.send(reply)
            except StopIteration:
                return
            if isinstance(request, Emit):
                reply = None
                yield request.value
            else:
                reply = self.do(request)

    def do(self, request: Request) -> Any:
        if isinstance(request, Call):
            return (self.blocking if request.blocking else self.redis).execute_command(*request.args)  # type: ignore[no-untyped-call]
        if isinstance(request, Eval):
            try:
                return self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
            except NoScriptError:
                self.redis.script_load(request.script.source)
                return self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
        if isinstance(request, Batch):
            return _raise_first(self.batch(request))
        time.sleep(request.seconds)
        return None

    def batch(self, batch: Batch) -> list[Any]:
        """The replies of the batch, errors in place (a lost connection raises)."""
        pipe = self.redis.pipeline(transaction=batch.transaction)
        for command in _commands(batch):
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        replies: list[Any] = pipe.execute(raise_on_error=False)
        places = _missing(batch, replies)
        if places:
            for script in _scripts(batch, places):
                self.redis.script_load(script.source)
            again = self.redis.pipeline(transaction=False)
            for i in places:
                again.execute_command(*_commands(batch)[i])  # type: ignore[no-untyped-call]
            for i, reply in zip(places, again.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        return replies


class AsyncDriver:
    """Runs operations with redis.asyncio (the same requests, awaited)."""

    def __init__(self, client: aredis.Redis, blocking: aredis.Redis) -> None:
        self.redis, self.blocking = client, blocking

    async def run(self, op: Op[T]) -> T:
        reply: Any = None
        while True:
            try:
                request = op.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply = await self.do(request)

    async def stream(self, op: Stream) -> AsyncIterator[Any]:
        reply: Any = None
        while True:
            try:
                request = op.send(reply)
            except StopIteration:
                return
            if isinstance(request, Emit):
                reply = None
                yield request.value
            else:
                reply = await self.do(request)

    async def do(self, request: Request) -> Any:
        if isinstance(request, Call):
            return await (self.blocking if request.blocking else self.redis).execute_command(*request.args)  # type: ignore[no-untyped-call]
        if isinstance(request, Eval):
            try:
                return await self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
            except NoScriptError:
                await self.redis.script_load(request.script.source)
                return await self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
        if isinstance(request, Batch):
            return _raise_first(await self.batch(request))
        await asyncio.sleep(request.seconds)
        return None

    async def batch(self, batch: Batch) -> list[Any]:
        """The replies of the batch, errors in place (a lost connection raises)."""
        async with self.redis.pipeline(transaction=batch.transaction) as pipe:
            for command in _commands(batch):
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        places = _missing(batch, replies)
        if places:
            for script in _scripts(batch, places):
                await self.redis.script_load(script.source)
            async with self.redis.pipeline(transaction=False) as again:
                for i in places:
                    again.execute_command(*_commands(batch)[i])
                for i, reply in zip(places, await again.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
        return replies
