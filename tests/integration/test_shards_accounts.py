"""Global accounts across shards (TOOLLOOP_FLOW_REDIS_URL): two shards, each a real Redis with a real
worker, and a third Redis for the accounts and rate limits of both, named by every worker and by the
sharded client. A run on shard 0 spends the account's limit; a run on shard 1 on the same account
then stops `budget` before its first model call: the limit holds across the shards, the account is
one row, and the shards' own Redis hold no account key (docs/operations.md, "The ceiling of one
Redis"). The model is the provider simulator over HTTP (claude-haiku-4-5, ~$0.02 a call)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Worker, own_redis, sim_env
from tests.integration.runs_kit import spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client.shards import ShardedClient, shard_of

pytestmark = pytest.mark.integration

CALL = {
    "text": "More.",
    "tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}],
    "usage": {"output_tokens": 4000},
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedServer]]:
    made = [
        own_redis(tmp_path_factory, name)
        for name in ("acct-shard-0", "acct-shard-1", "acct-flow")
    ]
    yield [next(m) for m in made]
    for m in made:
        next(m, None)


def key_on(shard: int) -> str:
    return next(
        f"k{i}" for i in range(100) if zlib.crc32(f"k{i}".encode()) % 2 == shard
    )


def test_an_account_limit_holds_across_shards_with_one_flow_redis(
    servers: list[EmbeddedServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    *shards, flow = servers
    monkeypatch.setenv("TOOLLOOP_FLOW_REDIS_URL", flow.url)
    with SimServer([CALL] * 40) as sim:
        env = sim_env(sim, TOOLLOOP_FLOW_REDIS_URL=flow.url)
        workers = [
            Worker(s.url, tmp_path / f"worker-{i}.log", env, concurrency=4).wait_ready()
            for i, s in enumerate(shards)
        ]
        client = ShardedClient([s.url for s in shards])
        try:
            assert client.global_accounts
            client.set_account_limit("team", 0.05, period="total", finish_at=1.0)
            run = spec(
                "You add.",
                model="claude-haiku-4-5",
                provider="anthropic",
                max_steps=40,
                account="team",
            )
            first = client.enqueue(run, idempotency_key=key_on(0))
            spent = client.wait(first, timeout=60)
            second = client.enqueue(run, idempotency_key=key_on(1))
            stopped = client.wait(second, timeout=60)
            rows = client.accounts()
        finally:
            client.close()
            for worker in workers:
                worker.stop()
    assert (shard_of(first, 2), shard_of(second, 2)) == (0, 1)
    assert (
        spent.status == "budget"
        and spent.account_stop
        and spent.account_stop["name"] == "team"
    )
    # an estimate is a ceiling: it stops early
    assert 0 < spent.spent_usd <= 0.05 and spent.steps >= 1, spent
    assert (
        stopped.status == "budget"
        and stopped.account_stop
        and stopped.account_stop["name"] == "team"
    )
    # not one model call on shard 1
    assert stopped.spent_usd == 0 and stopped.steps == 0, stopped
    [(where, row)] = rows
    assert (
        where is None
        and row.name == "team"
        and row.spent_usd == pytest.approx(spent.spent_usd)
    )
    for server in shards:  # the shards keep no account of their own
        plain = redis.Redis.from_url(server.url)
        assert list(plain.scan_iter(match="tl:acct:*")) == []
        plain.close()
