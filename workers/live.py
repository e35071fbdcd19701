"""A run's loop kept alive across its steps in the process that runs them.

`advance` runs one step of a run per task. Instead of ending `run_tool_loop` at the boundary of the
next step, its journal pauses the loop there (`RedisJournal(pause=...)`); the step commits, and the
paused loop is kept here. When this process runs the run's next task and the run's state shows that
no commit came after its own (RUN_BEGIN compares the tag), the loop resumes where it paused: no load
of the journal, no replay. Elsewhere (after a crash, a restart, another worker's step) the next step
replays the journal instead, with the same result (the replay contract of SPEC 2.5).

    keep(run_id, loop) / take(run_id)   the loops paused between two tasks, oldest dropped past 4,096
    Begun                               a task its predecessor's commit began (RUN_COMMIT's go_on)
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from toolloop.abort import AbortController
from toolloop.journal.redis import RedisJournal, StepBoundary
from toolloop.loop.run import run_tool_loop
from toolloop.loop.types import LoopEvent, RunToolLoopOptions, RunToolLoopResult, ToolSpec
from workers.deltas import DeltaStream

KEPT_MAX = 4096

Outcome = asyncio.Future[RunToolLoopResult | StepBoundary]
"""What a step's loop came to: its end, or the boundary of the run's next step."""


class StepContext(Protocol):
    """What the loop reads of the task running it now (workers/advance.py's step)."""

    outside: float
    state: dict[str, str]

    def before_live(self, key: str) -> Awaitable[None] | None: ...

    def after_live(self, key: str) -> None: ...


class LiveLoop:
    """A run's `run_tool_loop`, running in a task of its own across the run's steps in this process.
    What the loop reads of the step it is in (the state, the outside spend, cancellation) goes
    through `step`, the task that runs it now."""

    def __init__(self, tools: dict[str, ToolSpec]) -> None:
        self.tools = tools
        self.tag = ""
        """The run's tag ("<last commit's lease>|<segment>") as of the commit that kept this loop."""
        self.controller = AbortController()
        self.events: list[LoopEvent] = []
        """Every event of the segment so far, as a replay would emit them again."""
        self.journal: RedisJournal
        self.step: StepContext
        self.task: asyncio.Task[RunToolLoopResult] | None = None
        self.outcome: Outcome | None = None
        self.resume: asyncio.Future[None] | None = None
        self.deltas: DeltaStream | None = None
        """The run's model text on its way to the event stream (RunSpec.stream), else None."""
        self.held_names: dict[str, str] = {}
        """Tool names of the calls decided at the start of this segment (an approval resume), by id."""

    def start(self, step: StepContext, options: RunToolLoopOptions) -> Outcome:
        """Run the loop up to the boundary after the first step not stored, or to its end."""
        self.step = step
        self.outcome = asyncio.get_running_loop().create_future()
        self.task = asyncio.get_running_loop().create_task(run_tool_loop(options))
        self.task.add_done_callback(self._ended)
        return self.outcome

    def go_on(self, step: StepContext) -> Outcome:
        """Resume the paused loop for `step`: it runs that step and pauses at the next boundary."""
        assert self.resume is not None and not self.resume.done()
        self.step = step
        self.outcome = asyncio.get_running_loop().create_future()
        self.resume.set_result(None)
        return self.outcome

    async def pause(self, key: str) -> None:
        """The journal's `pause`: report the boundary of step `key`, wait to be resumed."""
        assert self.outcome is not None
        if self.outcome.done():  # the step stopped waiting (its timeout, a shutdown): end here
            raise asyncio.CancelledError
        self.resume = asyncio.get_running_loop().create_future()
        self.outcome.set_result(StepBoundary(key))
        await self.resume

    def keepable(self) -> bool:
        """True when the loop paused at a boundary and nothing cancelled it: a next step can resume it."""
        return self.resume is not None and not self.resume.done() and not self.controller.signal.aborted

    def before_live(self, key: str) -> Awaitable[None] | None:
        return self.step.before_live(key)

    def after_live(self, key: str) -> None:
        self.step.after_live(key)

    def spent_outside(self) -> float:
        return self.step.outside - float(self.step.state.get("spend_base", 0))

    def close(self) -> None:
        """End the loop (a paused one is cancelled where it waits)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def _ended(self, task: asyncio.Task[RunToolLoopResult]) -> None:
        outcome = self.outcome
        error = None if task.cancelled() else task.exception()  # retrieved, so never logged as lost
        if outcome is None or outcome.done():
            return
        if task.cancelled():
            outcome.cancel()
        elif error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(task.result())


@dataclass(frozen=True)
class Begun:
    """A task its predecessor's commit began (RUN_COMMIT's go_on): the lease it holds as `owner`,
    RUN_BEGIN's 'run' reply for it, the run's loop, paused where this task goes on. (go_on runs
    only in a fresh commit, whose step value is the one stored: the loop is where the run is.)"""

    owner: str
    reply: list[Any]
    loop: LiveLoop
    sent_at: float
    """When the commit that took the lease for it was sent (time.monotonic())."""


_kept: OrderedDict[str, LiveLoop] = OrderedDict()
_lock = threading.Lock()


def keep(run_id: str, loop: LiveLoop) -> None:
    """Keep `loop` for the run's next task in this process (the oldest kept loop ends past KEPT_MAX)."""
    with _lock:
        _kept[run_id] = loop
        dropped = _kept.popitem(last=False)[1] if len(_kept) > KEPT_MAX else None
    if dropped is not None:
        dropped.close()


def take(run_id: str) -> LiveLoop | None:
    """The run's kept loop, now the caller's: it resumes it or closes it."""
    with _lock:
        return _kept.pop(run_id, None)
