"""The drivers that run the operations of workers/client/ops.py against Redis: `SyncDriver` (redis-py,
for `Client`) and `AsyncDriver` (redis.asyncio, for `AsyncClient`). Each request is one round trip:
a `Call` one command, a `Pipeline` one pipeline (MULTI when asked), an `Eval` one EVALSHA (a script
Redis does not hold yet, after a restart or on a new server, is loaded and the call repeated once:
a script that was not found never ran).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis as redis_lib
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from workers.client.ops import Call, Emit, Eval, Op, Pipeline, Request, Stream
from workers.protocol.errors import replicated
from workers.protocol.lua import Lua

T = TypeVar("T")


def _commands(batch: Pipeline) -> list[tuple[Any, ...]]:
    return [c.command() if isinstance(c, Eval) else c for c in batch.commands]


def _missing(batch: Pipeline, replies: list[Any]) -> list[int]:
    """The places of the batch's scripts that Redis did not hold (not run: run them again)."""
    if batch.transaction and any(isinstance(r, NoScriptError) for r in replies):
        raise RuntimeError(
            "A script in a MULTI batch was not loaded; load it before the batch."
        )
    return [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]


def _again(batch: Pipeline, places: list[int]) -> list[tuple[Any, ...]]:
    """The commands to send again, in order: those at `places` (scripts Redis had not loaded)."""
    commands = _commands(batch)
    return [commands[i] for i in places]


def _scripts(batch: Pipeline, places: list[int]) -> list[Lua]:
    found = {
        c.script.sha: c.script
        for i in places
        if isinstance(c := batch.commands[i], Eval)
    }
    return list(found.values())


@dataclass(frozen=True)
class _Done:
    """The op has returned `value`."""

    value: Any


def _step(op: Op[Any] | Stream, reply: Any) -> Request | Emit | _Done:
    """The op's next request (or `Emit`) after it is sent `reply`, or `_Done` when it returns: the one
    loop step the two drivers share, so that each only does the round trip of a request."""
    try:
        return op.send(reply)
    except StopIteration as stop:
        return _Done(stop.value)


def _result(step: Emit | _Done) -> Any:
    if isinstance(step, Emit):
        raise TypeError(
            "An operation run with `run` emitted a value; drive it with `stream`."
        )
    return step.value


def _raise_first(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _waits(batch: Pipeline, wait: tuple[int, int]) -> bool:
    """Whether `batch` is a write to confirm: `wait` asks for replicas, and it runs a script or says so."""
    return bool(wait[0]) and (
        batch.durable or any(isinstance(c, Eval) for c in batch.commands)
    )


def _waited(batch: Pipeline, wait: tuple[int, int]) -> Pipeline:
    """`batch` ending with WAIT when it is a write to confirm (`_waits`)."""
    if not _waits(batch, wait):
        return batch
    return Pipeline(
        [*batch.commands, ("WAIT", *wait)], batch.transaction, batch.durable
    )


def _confirmed(replies: list[Any], batch: Pipeline, wait: tuple[int, int]) -> list[Any]:
    """The replies of a `_waited` batch without WAIT's, once it counted the replicas asked for."""
    if not _waits(batch, wait):
        return replies
    replicated(replies[-1], *wait)
    return replies[:-1]


class SyncDriver:
    """Runs operations with redis-py: `redis` for commands, `blocking` (no read timeout) for the
    blocking reads (XREAD BLOCK, BLPOP)."""

    def __init__(
        self,
        client: redis_lib.Redis,
        blocking: redis_lib.Redis,
        *,
        wait: tuple[int, int] = (0, 0),
    ) -> None:
        self.redis, self.blocking = client, blocking
        self.wait = wait

    def run(self, op: Op[T]) -> T:
        reply: Any = None
        while not isinstance(step := _step(op, reply), _Done | Emit):
            reply = self.do(step)
        return _result(step)  # type: ignore[no-any-return]

    def stream(self, op: Stream) -> Iterator[Any]:
        reply: Any = None
        while not isinstance(step := _step(op, reply), _Done):
            if isinstance(step, Emit):
                reply = None
                yield step.value
            else:
                reply = self.do(step)

    def do(self, request: Request) -> Any:
        if isinstance(request, Call):
            return (self.blocking if request.blocking else self.redis).execute_command(
                *request.args
            )  # type: ignore[no-untyped-call]
        if isinstance(request, Eval) and self.wait[0]:
            return _raise_first(self.batch(Pipeline([request])))[0]
        if isinstance(request, Eval):
            try:
                return self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
            except NoScriptError:
                self.redis.script_load(request.script.source)
                return self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
        if isinstance(request, Pipeline):
            return _raise_first(self.batch(request))
        time.sleep(request.seconds)
        return None

    def batch(self, request: Pipeline) -> list[Any]:
        """The replies of the batch, errors in place (a lost connection raises)."""
        batch, waits = _waited(request, self.wait), _waits(request, self.wait)
        pipe = self.redis.pipeline(transaction=batch.transaction)
        for command in _commands(batch):
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        replies: list[Any] = pipe.execute(raise_on_error=False)
        places = _missing(batch, replies)
        if places:
            for script in _scripts(batch, places):
                self.redis.script_load(script.source)
            again = self.redis.pipeline(transaction=False)
            for command in _again(batch, places):
                again.execute_command(*command)  # type: ignore[no-untyped-call]
            if waits:
                again.execute_command("WAIT", *self.wait)  # type: ignore[no-untyped-call]
            redone = [*places, len(replies) - 1] if waits else places
            for i, reply in zip(
                redone, again.execute(raise_on_error=False), strict=True
            ):
                replies[i] = reply
        return _confirmed(replies, request, self.wait)


class AsyncDriver:
    """Runs operations with redis.asyncio (the same requests, awaited)."""

    def __init__(
        self,
        client: aredis.Redis,
        blocking: aredis.Redis,
        *,
        wait: tuple[int, int] = (0, 0),
    ) -> None:
        self.redis, self.blocking = client, blocking
        self.wait = wait

    async def run(self, op: Op[T]) -> T:
        reply: Any = None
        while not isinstance(step := _step(op, reply), _Done | Emit):
            reply = await self.do(step)
        return _result(step)  # type: ignore[no-any-return]

    async def stream(self, op: Stream) -> AsyncIterator[Any]:
        reply: Any = None
        while not isinstance(step := _step(op, reply), _Done):
            if isinstance(step, Emit):
                reply = None
                yield step.value
            else:
                reply = await self.do(step)

    async def do(self, request: Request) -> Any:
        if isinstance(request, Call):
            return await (
                self.blocking if request.blocking else self.redis
            ).execute_command(*request.args)  # type: ignore[no-untyped-call]
        if isinstance(request, Eval) and self.wait[0]:
            return _raise_first(await self.batch(Pipeline([request])))[0]
        if isinstance(request, Eval):
            try:
                return await self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
            except NoScriptError:
                await self.redis.script_load(request.script.source)
                return await self.redis.execute_command(*request.command())  # type: ignore[no-untyped-call]
        if isinstance(request, Pipeline):
            return _raise_first(await self.batch(request))
        await asyncio.sleep(request.seconds)
        return None

    async def batch(self, request: Pipeline) -> list[Any]:
        """The replies of the batch, errors in place (a lost connection raises)."""
        batch, waits = _waited(request, self.wait), _waits(request, self.wait)
        async with self.redis.pipeline(transaction=batch.transaction) as pipe:
            for command in _commands(batch):
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        places = _missing(batch, replies)
        if places:
            for script in _scripts(batch, places):
                await self.redis.script_load(script.source)
            async with self.redis.pipeline(transaction=False) as again:
                for command in _again(batch, places):
                    again.execute_command(*command)
                if waits:
                    again.execute_command("WAIT", *self.wait)
                redone = [*places, len(replies) - 1] if waits else places
                for i, reply in zip(
                    redone, await again.execute(raise_on_error=False), strict=True
                ):
                    replies[i] = reply
        return _confirmed(replies, request, self.wait)
