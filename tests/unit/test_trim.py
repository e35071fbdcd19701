"""workers/worker/trim.py: an idle worker gives the C heap's free memory back to the OS (glibc's
malloc_trim) and ends its sync-tool threads, once per idle spell and never while a step holds a
lease."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import pytest

from toolloop.embedded import EmbeddedServer
from workers.config.celery import make_app
from workers.config.settings import Settings
from workers.process.leases import Leases
from workers.process.worker_process import WorkerProcess
from workers.worker.trim import IdleTrim, malloc_trim


class Batch:
    """Answers every lease renewal with 1 (no Redis; the lease is long, so none is sent here)."""

    def script(
        self, source: str, keys: list[str], args: list[object]
    ) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        future.set_result(1)
        return future


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def test_it_trims_once_the_worker_is_idle_and_never_while_a_step_runs() -> None:
    leases = Leases(Batch(), 60_000)  # type: ignore[arg-type]
    trims: list[int] = []
    idle = IdleTrim(
        leases,
        idle_ticks=2,
        trim=lambda: trims.append(len(leases.held)),
        shed=lambda: trims.append(-1),
    )
    # no step ran yet: nothing to give back
    assert [idle.tick() for _ in range(3)] == [
        False,
        False,
        False,
    ]
    held = leases.hold("a", 1, "me:1", time.monotonic(), lambda error: None)
    # a step holds a lease
    assert [idle.tick() for _ in range(3)] == [
        False,
        False,
        False,
    ]
    leases.drop(held)
    # once per idle spell
    assert [idle.tick() for _ in range(4)] == [
        False,
        True,
        False,
        False,
    ]
    leases.drop(leases.hold("b", 1, "me:2", time.monotonic(), lambda error: None))
    # a step ran since the last tick
    assert [idle.tick() for _ in range(3)] == [
        False,
        False,
        True,
    ]
    assert trims == [-1, 0, -1, 0]  # the tool threads end, then the heap is trimmed
    assert leases.task is not None
    leases.task.cancel()


@pytest.mark.skipif(
    malloc_trim() is None, reason="no malloc_trim in this C library (not glibc)"
)
def test_malloc_trim_gives_freed_heap_pages_back() -> None:
    trim = malloc_trim()
    assert trim is not None
    # ~200 MB in the C heap (past pymalloc's 512 B)
    blocks = [bytes(2048) for _ in range(100_000)]
    # a few stay, so free() cannot shrink the heap from its top by itself
    pinned = blocks[::200]
    del blocks
    before = _rss_kb()
    trim()
    after = _rss_kb()
    assert before - after > 50_000, (before, after)  # KiB
    del pinned


def test_the_idle_process_ends_its_tool_threads_and_starts_new_ones_on_demand(
    harness_redis: EmbeddedServer,
) -> None:
    settings = dataclasses.replace(
        Settings.from_env(), redis_url=harness_redis.url, sweep_interval=0, kill_plan=""
    )
    process = WorkerProcess(make_app(settings), settings)
    loop = process.start_loop()

    def in_a_tool_thread() -> threading.Thread:
        async def hop() -> threading.Thread:
            return await asyncio.to_thread(threading.current_thread)

        return asyncio.run_coroutine_threadsafe(hop(), loop).result(10)

    try:
        first = in_a_tool_thread()
        assert first.name.startswith("toolloop-tool") and first.is_alive()
        process.shed_tool_threads()
        first.join(timeout=10)
        assert not first.is_alive()  # its stack is unmapped with it
        second = in_a_tool_thread()
        assert second.name.startswith("toolloop-tool") and second is not first
    finally:
        asyncio.run_coroutine_threadsafe(process.aclose(), loop).result(10)
        process.celery.close()
        loop.call_soon_threadsafe(loop.stop)
