"""A durable run's model text, published to its event stream as it arrives (RunSpec.stream).

The loop hands each text delta of the live model call to `on_step` as a `DeltaEvent`
(SPEC 4.3). `DeltaStream.on_step` keeps the run's other events (journaled, committed with the step)
and buffers the deltas: the first one is written at once, later ones at most one write per
`INTERVAL` (50 ms) per run, each write one `DELTA_FLUSH` script queued on the process's Redis batch
(workers/redisio.py: the step never waits for it; it travels in the loop turn's pipeline).

Stream entries (beside the committed events, which carry `seq`; these carry none):

    kind=delta      segment step attempt text   text of model step `step` (ModelEvent.step) of
                                                `segment`, from attempt `attempt` (the lease's
                                                fencing token: one per try of the step)
    kind=discarded  segment step attempt        every delta of that attempt is text the journal
                                                does not hold: drop it (the step runs again, or
                                                the run was cancelled / failed mid-answer)

The step's `model` event follows its deltas. When a step is tried again (a crash, a lost lease) or
stops mid-answer (cancel, a timeout), the marker is written before any later delta of the run and
before the commit's events: DELTA_FLUSH writes it when the state's `streaming` field names another
attempt, RUN_COMMIT when the commit does not carry the model event of the attempt that streamed
last (`backed`). Only the copy holding the run's fence writes deltas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from toolloop.journal import keys, scripts
from workers.redisio import Batch

log = logging.getLogger("toolloop.workers")

INTERVAL = 0.05
"""Seconds between two delta writes of one run (the first delta of a burst goes at once)."""


class DeltaStream:
    """One run's deltas, kept with its loop across the steps this process runs (`bind` each step)."""

    __slots__ = ("backed", "batch", "keep", "last", "parts", "run_id", "segment", "step", "timer", "token")

    def __init__(self, run_id: str, keep: Callable[[Any], Any]) -> None:
        self.run_id = run_id
        self.keep = keep
        """Where the other events go (the loop's event list)."""
        self.batch: Batch | None = None
        self.token = 0
        self.segment = 0
        self.parts: list[str] = []
        self.step = 0
        """The step of the buffered (or last written) text."""
        self.last = -1.0
        self.timer: asyncio.TimerHandle | None = None
        self.backed = ""
        """The attempt mark ("<segment>|<step>|<token>") whose model event came after its deltas."""

    def bind(self, batch: Batch, token: int, segment: int) -> None:
        """The step (attempt) that runs the loop now: its batch, fencing token and segment."""
        self.batch, self.token, self.segment = batch, token, segment
        self.backed = ""

    def on_step(self, event: Any) -> None:
        """`RunToolLoopOptions.on_step`: deltas to the stream, the rest to `keep`."""
        if event.kind != "delta":
            if event.kind == "model" and event.step == self.step and (self.parts or self.last >= 0):
                self.flush()  # its deltas go before the commit that carries it
                self.backed = f"{self.segment}|{self.step}|{self.token}"
            self.keep(event)
            return
        text = event.text
        if not text:
            return
        if self.parts and event.step != self.step:
            self.flush()
        self.step = event.step
        self.parts.append(text)
        if self.timer is None:
            loop = asyncio.get_running_loop()
            due = self.last + INTERVAL
            if self.last < 0 or loop.time() >= due:
                self.flush()
            else:
                self.timer = loop.call_at(due, self.flush)

    def flush(self) -> None:
        """Queue the buffered text as one delta entry (no wait: it goes out with the loop turn)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.parts or self.batch is None:
            return
        text = "".join(self.parts)
        self.parts.clear()
        self.last = asyncio.get_running_loop().time()
        r = self.run_id
        written = self.batch.script(
            scripts.DELTA_FLUSH,
            [keys.state(r), keys.fence(r), keys.events(r)],
            [self.token, self.segment, self.step, text],
        )
        written.add_done_callback(self._written)

    def settle(self) -> str:
        """Before the step's commit: drop text not written yet (a step that stopped mid-answer: its
        deltas are discarded anyway); the mark RUN_COMMIT keeps ('' when no streamed model event)."""
        self.drop()
        backed, self.backed = self.backed, ""
        self.last = -1.0
        return backed

    def drop(self) -> None:
        """Write nothing more of what is buffered (a lost lease, a commit)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.parts.clear()

    def _written(self, future: asyncio.Future[Any]) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:  # the text is in the model event all the same: only the live view lost it
            log.warning("run %s: deltas of step %s not written: %s", self.run_id, self.step, error)
