"""A run's loop kept alive across its steps in the process that runs them.

`advance` runs one step of a run per task. Instead of ending `run_tool_loop` at the boundary of the
next step, its journal (workers/process/segment.py) pauses the loop there (`SegmentJournal(pause=...)`); the
step commits, and the paused loop is kept here. When this process runs the run's next task and the
run's state shows that no commit came after its own (RUN_BEGIN compares the tag), the loop resumes
where it paused: no load of the journal, no replay. Elsewhere (after a crash, a restart, another
worker's step) the next step replays the journal instead, with the same result (the replay contract
of SPEC 2.5).

    KeptLoops                           the loops paused between two tasks (the process's, sized by
                                        TOOLLOOP_KEPT_LOOPS; the oldest dropped past it)
    Begun                               a task its predecessor's commit began (RUN_COMMIT's go_on)
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from toolloop.abort import AbortController
from toolloop.loop.run import run_tool_loop
from toolloop.loop.types import (
    LoopEvent,
    RunToolLoopOptions,
    RunToolLoopResult,
    ToolSpec,
)
from workers.process.deltas import DeltaStream
from workers.process.segment import SegmentJournal, StepBoundary
from workers.protocol.scripts.begin import Started

Outcome = asyncio.Future[RunToolLoopResult | StepBoundary]
"""What a step's loop came to: its end, or the boundary of the run's next step."""


class StepContext(Protocol):
    """What the loop reads of the task running it now (workers/step/advance.py's step)."""

    @property
    def outside(self) -> float: ...

    @property
    def state(self) -> dict[str, str]: ...

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
        """The events of the segment past the first `events_base`, as a replay would emit them again."""
        self.events_base = 0
        """How many events of the segment came before `events[0]`: the events a landed commit wrote
        to the stream are dropped here (`committed_events`), so a run's loop does not hold every
        event of its segment (the loop's list is appended to in place: its `append` is the sink)."""
        self.journal: SegmentJournal
        self.step: StepContext
        self.task: asyncio.Task[RunToolLoopResult] | None = None
        self.outcome: Outcome | None = None
        self.resume: asyncio.Future[None] | None = None
        self.deltas: DeltaStream | None = None
        """The run's model text on its way to the event stream (RunSpec.stream), else None."""
        self.max_steps = 0
        """The segment's `RunToolLoopOptions.max_steps` (a `done` stop with steps left can take a steer)."""
        self.held_names: dict[str, str] = {}
        """Tool names of the calls decided at the start of this segment (an approval resume), by id."""

    def start(self, step: StepContext, options: RunToolLoopOptions) -> Outcome:
        """Run the loop up to the boundary after the first step not stored, or to its end."""
        self.step = step
        self.outcome = asyncio.get_running_loop().create_future()
        self.task = asyncio.get_running_loop().create_task(_contained(options))
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
        if (
            self.outcome.done()
        ):  # the step stopped waiting (its timeout, a shutdown): end here
            raise asyncio.CancelledError
        self.resume = asyncio.get_running_loop().create_future()
        self.outcome.set_result(StepBoundary(key))
        await self.resume

    def events_past(self, committed: int) -> list[LoopEvent]:
        """The segment's events past its `committed` first. A kept loop resumes only where its own
        commit left the run, so `committed` is never below `events_base`."""
        start = committed - self.events_base
        if start < 0:
            raise RuntimeError(
                f"The stream holds {committed} events of the segment, this loop committed "
                f"{self.events_base}; the step runs again."
            )
        return self.events[start:]

    def committed_events(self) -> None:
        """Every event so far is in the stream (a commit landed): let go of them."""
        self.events_base += len(self.events)
        self.events.clear()

    def keepable(self) -> bool:
        """True when the loop paused at a boundary and nothing cancelled it: a next step can resume it."""
        return (
            self.resume is not None
            and not self.resume.done()
            and not self.controller.signal.aborted
        )

    def before_live(self, key: str) -> Awaitable[None] | None:
        return self.step.before_live(key)

    def after_live(self, key: str) -> None:
        self.step.after_live(key)

    def spent_outside(self) -> float:
        return self.step.outside - float(self.step.state.get("spend_base", 0))

    def close(self) -> None:
        """End the loop (a paused one is cancelled where it waits); it runs no step again."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        self.release()

    def release(self) -> None:
        """Drop what ties the loop to its task and to the step that ran it last (the journal's hooks
        are bound methods of the loop; the task's done callback is `_ended`), so that the loop, the
        journal and the step die by refcount once the step lets go, not in a collection the
        worker's thresholds rarely run. What the step still reads (the journal's pending steps, the
        events) stays. Called when the loop ends and when it is closed."""
        journal = getattr(self, "journal", None)
        if journal is not None:
            journal.pause = journal.before_live = journal.after_live = None
        self.task = self.resume = None
        if hasattr(self, "step"):
            del self.step

    def _ended(self, task: asyncio.Task[RunToolLoopResult]) -> None:
        outcome, self.outcome = self.outcome, None
        # retrieved, so never logged as lost
        error = None if task.cancelled() else task.exception()
        self.release()
        if outcome is None or outcome.done():
            return
        if task.cancelled():
            outcome.cancel()
        elif error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(task.result())


async def _contained(options: RunToolLoopOptions) -> RunToolLoopResult:
    """`run_tool_loop(options)`, where what would stop the worker's event loop thread (a `SystemExit`
    or `KeyboardInterrupt` from a model call, a hook, a tool callable other than run/start/wait:
    asyncio raises them out of the loop) fails the run instead. Tools' own are answered in the loop."""
    try:
        return await run_tool_loop(options)
    except (SystemExit, KeyboardInterrupt) as error:
        raise RuntimeError(
            f"The run's code raised {error!r}, which would have stopped the worker; the run fails instead.\n"
            "  Find what raised it in the worker's log (a model factory, a tool's needs_approval or "
            "estimate_usd), make it raise an Exception, then retry the run."
        ) from error


@dataclass(frozen=True)
class Begun:
    """A task its predecessor's commit began (RUN_COMMIT's go_on): the lease it holds as `owner`,
    what RUN_BEGIN would have replied for it (`started`, nothing loaded), the run's loop, paused
    where this task goes on. (go_on runs only in a fresh commit, whose step value is the one stored:
    the loop is where the run is.)"""

    owner: str
    started: Started
    loop: LiveLoop
    sent_at: float
    """When the commit that took the lease for it was sent (time.monotonic())."""


class KeptLoops:
    """The run loops this process keeps paused between two of their tasks, by run id, at most `size`
    (TOOLLOOP_KEPT_LOOPS): past it the oldest is dropped (closed; its run's next step replays).
    Owned by the process's `WorkerProcess`; a run that parks, ends or is cancelled keeps none."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"TOOLLOOP_KEPT_LOOPS must be 0 or more, not {size}.")
        self.size = size
        self._kept: OrderedDict[str, LiveLoop] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._kept

    def keep(self, run_id: str, loop: LiveLoop) -> None:
        """Keep `loop` for the run's next task here (the oldest kept loop ends past `size`)."""
        dropped: list[LiveLoop] = []
        with self._lock:
            self._kept[run_id] = loop
            while len(self._kept) > self.size:
                dropped.append(self._kept.popitem(last=False)[1])
        for one in dropped:
            one.close()

    def take(self, run_id: str) -> LiveLoop | None:
        """The run's kept loop, now the caller's: it resumes it or closes it."""
        with self._lock:
            return self._kept.pop(run_id, None)

    def clear(self) -> None:
        """Close every kept loop."""
        with self._lock:
            loops, self._kept = list(self._kept.values()), OrderedDict()
        for one in loops:
            one.close()

    def release(self, run_id: str) -> None:
        """Close the run's kept loop, if any (the run parked, ended or was cancelled)."""
        loop = self.take(run_id)
        if loop is not None:
            loop.close()
