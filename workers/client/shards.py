"""`ShardedClient`: one client over N independent toolloop shards (each a Redis of its own, with its own
workers, sweeper and Flower), each run on exactly one of them, chosen when it is enqueued.

The shard is part of the run id: a run enqueued on shard k (k > 0) has the id `s<k>-<32 hex>`, and an
id without that prefix is shard 0's (so the runs of a deployment that had one Redis stay where they
are when it becomes shard 0). Every operation that takes a run id goes to that shard, and adding a
shard at the end of the list moves no run. The shard of a new run: for an idempotency key,
`crc32(key) % N` (the same key goes to the same shard while N is unchanged: a keyed retry finds its
run; after a shard is added, a retry of a key first sent before may start its run on another shard:
add shards when no keyed enqueue is being retried); without a key, the next shard in turn, from a
random first one (a process that enqueues one run, as `toolloop run` does, picks any shard).

`list_runs` merges the shards' pages, newest first: a cursor is a position in time (`created|run id`),
valid on every shard. Accounts and rate limits are per shard (each shard's Redis holds its own:
`set_account_limit` sets the limit on every shard, so an account may spend it once per shard;
`accounts()` lists each shard's rows with the shard's index), or global when every worker and client
has TOOLLOOP_FLOW_REDIS_URL naming one Redis for them (their scripts touch no run key: an account's
limit holds across the shards, and one (key, model) rate limit is shared by all their workers).
A schedule lives on one shard, named by its id's prefix as a run's is (`s<k>-sched-...`), and its
runs start there: a follow-up schedule on its run's shard, an enqueueing one placed as a run is (by
its idempotency key, else in turn); `list_schedules` lists every shard's. `AsyncShardedClient` is
the same over one `AsyncClient` per shard, for asyncio backends. docs/operations.md, "The ceiling
of one Redis".
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import re
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from workers.client import accounts, runlist
from workers.client.aio import AsyncClient
from workers.client.sync import Client
from workers.client.talk import Sent
from workers.protocol.records import DecisionState, RunEventRecord, RunStatus
from workers.protocol.schedules import ScheduleInfo
from workers.protocol.spec import RunSpec

ENV = "TOOLLOOP_REDIS_SHARDS"
_PREFIX = re.compile(r"^s(\d{1,3})-")
_SPLIT = re.compile(r",(?=\s*[a-z][a-z0-9+.-]*://)")


def parse_shards(text: str) -> list[str]:
    """The shard URLs of `TOOLLOOP_REDIS_SHARDS` ("redis://a,redis://b"; a Sentinel URL's own host
    list stays whole: a comma splits only before a scheme)."""
    urls = [url.strip() for url in _SPLIT.split(text) if url.strip()]
    if len(urls) > 1000:
        raise ValueError(f"{ENV} names {len(urls)} shards.\n  Name at most 1000.")
    return urls


def shard_of(run_id: str, shards: int) -> int:
    """The shard index a run id names (no prefix: 0); ValueError when it names a shard not listed."""
    found = _PREFIX.match(run_id)
    index = int(found.group(1)) if found else 0
    if index >= shards:
        raise ValueError(
            f"Run {run_id!r} lives on shard {index}, and {shards} shards are listed.\n"
            f"  List every shard in {ENV} (or shards=[...]), in the order they were added."
        )
    return index


def prefix(index: int) -> str:
    """The run-id prefix of shard `index` ("" for shard 0)."""
    return f"s{index}-" if index else ""


def shard_urls(shards: Sequence[str] | None) -> list[str]:
    """`shards`, or TOOLLOOP_REDIS_SHARDS's; ValueError when there is none."""
    urls = list(shards) if shards is not None else parse_shards(os.environ.get(ENV, ""))
    if not urls:
        raise ValueError(
            f"No shards: {ENV} is empty.\n  Set {ENV}=redis://a,redis://b or pass shards=[...]."
        )
    return urls


class Placer:
    """Where a new run goes: the next shard in turn, or `crc32(key) % N` for an idempotency key."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        # a process that enqueues once (the CLI) lands on any shard
        start = random.randrange(shards)
        self._turn: Iterator[int] = itertools.cycle(
            [*range(start, shards), *range(start)]
        )

    def __call__(self, idempotency_key: str | None) -> int:
        if idempotency_key is None:
            return next(self._turn)
        return zlib.crc32(idempotency_key.encode()) % self.shards

    def split(
        self, specs: Sequence[Any], idempotency_keys: Sequence[str | None] | None
    ) -> list[tuple[int, list[int], list[Any], list[str | None] | None]]:
        """Each shard's part of a batch: (shard, places in the batch, its specs, its keys or None)."""
        keys = (
            list(idempotency_keys)
            if idempotency_keys is not None
            else [None] * len(specs)
        )
        if len(keys) != len(specs):
            raise ValueError(
                f"{len(specs)} specs and {len(keys)} idempotency keys.\n  Give one key (or None) per spec."
            )
        placed: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            placed.setdefault(self(key), []).append(i)
        return [
            (
                shard,
                places,
                [specs[i] for i in places],
                None if idempotency_keys is None else [keys[i] for i in places],
            )
            for shard, places in placed.items()
        ]


def in_order(count: int, made: list[tuple[list[int], list[str]]]) -> list[str]:
    """The run ids of a split batch back in the batch's order."""
    ids = [""] * count
    for places, run_ids in made:
        for i, run_id in zip(places, run_ids, strict=True):
            ids[i] = run_id
    return ids


def merged(pages: list[runlist.RunPage], limit: int) -> runlist.RunPage:
    """The shards' pages as one, newest first, `limit` runs; its `next` resumes on every shard."""
    runs = list(
        itertools.islice(
            heapq.merge(
                *(p.runs for p in pages),
                key=lambda r: (r.created_at, r.run_id),
                reverse=True,
            ),
            limit + 1,
        )
    )
    more = len(runs) > limit or any(p.next is not None for p in pages)
    runs = runs[:limit]
    if not runs or not more:
        return runlist.RunPage(runs, None)
    return runlist.RunPage(
        runs, runlist.cursor_at(runs[-1].created_at, runs[-1].run_id)
    )


class ShardedClient:
    def __init__(
        self,
        shards: Sequence[str] | None = None,
        *,
        toolsets: Iterable[str] | None = None,
    ) -> None:
        """`shards`: the shards' Redis URLs, in the order they were added (default: TOOLLOOP_REDIS_SHARDS)."""
        urls = shard_urls(shards)
        names = None if toolsets is None else list(toolsets)
        self.clients = [
            Client(url, toolsets=names, run_prefix=prefix(i))
            for i, url in enumerate(urls)
        ]
        self._place = Placer(len(urls))

    def shard(self, run_id: str) -> Client:
        """The client of the shard the run lives on."""
        return self.clients[shard_of(run_id, len(self.clients))]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start ------------------------------------------------------------------------------------

    def enqueue(
        self, spec: RunSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> str:
        """`Client.enqueue` on the run's shard (module doc); the run id names the shard."""
        return self.clients[self._place(idempotency_key)].enqueue(
            spec, idempotency_key=idempotency_key
        )

    def enqueue_many(
        self,
        specs: Sequence[RunSpec | dict[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[str]:
        """`Client.enqueue_many`, one round trip per shard that gets runs: the run ids, in order."""
        made = [
            (places, self.clients[shard].enqueue_many(part, idempotency_keys=keys))
            for shard, places, part, keys in self._place.split(specs, idempotency_keys)
        ]
        return in_order(len(specs), made)

    # -- one run: its shard -----------------------------------------------------------------------

    def status(self, run_id: str) -> RunStatus:
        return self.shard(run_id).status(run_id)

    def history(self, run_id: str) -> list[Any]:
        return self.shard(run_id).history(run_id)

    def images(self, run_id: str) -> list[Any]:
        return self.shard(run_id).images(run_id)

    def events(
        self, run_id: str, *args: Any, **kwargs: Any
    ) -> Iterator[RunEventRecord]:
        return self.shard(run_id).events(run_id, *args, **kwargs)

    def wait(
        self, run_id: str, timeout: float = 60.0, *, poll_s: float = 0.05
    ) -> RunStatus:
        return self.shard(run_id).wait(run_id, timeout, poll_s=poll_s)

    def answer(self, run_id: str, content: str, *, segment: int | None = None) -> str:
        return self.shard(run_id).answer(run_id, content, segment=segment)

    def send(self, run_id: str, content: str, **options: Any) -> Sent:
        """`Client.send` on the run's shard (its keyed sends are kept there too)."""
        return self.shard(run_id).send(run_id, content, **options)

    def steer(self, run_id: str, content: str, **options: Any) -> str:
        return self.shard(run_id).steer(run_id, content, **options)

    def interrupt(self, run_id: str) -> None:
        self.shard(run_id).interrupt(run_id)

    def approve(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self.shard(run_id).approve(run_id, *args, **kwargs)

    def reject(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self.shard(run_id).reject(run_id, *args, **kwargs)

    def edit(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return self.shard(run_id).edit(run_id, *args, **kwargs)

    def decision(self, run_id: str, call_id: str) -> DecisionState:
        return self.shard(run_id).decision(run_id, call_id)

    def decisions(self, run_id: str) -> dict[str, DecisionState]:
        return self.shard(run_id).decisions(run_id)

    def cancel(self, run_id: str) -> None:
        self.shard(run_id).cancel(run_id)

    def tree(self, run_id: str, *, most: int = 1000) -> list[Any]:
        # a child's id begins with its parent's: one shard
        return self.shard(run_id).tree(run_id, most=most)

    def retry(self, run_id: str) -> None:
        self.shard(run_id).retry(run_id)

    def add_spend(self, run_id: str, usd: float) -> float:
        return self.shard(run_id).add_spend(run_id, usd)

    # -- schedules: one shard each ----------------------------------------------------------------

    def schedule(self, spec: Any = None, **kwargs: Any) -> str:
        """`Client.schedule` on the shard of its target run (`send_to`), else placed as a run is."""
        target = kwargs.get("send_to")
        client = (
            self.shard(target)
            if target
            else self.clients[self._place(kwargs.get("idempotency_key"))]
        )
        return client.schedule(spec, **kwargs)

    def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        return self.shard(schedule_id).get_schedule(schedule_id)

    def remove_schedule(self, schedule_id: str) -> None:
        self.shard(schedule_id).remove_schedule(schedule_id)

    def list_schedules(self, *, limit: int = 1000) -> list[ScheduleInfo]:
        """Every shard's schedules, newest first (at most `limit`)."""
        found = [s for c in self.clients for s in c.list_schedules(limit=limit)]
        return sorted(found, key=lambda s: s.created, reverse=True)[:limit]

    # -- every shard ------------------------------------------------------------------------------

    def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> runlist.RunPage:
        """Runs of every shard, newest first, `limit` per page; `next` resumes on every shard."""
        return merged(
            [
                c.list_runs(status=status, limit=limit, cursor=cursor)
                for c in self.clients
            ],
            limit,
        )

    def prune(self, older_than: float | None = None) -> list[runlist.Pruned]:
        """`Client.prune` on every shard, in shard order."""
        return [client.prune(older_than) for client in self.clients]

    @property
    def global_accounts(self) -> bool:
        """True when TOOLLOOP_FLOW_REDIS_URL puts every shard's accounts and rate limits in one Redis."""
        return bool(self.clients[0].settings.flow_redis_url)

    def set_account_limit(
        self, account: str, usd: float, *, period: str = "day", finish_at: float = 0.9
    ) -> None:
        """The limit once, global (TOOLLOOP_FLOW_REDIS_URL), else on every shard (the module doc)."""
        for client in self.clients[:1] if self.global_accounts else self.clients:
            client.set_account_limit(account, usd, period=period, finish_at=finish_at)

    def accounts(self) -> list[tuple[int | None, accounts.AccountSpend]]:
        """(shard index, row) for every account of every shard; (None, row) once per account when
        they are global (TOOLLOOP_FLOW_REDIS_URL)."""
        if self.global_accounts:
            return [(None, row) for row in self.clients[0].accounts()]
        return [
            (i, row)
            for i, client in enumerate(self.clients)
            for row in client.accounts()
        ]


class AsyncShardedClient:
    """`ShardedClient` for asyncio backends: the same routing over one `AsyncClient` per shard."""

    def __init__(
        self,
        shards: Sequence[str] | None = None,
        *,
        toolsets: Iterable[str] | None = None,
    ) -> None:
        urls = shard_urls(shards)
        names = None if toolsets is None else list(toolsets)
        self.clients = [
            AsyncClient(url, toolsets=names, run_prefix=prefix(i))
            for i, url in enumerate(urls)
        ]
        self._place = Placer(len(urls))

    def shard(self, run_id: str) -> AsyncClient:
        return self.clients[shard_of(run_id, len(self.clients))]

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> AsyncShardedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def enqueue(
        self, spec: RunSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> str:
        return await self.clients[self._place(idempotency_key)].enqueue(
            spec, idempotency_key=idempotency_key
        )

    async def enqueue_many(
        self,
        specs: Sequence[RunSpec | dict[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[str]:
        made = [
            (
                places,
                await self.clients[shard].enqueue_many(part, idempotency_keys=keys),
            )
            for shard, places, part, keys in self._place.split(specs, idempotency_keys)
        ]
        return in_order(len(specs), made)

    async def status(self, run_id: str) -> RunStatus:
        return await self.shard(run_id).status(run_id)

    async def history(self, run_id: str) -> list[Any]:
        return await self.shard(run_id).history(run_id)

    async def images(self, run_id: str) -> list[Any]:
        return await self.shard(run_id).images(run_id)

    def events(
        self, run_id: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[RunEventRecord]:
        return self.shard(run_id).events(run_id, *args, **kwargs)

    async def wait(
        self, run_id: str, timeout: float = 60.0, *, poll_s: float = 0.05
    ) -> RunStatus:
        return await self.shard(run_id).wait(run_id, timeout, poll_s=poll_s)

    async def answer(
        self, run_id: str, content: str, *, segment: int | None = None
    ) -> str:
        return await self.shard(run_id).answer(run_id, content, segment=segment)

    async def send(self, run_id: str, content: str, **options: Any) -> Sent:
        """`AsyncClient.send` on the run's shard."""
        return await self.shard(run_id).send(run_id, content, **options)

    async def steer(self, run_id: str, content: str, **options: Any) -> str:
        return await self.shard(run_id).steer(run_id, content, **options)

    async def interrupt(self, run_id: str) -> None:
        await self.shard(run_id).interrupt(run_id)

    async def approve(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.shard(run_id).approve(run_id, *args, **kwargs)

    async def reject(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.shard(run_id).reject(run_id, *args, **kwargs)

    async def edit(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        return await self.shard(run_id).edit(run_id, *args, **kwargs)

    async def decision(self, run_id: str, call_id: str) -> DecisionState:
        return await self.shard(run_id).decision(run_id, call_id)

    async def cancel(self, run_id: str) -> None:
        await self.shard(run_id).cancel(run_id)

    async def tree(self, run_id: str, *, most: int = 1000) -> list[Any]:
        return await self.shard(run_id).tree(run_id, most=most)

    async def retry(self, run_id: str) -> None:
        await self.shard(run_id).retry(run_id)

    async def add_spend(self, run_id: str, usd: float) -> float:
        return await self.shard(run_id).add_spend(run_id, usd)

    async def schedule(self, spec: Any = None, **kwargs: Any) -> str:
        target = kwargs.get("send_to")
        client = (
            self.shard(target)
            if target
            else self.clients[self._place(kwargs.get("idempotency_key"))]
        )
        return await client.schedule(spec, **kwargs)

    async def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        return await self.shard(schedule_id).get_schedule(schedule_id)

    async def remove_schedule(self, schedule_id: str) -> None:
        await self.shard(schedule_id).remove_schedule(schedule_id)

    async def list_schedules(self, *, limit: int = 1000) -> list[ScheduleInfo]:
        found = [s for c in self.clients for s in await c.list_schedules(limit=limit)]
        return sorted(found, key=lambda s: s.created, reverse=True)[:limit]

    async def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> runlist.RunPage:
        pages = [
            await c.list_runs(status=status, limit=limit, cursor=cursor)
            for c in self.clients
        ]
        return merged(pages, limit)
