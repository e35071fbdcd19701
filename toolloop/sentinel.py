"""Following a Sentinel failover at once: connections that still reach a demoted primary are dropped.

After a graceful `SENTINEL FAILOVER` the old primary keeps accepting writes until the sentinels turn
it into a replica (seconds; measured here: about 10 s and 964 of 2,061 acknowledged writes lost by a
plain redis-py Sentinel client). redis-py re-asks the sentinels only when it makes a new connection,
and turns a `READONLY` reply into a reconnect, so a pooled connection writes to the old primary until
it is demoted. Here:

- `SwitchWatcher` listens for the sentinels' `+switch-master` announcements (a daemon thread on one
  sentinel at a time, the next one when it is lost) and records the new primary on every pool it
  watches (`FollowingPool.announced`);
- a `FollowingConnection` (sync and asyncio) connected anywhere else disconnects before its next
  command; connecting again asks the sentinels, which name the new primary.

What is still written to the old primary between its demotion starting and the announcement arriving
is lost unless the writer waits for a replica (`WAIT`, `TOOLLOOP_COMMIT_WAIT`): docs/operations.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

import redis
from redis.asyncio.connection import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.connection import SSLConnection
from redis.sentinel import SentinelManagedConnection

log = logging.getLogger("toolloop.redis")

SWITCH = "+switch-master"
DEMOTED = "The previous master is now a slave"
"""What redis-py raises when the primary it is connected to answers READONLY (redis/sentinel.py)."""


def _announced(connection: Any) -> tuple[str, int] | None:
    """The primary last announced to the connection's pool (sync connections hold the pool's proxy)."""
    found: tuple[str, int] | None = getattr(
        connection.connection_pool, "announced", None
    )
    return found


def _stale(connection: Any) -> bool:
    announced = _announced(connection)
    return (
        announced is not None
        and connection.host is not None
        and (connection.host, connection.port) != announced
    )


class FollowingConnection(SentinelManagedConnection):
    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._sock is not None and _stale(self):
            self.disconnect()
            self.connect()  # through `_connect_retry`: to the announced primary
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def _connect_retry(self) -> None:
        announced = _announced(self)
        if (
            self._sock is None
            and announced is not None
            and self.connection_pool.is_master
        ):
            self.connect_to(announced)  # type: ignore[no-untyped-call]  # not the sentinels: one that has not heard names the old
            return
        super()._connect_retry()  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except redis.ReadOnlyError:
            raise
        except redis.ConnectionError as error:
            if (
                str(error) == DEMOTED
            ):  # what was announced is a replica now: ask the sentinels again
                self.connection_pool.announced = None
            raise


class AsyncFollowingConnection(AsyncSentinelConnection):
    async def send_packed_command(
        self, command: Any, check_health: bool = True
    ) -> None:
        if self._reader is not None and _stale(self):
            await self.disconnect()
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)

    async def _connect_retry(self) -> None:
        announced = _announced(self)
        if (
            self._reader is None
            and announced is not None
            and self.connection_pool.is_master
        ):
            await self.connect_to(announced)  # type: ignore[no-untyped-call]
            return
        await super()._connect_retry()  # type: ignore[no-untyped-call]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except redis.ReadOnlyError:
            raise
        except redis.ConnectionError as error:
            if str(error) == DEMOTED:
                self.connection_pool.announced = None
            raise


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    pass


class AsyncFollowingSSLConnection(AsyncFollowingConnection, AsyncSSLConnection):
    pass


class AsyncBlockingSentinelPool(AsyncSentinelPool, AsyncBlockingPool):
    """A Sentinel pool that waits for a free connection past `max_connections` (as
    `BlockingConnectionPool` does) instead of refusing the call."""


class SwitchWatcher:
    """Records each `+switch-master` of `service` on `pools` (see the module doc). `close()` stops it."""

    def __init__(
        self,
        sentinels: Iterable[tuple[str, int]],
        service: str,
        sentinel_kwargs: dict[str, Any],
    ) -> None:
        self.sentinels = list(sentinels)
        self.service = service
        self.kwargs = {
            "socket_timeout": 2.0,
            "socket_connect_timeout": 2.0,
            **sentinel_kwargs,
            "decode_responses": True,
        }
        self.pools: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, name="toolloop-sentinel-watch", daemon=True
        )
        self._thread.start()

    def watch(self, pool: Any) -> None:
        self.pools.append(pool)

    def close(self) -> None:
        self._stop.set()

    def _listen(self) -> None:
        turn = 0
        while not self._stop.is_set():
            host, port = self.sentinels[turn % len(self.sentinels)]
            turn += 1
            try:
                self._follow(redis.Redis(host=host, port=port, **self.kwargs))
            except (redis.RedisError, OSError) as error:
                log.debug(
                    "sentinel %s:%s lost (%s); listening on the next", host, port, error
                )
                self._stop.wait(0.2)

    def _follow(self, client: redis.Redis) -> None:
        pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(SWITCH)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._switched(str(message.get("data", "")))
        finally:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()
            client.close()

    def _switched(self, data: str) -> None:
        # "<service> <old ip> <old port> <new ip> <new port>"
        parts = data.split()
        if len(parts) != 5 or parts[0] != self.service:
            return
        announced = (parts[3], int(parts[4]))
        log.warning(
            "Redis primary of %s moved to %s:%s (sentinel +switch-master)",
            self.service,
            *announced,
        )
        for pool in self.pools:
            # a sync pool keeps its sentinel state on a proxy
            holder = getattr(pool, "proxy", pool)
            holder.announced = announced
            holder.master_address = (
                announced  # its connections there are its own (`owns_connection`)
            )
