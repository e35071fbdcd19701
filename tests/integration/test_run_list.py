"""Listing runs, retention and prune on a real Redis with a real worker: finished runs expire after
TOOLLOOP_RETENTION (8 s here: long enough for two CLI calls on a loaded machine) while a parked run
stays, runs that end `expired` and every run's decisions included; `Client.list_runs` and
`toolloop list` page through 10,000 runs newest first within 3x of the same reads done bare;
`toolloop prune` deletes finished runs that have no expiry and drops expired ones from the index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Worker, own_redis, worker_on
from tests.integration.runs_kit import eventually, spec
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.errors import RunNotFoundError, RunStateError

pytestmark = pytest.mark.integration

TOOLLOOP = str(Path(sys.executable).with_name("toolloop"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "list-redis")


@pytest.fixture(scope="module")
def worker(
    server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    env = {
        "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
        "TOOLLOOP_RETENTION": "8s",
    }
    yield from worker_on(server.url, tmp_path_factory.mktemp("list-worker"), env)


def _cli(server: EmbeddedServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": server.url}
    return subprocess.run(
        [TOOLLOOP, *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_finished_runs_expire_after_the_retention_and_parked_ones_stay(
    server: EmbeddedServer, worker: Worker
) -> None:
    with Client(server.url) as client:
        done = client.enqueue(spec("tools", "Add 2 and 3."))
        parked = client.enqueue(spec("ask"))
        assert client.wait(done, timeout=30).status == "done"
        assert client.wait(parked, timeout=30).status == "asked"
        listed = [run.run_id for run in client.list_runs().runs]
        assert listed[:2] == [parked, done]  # newest first
        assert 0 < client.redis.ttl(keys.state(done)) <= 8
        assert client.redis.ttl(keys.state(parked)) == -1  # parked: never expires
        with pytest.raises(RunStateError, match="has ended"):
            client.cancel(done)
        # an ended run takes no answer
        ended = _cli(server, "answer", done, "Too late.")
        assert ended.returncode == 1 and "has ended (done)" in ended.stderr, (
            ended.stderr
        )
        assert _cli(server, "cancel", done).returncode == 1

        def gone() -> bool:
            try:
                client.status(done)
            except RunNotFoundError:
                return True
            return False

        eventually(gone, timeout=20)
        # every key of it
        assert not [k for k in client.redis.scan_iter(f"tl:{{{done}}}:*")]
        # the index follows
        assert [run.run_id for run in client.list_runs().runs] == [parked]
        assert client.redis.zscore(keys.ALL_RUNS, done) is None
        assert client.status(parked).status == "asked"
        assert [run.run_id for run in client.list_runs(status="asked").runs] == [parked]
        client.cancel(parked)
        assert client.wait(parked, timeout=30).status == "cancel"


def test_expired_runs_and_decisions_get_the_retention(
    server: EmbeddedServer, worker: Worker
) -> None:
    """A run that ends `expired` (an ask past its deadline, ended by the sweeper's script, not by a
    step) and the decisions hash of an approved run expire with the run's other keys."""
    with Client(server.url) as client:
        expired = client.enqueue(spec("ask", ask_timeout_s=1))
        approved = client.enqueue(spec("approve"))
        status = client.wait(approved, timeout=30)
        [held] = status.approvals or []
        client.approve(approved, held["call_id"], digest=held["input_digest"])
        assert client.wait(approved, timeout=30).status == "done"
        assert 0 < client.redis.ttl(keys.decisions(approved)) <= 8
        assert eventually(
            lambda: client.status(expired).status == "expired", timeout=20
        )
        assert eventually(
            lambda: 0 < client.redis.ttl(keys.state(expired)) <= 8, timeout=5
        )
        ttls = {
            key: client.redis.ttl(key)
            for key in client.redis.scan_iter(f"tl:{{{expired}}}:*")
        }
        assert ttls and all(0 < ttl <= 8 for ttl in ttls.values()), ttls
        assert client.redis.zscore(keys.ENDED_RUNS, expired) is not None


def _fill(client: Client, count: int) -> list[str]:
    """`count` runs written straight into the index and their states (ids newest first)."""
    now = time.time()
    ids = [f"{n:032x}" for n in range(count)]
    pipe = client.redis.pipeline(transaction=False)
    for n, run_id in enumerate(ids):
        created = now - 100_000 + n  # distinct, increasing
        status = "done" if n % 10 else "failed"
        pipe.hset(
            keys.state(run_id),
            mapping={"status": status, "created": created, "steps": 2},
        )
        pipe.zadd(keys.ALL_RUNS, {run_id: created})
        pipe.zadd(keys.ENDED_RUNS, {run_id: created})
    pipe.execute()
    return ids[::-1]


def _paging(client: Client) -> tuple[list[str], float]:
    """Every run id as `list_runs` pages them (100 a page), and the seconds it took."""
    started = time.perf_counter()
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = client.list_runs(limit=100, cursor=cursor)
        seen += [run.run_id for run in page.runs]
        if page.next is None:
            return seen, time.perf_counter() - started
        cursor = page.next


def _raw_paging(client: Client, count: int) -> float:
    """Seconds to read `count` runs as `list_runs` does, bare: ZREVRANGEBYSCORE + pipelined HMGETs."""
    started = time.perf_counter()
    for offset in range(0, count, 100):
        ids = client.redis.zrevrangebyscore(
            keys.ALL_RUNS, "+inf", "-inf", start=offset, num=101
        )
        pipe = client.redis.pipeline(transaction=False)
        for run_id in ids[:100]:
            pipe.hmget(
                keys.state(run_id),
                "status",
                "created",
                "touched",
                "steps",
                "spent_usd",
                "segment",
            )
        pipe.execute()
    return time.perf_counter() - started


def test_list_pages_through_ten_thousand_runs_at_the_speed_of_bare_reads(
    server: EmbeddedServer,
) -> None:
    with Client(server.url) as client:
        client.redis.flushdb()
        newest_first = _fill(client, 10_000)
        seen, took = _paging(client)
        assert seen == newest_first  # every run once, newest first
        floor = _raw_paging(client, len(newest_first))
        for _ in range(
            2
        ):  # the machine is shared: the best of three of each, taken in turns
            took = min(took, _paging(client)[1])
            floor = min(floor, _raw_paging(client, len(newest_first)))
        assert took < 3 * floor + 0.05, (
            f"paging 10,000 runs took {took:.2f} s, bare reads {floor:.2f} s"
        )
        failed = client.list_runs(status="failed", limit=2000).runs
        assert [run.run_id for run in failed] == [
            r for r in newest_first if int(r, 16) % 10 == 0
        ]

        first = _cli(server, "list", "--limit", "3")
        assert first.returncode == 0, first.stderr
        lines = first.stdout.splitlines()
        assert [line.split()[0] for line in lines[:3]] == newest_first[:3]
        assert lines[3].startswith("more: toolloop list --cursor ")
        cursor_arg = lines[3].split("--cursor ")[1].strip("'")
        second = _cli(server, "list", "--limit", "3", "--cursor", cursor_arg, "--json")
        rows = [json.loads(line) for line in second.stdout.splitlines()]
        assert [row["run_id"] for row in rows[:3]] == newest_first[
            3:6
        ] and "next" in rows[3]


def test_prune_deletes_old_finished_runs_and_forgets_expired_ones(
    server: EmbeddedServer,
) -> None:
    with Client(server.url) as client:
        client.redis.flushdb()
        ids = _fill(client, 50)
        live = ids[0]
        # parked: prune leaves it
        client.redis.hset(keys.state(live), "status", "asked")
        # expired already: only its index entry is left
        client.redis.delete(keys.state(ids[1]))
        pruned = _cli(server, "prune", "--older-than", "1h")
        assert pruned.returncode == 0, pruned.stderr
        assert "Deleted 48 finished runs; dropped 1 expired runs" in pruned.stdout
        assert [run.run_id for run in client.list_runs().runs] == [live]
        assert _cli(server, "prune", "--older-than", "soon").returncode == 1
