"""What a step's timeout costs on the worker's loop (bench/PROFILE-19.md section 8, C7): an
`asyncio.timeout` around the step's wait, against `workers.process.deadlines.StepDeadlines` (one timer for
every step of the process), on uvloop as in the worker; thread CPU per await of a done future.

    .venv/bin/python bench/step_timeout.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import uvloop

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from workers.process.deadlines import StepDeadlines  # noqa: E402

N = 200_000


async def bare(loop: asyncio.AbstractEventLoop) -> float:
    began = time.thread_time()
    for _ in range(N):
        future = loop.create_future()
        future.set_result(None)
        await future
    return (time.thread_time() - began) / N * 1e6


async def with_timeout(loop: asyncio.AbstractEventLoop) -> float:
    began = time.thread_time()
    for _ in range(N):
        future = loop.create_future()
        future.set_result(None)
        async with asyncio.timeout(900):
            await future
    return (time.thread_time() - began) / N * 1e6


async def with_deadlines(
    loop: asyncio.AbstractEventLoop, deadlines: StepDeadlines
) -> float:
    began = time.thread_time()
    for _ in range(N):
        future = loop.create_future()
        future.set_result(None)
        deadlines.watch(future)
        try:
            await future
        finally:
            deadlines.forget(future)
    return (time.thread_time() - began) / N * 1e6


async def rounds() -> None:
    loop = asyncio.get_running_loop()
    deadlines = StepDeadlines(900)
    for _ in range(3):
        print(
            f"bare await {await bare(loop):.2f} us; asyncio.timeout {await with_timeout(loop):.2f} us; "
            f"StepDeadlines {await with_deadlines(loop, deadlines):.2f} us"
        )


if __name__ == "__main__":
    uvloop.run(rounds())
