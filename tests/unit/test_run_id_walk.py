"""The walk of a run id through one durable step (issue #26): from `advance` (what the Celery task
and the step consumer call, workers/worker/) through the rooms of workers/, each function that
takes the run id counted where it starts (coroutines included: a coroutine's resumptions are not new
calls). Followed down the calls (each call's stack of run-id calls), the walk enters each room at
most twice, so a reader follows a step down through the rooms in order instead of back and forth;
a room's helpers the step calls one after another (the process's lease, its kept loops) are leaves,
not a way back."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

from tests.support.harness import StepHarness
from toolloop.testing import ScriptedModel, call, reply

RUN_ID_ARGS = {"run_id", "run"}


NAMES_ONLY = {"workers.protocol.keys", "workers.protocol.names"}
"""Where a run id only becomes a key or a task id: a name, not a stay of the walk."""


def _room(frame: FrameType) -> str | None:
    module = frame.f_globals.get("__name__", "")
    parts = module.split(".")
    if parts[0] != "workers" or len(parts) < 2 or module in NAMES_ONLY:
        return None
    # workers.tasks, workers.app are rooms of their own
    return parts[1] if len(parts) > 2 else module


def _takes_run_id(frame: FrameType) -> bool:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return any(name in RUN_ID_ARGS for name in names)


class Walk:
    """The rooms a run id passes through, call by call: `rooms`, each new room of a call that
    takes the run id after the previous one (consecutive calls in one room: one stay), and
    `chains`, for each such call the rooms of the calls on its stack that take the run id (how deep
    a reader follows it down: step -> process -> step -> process would be back and forth)."""

    def __init__(self) -> None:
        self.rooms: list[str] = []
        self.chains: list[list[str]] = []
        self.seen: set[FrameType] = set()
        """Every frame that started (held, so no id is reused): a coroutine's resumption is the
        same frame again, not a new call."""

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame in self.seen:
            return
        self.seen.add(frame)
        room = _room(frame)
        if room is None or not _takes_run_id(frame):
            return
        if not self.rooms or self.rooms[-1] != room:
            self.rooms.append(room)
        chain: list[str] = []
        caller: FrameType | None = frame
        while caller is not None:
            here = _room(caller)
            if here is not None and _takes_run_id(caller) and chain[-1:] != [here]:
                chain.append(here)
            caller = caller.f_back
        self.chains.append(chain[::-1])

    def deepest(self) -> list[str]:
        """The chain that enters one room most often."""
        return max(self.chains, key=lambda chain: max(Counter(chain).values()))


async def _walk_of(h: StepHarness, run: str) -> Walk:
    walk = Walk()
    sys.setprofile(walk)
    try:
        await h.step(run)
    finally:
        sys.setprofile(None)
    return walk


async def test_a_step_enters_each_room_at_most_twice(step_harness: StepHarness) -> None:
    h = step_harness
    adding = reply(
        "Adding.", tool_calls=[call("add", {"a": 2, "b": 3}, id="c1")], cost_usd=0.01
    )
    h.model = ScriptedModel([adding, reply("It is 5.", cost_usd=0.01)])
    run = h.enqueue()
    h.redis.delete("llm")
    # a model step, a tool step, the last model step
    walks = [await _walk_of(h, run) for _ in range(3)]
    assert h.state(run)["status"] == "done"
    for walk in walks:
        assert walk.rooms and walk.rooms[0] == "step", walk.rooms
        deepest = walk.deepest()
        assert max(Counter(deepest).values()) <= 2, " -> ".join(deepest)
