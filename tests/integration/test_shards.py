"""Sharded runs (workers/client/shards.py) on two real Redis servers, each with a real worker: 200 runs
through one `ShardedClient` land each on exactly one shard, `list_runs` pages through all 200 once,
newest first, every call by run id reaches the run's shard, and a keyed retry returns the same run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Worker, own_redis, worker_on
from tests.integration.runs_kit import spec
from toolloop.embedded import EmbeddedServer
from workers.client.shards import (
    AsyncShardedClient,
    ShardedClient,
    parse_shards,
    shard_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedServer]]:
    first, second = (
        own_redis(tmp_path_factory, "shard-0"),
        own_redis(tmp_path_factory, "shard-1"),
    )
    yield [next(first), next(second)]
    for server in (first, second):
        next(server, None)


@pytest.fixture(scope="module")
def workers(
    shards: list[EmbeddedServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    made = [
        worker_on(s.url, Path(tmp_path_factory.mktemp(f"shard-worker-{i}")), env)
        for i, s in enumerate(shards)
    ]
    yield [next(w) for w in made]
    for w in made:
        next(w, None)


def test_two_hundred_runs_each_live_on_one_shard_and_list_once_newest_first(
    shards: list[EmbeddedServer], workers: list[Worker]
) -> None:
    with ShardedClient([s.url for s in shards]) as client:
        made = []
        for i in range(200):
            made.append(client.enqueue(spec("tools", f"Add {i} and 1.")))
            # distinct creation times: "newest first" is then one order
            time.sleep(0.001)
        assert len(set(made)) == 200
        placed = [shard_of(run_id, 2) for run_id in made]
        assert placed.count(0) == placed.count(1) == 100
        for run_id, index in zip(made, placed, strict=True):
            keys_here = [_keys(s, run_id) for s in shards]
            assert keys_here[index] and not keys_here[1 - index], (run_id, keys_here)
        listed: list[str] = []
        cursor = None
        while True:
            page = client.list_runs(limit=30, cursor=cursor)
            listed += [run.run_id for run in page.runs]
            if page.next is None:
                break
            cursor = page.next
        assert listed == list(reversed(made))
        for run_id in made[:20] + made[-20:]:
            assert client.wait(run_id, timeout=60).status == "done"
            assert client.history(run_id)[-1].role == "assistant"


def test_a_keyed_enqueue_returns_the_same_run_and_a_foreign_shard_is_refused(
    shards: list[EmbeddedServer],
) -> None:
    with ShardedClient([s.url for s in shards]) as client:
        first = client.enqueue(
            spec("tools", "Add 2 and 3."), idempotency_key="order-shard-1"
        )
        again = client.enqueue(
            spec("tools", "Add 2 and 3."), idempotency_key="order-shard-1"
        )
        assert first == again
        assert client.status(first).run_id == first
        batch = client.enqueue_many(
            [spec("tools", "Add 1 and 1.")] * 4,
            idempotency_keys=["k1", "k2", "order-shard-1", None],
        )
        assert batch[2] == first and len(set(batch)) == 4
    with pytest.raises(ValueError, match="lives on shard 1, and 1 shards are listed"):
        shard_of("s1-" + "0" * 32, 1)


def test_shard_urls_split_only_before_a_scheme() -> None:
    assert parse_shards("redis://a:1/0, rediss://b:2/0") == [
        "redis://a:1/0",
        "rediss://b:2/0",
    ]
    assert parse_shards("redis+sentinel://h1:1,h2:2/svc,redis://c/0") == [
        "redis+sentinel://h1:1,h2:2/svc",
        "redis://c/0",
    ]


def _keys(server: EmbeddedServer, run_id: str) -> list[bytes]:
    client = redis.Redis.from_url(server.url)
    try:
        return list(client.scan_iter(match=f"*{run_id}*", count=1000))
    finally:
        client.close()


async def test_the_async_sharded_client_routes_and_lists_as_the_sync_one(
    shards: list[EmbeddedServer], workers: list[Worker]
) -> None:
    async with AsyncShardedClient([s.url for s in shards]) as client:
        made = [
            await client.enqueue(spec("tools", f"Add {i} and 2.")) for i in range(10)
        ]
        assert sorted(shard_of(r, 2) for r in made) == [0] * 5 + [1] * 5
        keyed = await client.enqueue_many(
            [spec("tools", "Add 1 and 1.")] * 2, idempotency_keys=["a1", "a1"]
        )
        assert keyed[0] == keyed[1]
        for run_id in made:
            assert (await client.wait(run_id, timeout=60)).status == "done"
        listed = [run.run_id for run in (await client.list_runs(limit=1000)).runs]
        assert set(made) <= set(listed) and len(listed) == len(set(listed))
        events = [e.kind async for e in client.events(made[-1])]
        assert events[-1] == "finished"


def test_follow_ups_steers_and_interrupts_reach_the_runs_shard(
    shards: list[EmbeddedServer], workers: list[Worker]
) -> None:
    from workers.protocol.errors import RunStateError

    with ShardedClient([s.url for s in shards]) as client:
        made = [client.enqueue(spec("tools", f"Add {i} and 5.")) for i in range(4)]
        assert sorted(shard_of(r, 2) for r in made) == [0, 0, 1, 1]
        for run_id in made:
            assert client.wait(run_id, timeout=60).status == "done"
            sent = client.send(run_id, "Add 1 and 1.", idempotency_key=f"more-{run_id}")
            assert (sent.run_id, sent.what, sent.segment) == (run_id, "continued", 1)
            assert (
                client.send(run_id, "Add 1 and 1.", idempotency_key=f"more-{run_id}")
                == sent
            )
        for run_id in made:
            status = client.wait(run_id, timeout=60)
            assert (status.status, status.segment) == ("done", 1)
            with pytest.raises(RunStateError, match="has ended \\(done\\)"):
                client.steer(run_id, "too late")
            with pytest.raises(
                RunStateError, match="only a queued or running run can be interrupted"
            ):
                client.interrupt(run_id)


async def test_the_async_sharded_client_sends_follow_ups_to_the_runs_shard(
    shards: list[EmbeddedServer], workers: list[Worker]
) -> None:
    async with AsyncShardedClient([s.url for s in shards]) as client:
        made = [
            await client.enqueue(spec("tools", f"Add {i} and 6.")) for i in range(2)
        ]
        for run_id in made:
            assert (await client.wait(run_id, timeout=60)).status == "done"
            sent = await client.send(run_id, "Add 2 and 2.", add_max_steps=2)
            assert (sent.what, sent.segment) == ("continued", 1)
            assert (await client.wait(run_id, timeout=60)).segment == 1
