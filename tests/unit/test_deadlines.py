"""`StepDeadlines`: one timer times out every watched step of a process (workers/process/deadlines.py)."""

from __future__ import annotations

import asyncio

import pytest

from workers.process.deadlines import StepDeadlines, StepTimedOut


async def test_a_watched_step_times_out_and_a_forgotten_one_does_not() -> None:
    deadlines = StepDeadlines(0.2)
    loop = asyncio.get_running_loop()
    late, done = loop.create_future(), loop.create_future()
    deadlines.watch(late)
    deadlines.watch(done)
    deadlines.forget(done)
    with pytest.raises(StepTimedOut):
        await asyncio.wait_for(late, 2)
    await asyncio.sleep(0.1)
    assert not done.done()
    assert deadlines.due == {}


async def test_the_timer_runs_only_while_a_step_is_watched() -> None:
    deadlines = StepDeadlines(0.1)
    outcome = asyncio.get_running_loop().create_future()
    deadlines.watch(outcome)
    deadlines.forget(outcome)
    await asyncio.sleep(0.05)  # a tick finds nothing watched: no timer is left behind
    assert deadlines._handle is None
    second = asyncio.get_running_loop().create_future()
    deadlines.watch(second)  # a later step starts the timer again
    with pytest.raises(StepTimedOut):
        await asyncio.wait_for(second, 2)
