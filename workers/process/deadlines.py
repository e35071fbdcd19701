"""The step timeout (TOOLLOOP_STEP_TIMEOUT) of every step running in one worker process, kept by one
timer for all of them instead of an `asyncio.timeout` per step (each of those is a Timeout object,
a loop timer handle and its libuv timer, started and stopped once per step).

`StepDeadlines.watch(outcome)` while a step waits for its loop's `outcome`, `forget(outcome)` when
the wait ends; once `time.monotonic()` passes the step's deadline (`timeout` s after `watch`), the
next tick (every `tick` s: a tenth of the timeout, at most 1 s, so a step stops up to that much
later than its timeout) sets `StepTimedOut` on the future, which the waiting step reads as its
timeout. The timer runs only while some step is watched. Owned by the process's `WorkerProcess` (`deadlines`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


class StepTimedOut(Exception):
    """Set on a step's outcome future when its step timeout passed."""


class StepDeadlines:
    """The deadlines of the steps waiting on this process's loop, checked by one timer."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.tick = max(0.01, min(1.0, timeout / 10))
        self.due: dict[asyncio.Future[Any], float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, outcome: asyncio.Future[Any]) -> None:
        """Time out `outcome` (a step's wait for its loop) `timeout` s from now, unless forgotten."""
        loop = asyncio.get_running_loop()
        if (
            loop is not self._loop
        ):  # a new process loop (after a fork): the old one's steps are gone
            self._loop, self._handle = loop, None
            self.due.clear()
        self.due[outcome] = time.monotonic() + self.timeout
        if self._handle is None:
            self._handle = loop.call_later(self.tick, self._check)

    def forget(self, outcome: asyncio.Future[Any]) -> None:
        self.due.pop(outcome, None)

    def _check(self) -> None:
        now = time.monotonic()
        late = [outcome for outcome, deadline in self.due.items() if deadline <= now]
        for outcome in late:
            del self.due[outcome]
            if not outcome.done():
                outcome.set_exception(StepTimedOut())
        loop = self._loop
        self._handle = (
            loop.call_later(self.tick, self._check)
            if self.due and loop is not None
            else None
        )
