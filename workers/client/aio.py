"""`AsyncClient`: `Client` for asyncio web backends (FastAPI, Starlette), on redis.asyncio.

    client = AsyncClient()                 # REDIS_URL and TOOLLOOP_TOOLSETS, as Client
    run_id = await client.enqueue(spec, idempotency_key="order-1234")
    async for event in client.events(run_id, follow=True):
        print(event.seq, event.kind)
    await client.aclose()

The same methods, arguments, errors and guarantees as `Client` (workers/client/sync.py): both run the
operations of workers/client/ops.py, one with redis-py's blocking client, this one awaited, so no method
holds a thread and a followed event stream is an `async for`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime
from typing import Any

from toolloop import redisurl
from toolloop.contract import ChatMessage
from toolloop.loop.types import Decision
from workers.client import enqueue, ops, runlist, schedules, talk
from workers.client.drive import AsyncDriver
from workers.client.limits import check_answer, check_decision
from workers.client.sync import settings_for
from workers.protocol.records import DecisionState, RunEventRecord, RunNode, RunStatus
from workers.protocol.schedules import ScheduleInfo
from workers.protocol.spec import RunSpec


class AsyncClient:
    def __init__(
        self,
        redis_url: str | None = None,
        *,
        toolsets: Iterable[str] | None = None,
        max_streams: int = 1000,
        run_prefix: str = "",
    ) -> None:
        """As `Client(redis_url, toolsets=..., run_prefix=...)`; no connection is made until the first
        call. `max_streams`: event streams read at once (each blocked read holds a connection of its own)."""
        self.settings = settings = settings_for(redis_url)
        self.toolsets = sorted(
            settings.toolset_names() if toolsets is None else toolsets
        )
        self._watcher = redisurl.watcher(settings.redis_url)
        self.redis = redisurl.async_client(
            settings.redis_url, decode_responses=True, watcher=self._watcher
        )
        self._blocking = redisurl.async_client(
            settings.redis_url,
            decode_responses=True,
            socket_timeout=None,
            watcher=self._watcher,
        )
        wait = (settings.commit_wait, settings.commit_wait_ms)
        self._driver = AsyncDriver(self.redis, self._blocking, wait=wait)
        # Followed event streams block on a pool of their own (a connection per XREAD BLOCK, up to
        # `max_streams`, then a stream waits for one): many open streams never take the connections
        # the commands and a decision's BLPOP need (redis.asyncio's pools refuse past 100).
        self._streams = redisurl.async_client(
            settings.redis_url,
            watcher=self._watcher,
            blocking_pool=max_streams,
            decode_responses=True,
            socket_timeout=None,
        )
        self._streamer = AsyncDriver(self.redis, self._streams)
        self._sender = ops.Sender(
            int(self.redis.connection_pool.connection_kwargs.get("db", 0))
        )
        self._prepare = enqueue.Preparer(
            settings, self.toolsets, self._sender, run_prefix=run_prefix
        )
        self.catalog = self._prepare.catalog
        """The model catalogue in force (TOOLLOOP_MODELS laid over the built-in rows), read once."""

    async def aclose(self) -> None:
        """Release the Redis connections."""
        await self.redis.aclose()
        await self._blocking.aclose()
        await self._streams.aclose()
        await self._streams.connection_pool.disconnect()
        if self._watcher is not None:
            self._watcher.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def enqueue(
        self, spec: RunSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> str:
        """See `Client.enqueue`: checked here, stored and sent in one round trip."""
        made = self._prepare(spec, idempotency_key)
        try:
            await self._driver.do(made.request)
        except enqueue.REDIS_ERRORS as error:
            raise enqueue.failure(error, idempotency_key is not None) from None
        return made.run_id

    async def enqueue_many(
        self,
        specs: Sequence[RunSpec | dict[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[str]:
        """See `Client.enqueue_many`: one round trip per batch."""
        made = enqueue.prepare_all(self._prepare, specs, idempotency_keys)
        try:
            replies = await self._driver.batch(ops.Pipeline([m.request for m in made]))
        except enqueue.REDIS_ERRORS as error:
            raise enqueue.failure(error, idempotency_keys is not None) from None
        return enqueue.batch_result(made, replies, idempotency_keys is not None)

    async def schedule(
        self,
        spec: RunSpec | dict[str, Any] | None = None,
        *,
        cron: str | None = None,
        every_s: float | None = None,
        at: float | datetime | None = None,
        timezone: str = "UTC",
        start: float | None = None,
        send_to: str | None = None,
        content: str | None = None,
        if_busy: str = "skip",
        catch_up: str = "latest",
        grace_s: float = 60.0,
        name: str = "",
        idempotency_key: str | None = None,
        add_budget_usd: float = 0.0,
        add_max_steps: int = 0,
    ) -> str:
        """See `Client.schedule`."""
        request = schedules.Request(
            spec,
            cron,
            every_s,
            at,
            timezone,
            start,
            send_to,
            content,
            if_busy,
            catch_up,
            grace_s,
            name,
            idempotency_key,
            add_budget_usd,
            add_max_steps,
        )
        made, first = schedules.build(request, self._prepare)
        return await self._driver.run(schedules.add(made, first, send_to))

    async def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        """See `Client.get_schedule`."""
        return await self._driver.run(schedules.get(schedule_id))

    async def list_schedules(self, *, limit: int = 1000) -> list[ScheduleInfo]:
        """See `Client.list_schedules`."""
        return await self._driver.run(schedules.listing(limit))

    async def remove_schedule(self, schedule_id: str) -> None:
        """See `Client.remove_schedule`."""
        await self._driver.run(schedules.remove(schedule_id))

    async def status(self, run_id: str) -> RunStatus:
        return await self._driver.run(ops.status(run_id))

    async def history(self, run_id: str) -> list[ChatMessage]:
        """See `Client.history`."""
        return await self._driver.run(ops.history(run_id))

    async def images(self, run_id: str) -> list[ops.RunImage]:
        """The images of the run's conversation, each with `supplied` (the run's spec gave it) or not
        (a tool result produced it): what a viewer may serve (examples/web.py)."""
        return await self._driver.run(ops.images(run_id))

    def events(
        self,
        run_id: str,
        after: str | None = None,
        block_ms: int | None = None,
        follow: bool = False,
        *,
        deltas: bool = True,
    ) -> AsyncIterator[RunEventRecord]:
        """See `Client.events`; iterate it with `async for` (blocking reads are awaited)."""
        return self._streamer.stream(
            ops.events(run_id, after, block_ms, follow, deltas)
        )

    async def wait(
        self, run_id: str, timeout: float = 60.0, *, poll_s: float = 0.05
    ) -> RunStatus:
        """See `Client.wait`."""
        return await self._driver.run(ops.wait(run_id, timeout, poll_s))

    async def answer(
        self, run_id: str, content: str, *, segment: int | None = None
    ) -> str:
        """See `Client.answer`."""
        check_answer(content, self.settings)
        return await self._driver.run(
            ops.answer(self._sender, run_id, content, segment)
        )

    async def send(
        self,
        run_id: str,
        content: str,
        *,
        idempotency_key: str | None = None,
        add_budget_usd: float = 0.0,
        add_max_steps: int = 0,
    ) -> talk.Sent:
        """See `Client.send`."""
        talk.check_content(content, self.settings.max_answer_bytes, "follow-up")
        op = talk.send(
            self._sender,
            run_id,
            content,
            idempotency_key=idempotency_key,
            add_budget_usd=add_budget_usd,
            add_max_steps=add_max_steps,
        )
        return await self._driver.run(op)

    async def steer(
        self, run_id: str, content: str, *, steer_id: str | None = None
    ) -> str:
        """See `Client.steer`."""
        talk.check_content(content, self.settings.max_answer_bytes, "steer")
        return await self._driver.run(talk.steer(run_id, content, steer_id))

    async def interrupt(self, run_id: str) -> None:
        """See `Client.interrupt`."""
        await self._driver.run(talk.interrupt(run_id))

    async def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """See `Client.approve`."""
        decision = Decision(action="approve", input_digest=digest, actor=actor)
        return await self.decide(run_id, call_id, decision, wait_s)

    async def reject(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """See `Client.reject`."""
        decision = Decision(
            action="reject", reason=reason, input_digest=digest, actor=actor
        )
        return await self.decide(run_id, call_id, decision, wait_s)

    async def edit(
        self,
        run_id: str,
        call_id: str,
        input: dict[str, Any],
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """See `Client.edit`."""
        decision = Decision(
            action="edit", input=input, input_digest=digest, actor=actor
        )
        return await self.decide(run_id, call_id, decision, wait_s)

    async def decide(
        self, run_id: str, call_id: str, decision: Decision, wait_s: float = 10.0
    ) -> str:
        """See `Client.decide`: the wait for the worker's outcome is an awaited BLPOP."""
        check_decision(call_id, decision, self.settings)
        waiting = self.settings.max_early_decisions
        return await self._driver.run(
            ops.decide(self._sender, run_id, call_id, decision, wait_s, waiting)
        )

    async def decision(self, run_id: str, call_id: str) -> DecisionState:
        """See `Client.decision`."""
        return await self._driver.run(ops.decision(run_id, call_id))

    async def decisions(self, run_id: str) -> dict[str, DecisionState]:
        """See `Client.decisions`."""
        return await self._driver.run(ops.decisions(run_id))

    async def cancel(self, run_id: str) -> None:
        """See `Client.cancel`."""
        await self._driver.run(ops.cancel(self._sender, run_id))

    async def tree(self, run_id: str, *, most: int = 1000) -> list[RunNode]:
        """See `Client.tree`."""
        return await self._driver.run(ops.tree(run_id, most))

    async def retry(self, run_id: str) -> None:
        """See `Client.retry`."""
        await self._driver.run(ops.retry(self._sender, run_id))

    async def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> runlist.RunPage:
        """See `Client.list_runs`."""
        return await self._driver.run(
            runlist.page(status=status, limit=limit, cursor=cursor)
        )

    async def add_spend(self, run_id: str, usd: float) -> float:
        """See `Client.add_spend`."""
        return await self._driver.run(ops.add_spend(run_id, usd))
