"""Enqueue from one client process (DESIGN.md section 7: 2,000 enqueues in under 1 s, sync and async).

On a private Redis, median of trials, each row against the floor measured in the same run: N plain
redis-py round trips (SET, and EVALSHA of a one-line script) from the same process, and N
redis.asyncio EVALSHA round trips for the async rows ("x floor" is against the matching one). Rows:

    Client.enqueue              one at a time (one round trip each: workers/client/enqueue.py)
    Client.enqueue_many         batches of --batch (one round trip per batch)
    AsyncClient.enqueue         one at a time, awaited; and --concurrency tasks at once
    AsyncClient.enqueue_many    batches of --batch
    before (runs.create)        the previous path: store script, then a Celery producer send

    .venv/bin/python bench/enqueue.py [--runs 2000] [--trials 5] [--batch 100] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from toolloop.embedded import start_server  # noqa: E402
from workers.client import AsyncClient, Client  # noqa: E402

SPEC = {
    "model": "claude-sonnet-5-5",
    "system": "You review storyboards.",
    "toolset": "review",
    "messages": [
        {"role": "user", "content": "Review the rough cut of scene 12, shots 1 to 9."}
    ],
}


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sync_rows(url: str, runs: int, batch: int) -> dict[str, Callable[[], Any]]:
    plain = redis.Redis.from_url(url, decode_responses=True)
    sha = plain.script_load("return 1")
    client = Client(url, toolsets=["review"])

    def floor_set() -> None:
        for i in range(runs):
            plain.set(f"bench:set:{i}", "x")

    def floor_eval() -> None:
        for _ in range(runs):
            plain.evalsha(sha, 0)

    def one_by_one() -> None:
        for _ in range(runs):
            client.enqueue(SPEC)

    def batched() -> None:
        for _ in range(0, runs, batch):
            client.enqueue_many([SPEC] * batch)

    def before() -> (
        None
    ):  # what enqueue did before: the store script, then Celery's producer
        from workers.protocol.spec import RunSpec
        from workers.runs import lifecycle

        for _ in range(runs):
            lifecycle.create(client.redis, client.celery, RunSpec.model_validate(SPEC))

    client.enqueue(SPEC)  # loads the script
    return {
        "floor: redis-py SET": floor_set,
        "floor: redis-py EVALSHA 'return 1'": floor_eval,
        "Client.enqueue": one_by_one,
        f"Client.enqueue_many ({batch} a batch)": batched,
        "before: store script + Celery send": before,
    }


def async_rows(
    url: str, runs: int, batch: int, concurrency: int
) -> dict[str, Callable[[], Any]]:
    async def one_by_one(client: AsyncClient) -> None:
        for _ in range(runs):
            await client.enqueue(SPEC)

    async def together(client: AsyncClient) -> None:
        async def worker(share: int) -> None:
            for _ in range(share):
                await client.enqueue(SPEC)

        await asyncio.gather(*(worker(runs // concurrency) for _ in range(concurrency)))

    async def batched(client: AsyncClient) -> None:
        for _ in range(0, runs, batch):
            await client.enqueue_many([SPEC] * batch)

    def on_loop(body: Callable[[AsyncClient], Any]) -> Callable[[], Any]:
        async def main() -> float:
            async with AsyncClient(url, toolsets=["review"]) as client:
                await client.enqueue(SPEC)  # connects and loads the script
                start = time.perf_counter()
                await body(client)
                return time.perf_counter() - start

        return lambda: asyncio.run(main())

    async def floor_eval(client: AsyncClient) -> None:
        sha = await client.redis.script_load("return 1")
        for _ in range(runs):
            await client.redis.evalsha(sha, 0)

    return {
        "floor: redis.asyncio EVALSHA 'return 1'": on_loop(floor_eval),
        "AsyncClient.enqueue": on_loop(one_by_one),
        f"AsyncClient.enqueue, {concurrency} tasks": on_loop(together),
        f"AsyncClient.enqueue_many ({batch} a batch)": on_loop(batched),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="bench-enqueue-")))
    try:
        plain = redis.Redis.from_url(server.url)
        rows = sync_rows(server.url, args.runs, args.batch)
        loops = async_rows(server.url, args.runs, args.batch, args.concurrency)
        seconds: dict[str, list[float]] = {name: [] for name in [*rows, *loops]}
        for _ in range(
            args.trials
        ):  # rows interleaved: a noisy moment hits every row alike
            for name, fn in rows.items():
                seconds[name].append(timed(fn))
                plain.flushdb()
            for name, fn in loops.items():
                # the loop's own timing, without asyncio.run's start
                seconds[name].append(fn())
                plain.flushdb()
        floors = {
            name: statistics.median(seconds[f"floor: {lib} EVALSHA 'return 1'"])
            for name, lib in (("sync", "redis-py"), ("async", "redis.asyncio"))
        }
        print(
            f"{args.runs:,} enqueues from one process, median of {args.trials} trials, private Redis\n"
        )
        print(
            f"| {'What':44} | {'s for ' + format(args.runs, ','):>10} | {'runs/s':>8} | {'x floor':>7} |"
        )
        print(f"| {'-' * 44} | {'-' * 10}: | {'-' * 7}: | {'-' * 6}: |")
        for name, trials in seconds.items():
            median = statistics.median(trials)
            floor = floors["async" if name in loops else "sync"]
            print(
                f"| {name:44} | {median:10.3f} | {args.runs / median:8,.0f} | {median / floor:7.2f} |"
            )
        best_sync = statistics.median(seconds["Client.enqueue"])
        best_async = statistics.median(seconds["AsyncClient.enqueue"])
        verdict = "meets" if max(best_sync, best_async) < 1.0 else "misses"
        print(
            f"\nOne at a time: sync {best_sync:.3f} s, async {best_async:.3f} s for {args.runs:,} "
            f"({verdict} the target: under 1 s)."
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
