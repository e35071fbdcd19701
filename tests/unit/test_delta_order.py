"""A streamed step's deltas land before its commit (workers/process/deltas.py `DeltaStream.landed`):
two loop turns' batches can travel on two connections, and Redis may run the later one first, so
the commit waits for the reply of its step's last delta write."""

from __future__ import annotations

import asyncio
from typing import Any

from toolloop.contract import DeltaEvent
from workers.process.deltas import DeltaStream


class HeldBatch:
    """A batch whose replies come when the test says (a round trip still out)."""

    def __init__(self) -> None:
        self.replies: list[asyncio.Future[Any]] = []

    def script(
        self, script: Any, keys: list[str], args: list[Any]
    ) -> asyncio.Future[Any]:
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.replies.append(reply)
        return reply


class Model:
    kind = "model"
    step = 1


async def test_the_commit_waits_for_the_last_delta_write_of_its_step() -> None:
    kept: list[Any] = []
    stream = DeltaStream("run-1", kept.append)
    batch = HeldBatch()
    stream.bind(batch, token=7, segment=0)  # type: ignore[arg-type]
    stream.on_step(_delta("Answered "))  # the first delta is written at once
    stream.on_step(_delta("after a retry."))  # buffered for the interval
    stream.on_step(Model())  # its buffered text is written before the commit
    assert len(batch.replies) == 2 and kept and stream.settle() == "0|1|7"
    landed = asyncio.ensure_future(stream.landed())
    await asyncio.sleep(0.01)
    assert not landed.done(), "the commit went ahead of a delta write still out"
    batch.replies[1].set_result(1)
    await asyncio.wait_for(landed, 1)
    await asyncio.wait_for(stream.landed(), 1)  # nothing written since: at once


async def test_a_failed_delta_write_does_not_hold_the_commit() -> None:
    stream = DeltaStream("run-1", lambda event: None)
    batch = HeldBatch()
    stream.bind(batch, token=7, segment=0)  # type: ignore[arg-type]
    stream.on_step(_delta("text"))
    batch.replies[0].set_exception(ConnectionError("Redis went away"))
    await asyncio.wait_for(stream.landed(), 1)


def _delta(text: str) -> DeltaEvent:
    return DeltaEvent(step=1, text=text)
