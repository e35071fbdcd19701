"""The steps' Redis I/O: every command a process's live steps make goes out in one pipeline per turn
of its asyncio loop.

At hundreds of steps in flight, most of the CPU a Redis command costs in Python is the client's work
around it (a connection checkout, packing, parsing), not the round trip. `Batch` queues commands and
sends everything queued during one loop turn as one pipeline (no MULTI: each script is atomic on its
own), so a turn that starts 200 steps makes one round trip, not 200. Order is kept: commands queued
one after another run one after another (a turn's `send`s after its `call`s, in one script), also
when Redis has forgotten the scripts (NOSCRIPT: see workers/protocol/scriptcache.py). `call` returns the
reply; `send` is fire-and-forget for writes whose loss something else repairs (events, acks: see
workers/worker/consumer.py), and only logs.

`PackedConnection` packs commands with hiredis's C packer (redis-py's asyncio client packs in
Python: ~6x the CPU for a turn's pipeline).

The leases the steps hold are renewed by workers/process/leases.py `Leases`, through a process's `Batch`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

import hiredis
import redis as redis_lib
import redis.asyncio as aredis

from toolloop.sentinel import AsyncFollowingConnection
from workers.protocol.errors import NotReplicatedError, replicated
from workers.protocol.lua import Lua
from workers.protocol.scriptcache import ScriptCache, failed_from, name
from workers.protocol.scripts.batch import SEND_MANY

log = logging.getLogger("toolloop.workers")

_Command = tuple[tuple[Any, ...], "asyncio.Future[Any] | None"]


class PackedConnection(aredis.Connection):
    """redis-py's asyncio TCP connection, packing commands with `hiredis.pack_command` (C), as
    redis-py's sync client does when hiredis is installed. Arguments are what redis-py accepts of
    them here: str (UTF-8), bytes, int and float. Its asyncio connection has no packer to plug in
    (the sync one takes `command_packer`), so this overrides `pack_command` / `pack_commands`:
    redis-py is pinned below its next minor, and tests/unit/test_redis_packing.py checks the bytes
    against redis-py's own packer and that redis-py still sends through these two methods."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if (
            isinstance(args[0], str) and " " in args[0]
        ):  # "CLIENT SETNAME": two arguments, as redis-py
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(self.pack_command(*command)[0] for command in commands)]


class PackedSentinelConnection(AsyncFollowingConnection):
    """A Sentinel-managed connection (a `redis+sentinel://` URL) packing as `PackedConnection` does."""

    pack_command = PackedConnection.pack_command
    pack_commands = PackedConnection.pack_commands


_PACKED: dict[type[Any], type[Any]] = {
    aredis.Connection: PackedConnection,
    AsyncFollowingConnection: PackedSentinelConnection,
}


def packed_pool(pool: aredis.ConnectionPool) -> aredis.ConnectionPool:
    """`pool`, its plain TCP connections packed by hiredis (TLS and unix sockets keep redis-py's)."""
    packed = _PACKED.get(pool.connection_class)
    if packed is not None and hasattr(hiredis, "pack_command"):
        pool.connection_class = packed
    return pool


def _loaded(future: asyncio.Future[Any]) -> None:
    error = None if future.cancelled() else future.exception()
    if (
        error is not None
    ):  # the EVALSHAs after it report NOSCRIPT and run again after a load
        log.warning("redis SCRIPT LOAD failed: %s: %s", type(error).__name__, error)


class Batch:
    def __init__(self, client: aredis.Redis, *, wait: tuple[int, int] = (0, 0)) -> None:
        """`wait`: (replicas, ms): a turn with a durable command ends with `WAIT replicas ms`, and
        its durable commands fail with `NotReplicatedError` when fewer confirm (TOOLLOOP_COMMIT_WAIT)."""
        self.client = client
        self.wait = wait
        self.durable: set[asyncio.Future[Any]] = set()
        """The queued commands that count only once replicated (`script(..., durable=True)`)."""
        self.queued: list[_Command] = []
        self.hooks: list[Callable[[], None]] = []
        self.scheduled = False
        self.scripts = ScriptCache(SEND_MANY)
        self.previous: asyncio.Future[None] | None = None
        """The last flush's end: a flush that hit NOSCRIPT runs again only after the flushes before it."""
        self.holding: asyncio.Future[None] | None = None
        """A flush's NOSCRIPT commands running again: flushes not sent yet wait for it."""

    def call(self, *args: Any) -> asyncio.Future[Any]:
        """Queue a command; the future gets its reply (or its error)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue(args, future)
        return future

    def send(self, *args: Any) -> None:
        """Queue a command whose reply nobody waits for (a failure is logged)."""
        self._queue(args, None)

    def at_flush(self, hook: Callable[[], None]) -> None:
        """Call `hook` once when this turn's commands are taken (it may queue more of its own)."""
        self.hooks.append(hook)
        self._schedule()

    def script(
        self, script: Lua, keys: list[str], args: list[Any], *, durable: bool = False
    ) -> asyncio.Future[Any]:
        """Run a Lua script by its SHA (loaded again on NOSCRIPT, as after a Redis restart). `durable`:
        its reply counts only once `wait`'s replicas confirmed it (a step's commit)."""
        future = self.call("EVALSHA", self.scripts.sha(script), len(keys), *keys, *args)
        if durable and self.wait[0]:
            self.durable.add(future)
        return future

    def _queue(self, args: tuple[Any, ...], future: asyncio.Future[Any] | None) -> None:
        self.queued.append((args, future))
        self._schedule()

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        hooks, self.hooks = self.hooks, []
        for hook in hooks:
            hook()
        self.scheduled = False
        commands, self.queued = self.queued, []
        if not commands:
            return
        sends = [args for args, future in commands if future is None]
        if (
            len(sends) > 1
        ):  # every fire-and-forget write of the turn in one script: one command to pack
            flat: list[Any] = []
            for args in sends:
                flat += [len(args), *args]
            commands = [c for c in commands if c[1] is not None]
            commands.append((("EVALSHA", SEND_MANY.sha, 0, *flat), None))
        loop = asyncio.get_running_loop()
        if (
            self.scripts.pending
        ):  # every known script, ahead of the batch's first command
            loads = [
                (command, loop.create_future()) for command in self.scripts.loads()
            ]
            for _, future in loads:
                future.add_done_callback(_loaded)
            commands = loads + commands
        before, self.previous = self.previous, loop.create_future()
        commands = self.scripts.in_order(commands)
        durable, self.durable = self.durable, set()
        if durable:  # the replicas' confirmation of everything the turn wrote, in the same round trip
            # (no future: its reply is read by `_replicated`, and its failure, a lost connection or
            # a primary demoted in a failover, is logged by `_deliver` as a send's is)
            commands.append((("WAIT", *self.wait), None))
        asyncio.get_running_loop().create_task(
            self._flush(commands, before, self.previous, durable)
        )

    async def _flush(
        self,
        commands: list[_Command],
        before: asyncio.Future[None] | None,
        done: asyncio.Future[None],
        durable: set[asyncio.Future[Any]],
    ) -> None:
        try:
            if self.holding is not None:
                await asyncio.wait((self.holding,))
            replies = await self._run([args for args, _ in commands])
            confirmed = [replies[-1]] if durable else []
            if failed_from(replies) is not None:
                replies = await self._again(
                    [args for args, _ in commands], replies, before, confirmed
                )
            if durable:
                replies = self._replicated(commands, replies, durable, confirmed)
            self._deliver(commands, replies)
        finally:
            done.set_result(None)

    def _replicated(
        self,
        commands: list[_Command],
        replies: list[Any],
        durable: set[asyncio.Future[Any]],
        confirmed: list[Any],
    ) -> list[Any]:
        """`replies`, each durable command's replaced by `NotReplicatedError` unless every WAIT in
        `confirmed` counted the replicas asked for: the turn's (its last command), and the one that
        ends each pipeline a NOSCRIPT made the batch send again (on that pipeline's connection: a
        WAIT counts only its own connection's writes)."""
        wanted, timeout_ms = self.wait
        try:
            for reply in confirmed:
                replicated(reply, wanted, timeout_ms)
        except NotReplicatedError as error:
            log.warning("redis: %s", str(error).splitlines()[0])
            return [
                error
                if future in durable and not isinstance(reply, Exception)
                else reply
                for (_, future), reply in zip(commands, replies, strict=True)
            ]
        return replies

    async def _again(
        self,
        commands: list[tuple[Any, ...]],
        replies: list[Any],
        before: asyncio.Future[None] | None,
        confirmed: list[Any],
    ) -> list[Any]:
        """`replies` after `ScriptCache.again`, once the flushes `before` it are done; flushes not sent
        yet wait meanwhile (workers/protocol/scriptcache.py). A durable batch (`confirmed` holds its
        WAIT's reply) ends each pipeline sent again with a WAIT of its own, its reply added there."""

        async def run(again: list[tuple[Any, ...]]) -> list[Any]:
            if not confirmed:
                return await self._run(again)
            got = await self._run([*again, ("WAIT", *self.wait)])
            confirmed.append(got[-1])
            return got[:-1]

        self.holding = holding = asyncio.get_running_loop().create_future()
        try:
            if before is not None:
                await asyncio.wait((before,))
            replies = await self.scripts.again(run, commands, replies)
        finally:
            holding.set_result(None)
            if self.holding is holding:
                self.holding = None
        return replies

    async def _run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        try:
            return await self._execute(commands)
        except Exception as error:  # the connection: every command of the batch failed
            return [error] * len(commands)

    def _deliver(self, commands: list[_Command], replies: list[Any]) -> None:
        for (args, future), reply in zip(commands, replies, strict=True):
            if future is None:
                if isinstance(reply, Exception):
                    log.warning(
                        "redis %s failed: %s: %s",
                        name(args),
                        type(reply).__name__,
                        reply,
                    )
                elif args[1] == SEND_MANY.sha and reply:
                    log.warning(
                        "redis: %d of the batch's writes failed: %s",
                        len(reply),
                        reply[0],
                    )
            elif not future.done():
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies of `commands`, sent as one packed write on one pooled connection (what
        redis-py's non-transactional pipeline does, without its command stack, prepares and
        observability hooks per flush): an error reply is that command's exception; a dropped
        connection is retried as the client's `retry` says (the pipeline's own rule), anything
        else raised for the whole batch."""
        pool = self.client.connection_pool
        callbacks = self.client.response_callbacks
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]

        async def once() -> list[Any]:
            await conn.send_packed_command(conn.pack_commands(commands))
            replies: list[Any] = []
            for args in commands:
                try:
                    reply = await conn.read_response()
                except redis_lib.exceptions.ResponseError as error:
                    replies.append(error)
                    continue
                callback = callbacks.get(name(args))
                if callback is not None:
                    reply = callback(reply)
                    if inspect.isawaitable(reply):
                        reply = await reply
                replies.append(reply)
            return replies

        async def failed(error: Exception) -> None:
            await conn.disconnect(error=error)

        try:
            replies: list[Any] = await conn.retry.call_with_retry(once, failed)
            return replies
        finally:
            await pool.release(conn)
