"""`SegmentJournal`: the durable worker's journal of one run segment, one live step per task.

The segment's entries are loaded by RUN_BEGIN (workers/scripts/begin.py) and handed in; nothing here
reads or writes Redis. Stored steps replay from `entries`; the first missing step runs and its value
is kept in `pending` (the worker commits it with the run's events in one script, RUN_COMMIT); the
next missing step raises `StepBoundary(key)` from `step` itself, before any work, so it leaves
`run_tool_loop` unchanged and tells the worker what runs next. With `pause`, the next missing step
awaits `pause(key)` instead and, once that returns (the worker committed the pending step and runs
the next one in the same process), runs: the loop goes on where it stopped, with no replay.

Hooks around a live step's work (the worker's lease check): `before_live(key)` runs just before it
and may return an awaitable, which is awaited before the signal is checked and the work begins (a
fence read when the lease's local deadline is near); `after_live(key)` runs when the work has
returned or raised. While the work runs, `idempotency_key()` is "<run id>/<prefix><key>", as under
the library's leased `RedisJournal`, which writes the same entries (`encode_entry`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.journal.base import step_scope
from toolloop.journal.redis import decode_entry, encode_entry
from toolloop.loop.types import StepWork


class StepBoundary(BaseException):
    """Raised by `SegmentJournal.step` at the step after its live ones, when it has no `pause`.

    A BaseException so that no `except Exception` of the loop or of a tool turns it into an error.
    `key` is the (unprefixed) step key that runs next.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class SegmentJournal:
    """The entries of segment `prefix` of run `run_id`, `live_steps` of them run live per task."""

    def __init__(
        self,
        run_id: str,
        prefix: str,
        entries: dict[str, str],
        *,
        signal: AbortSignal = NEVER_ABORTED,
        live_steps: int = 1,
        before_live: Callable[[str], Awaitable[None] | None] | None = None,
        after_live: Callable[[str], None] | None = None,
        pause: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.prefix = prefix
        self.signal = signal
        self.entries: dict[str, str] = dict(entries)
        self.parsed: dict[str, tuple[float, Any]] = {}
        """The latest model entry decoded: key -> (cost, value), at most one (`route` reads the
        calls of the latest model turn, workers/routing.py). The loop reads every other entry once
        (it validates what it needs from the decoded value), so keeping them all would only hold a
        decoded tree per step for the run's life, walked by every collection of the young objects."""
        self.live_steps = live_steps
        self.pause = pause
        self.before_live = before_live
        self.after_live = after_live
        self.pending: list[tuple[str, str, float]] = []
        """Live steps run but not written: (key, stored JSON, cost)."""
        self.cost_usd = 0.0
        """The cost of every step `step` has returned so far, replayed ones included."""
        self.replayed = 0
        """How many times `step` returned a stored value without running anything."""

    async def step(self, key: str, work: StepWork) -> Any:
        stored = self.entries.get(key)
        if stored is not None:
            self.replayed += 1
            return self._returned(stored, key)
        if len(self.pending) >= self.live_steps:
            if self.pause is None:
                raise StepBoundary(key)
            await self.pause(key)  # the pending steps were committed meanwhile
            self.pending.clear()
        if self.before_live is not None:
            checking = self.before_live(key)
            if checking is not None:
                await checking
        self.signal.throw_if_aborted()
        try:
            with step_scope(f"{self.run_id}/{self.prefix}{key}"):
                result = await work(self.signal)
        finally:
            if self.after_live is not None:
                self.after_live(key)
        text = encode_entry(result)
        self.pending.append((key, text, result.cost_usd))
        self.entries[key] = text
        return self._returned(text, key)

    async def boundary(self, key: str) -> None:
        """Reach the boundary before step `key` now, as `step(key, ...)` would (the pending step is
        committed: a `pause`, or `StepBoundary`), so that what is read next is read by the task that
        runs `key`. Nothing happens when `key` is stored or no live step is pending."""
        if key in self.entries or len(self.pending) < self.live_steps:
            return
        if self.pause is None:
            raise StepBoundary(key)
        await self.pause(key)
        self.pending.clear()

    def _returned(self, stored: str, key: str) -> Any:
        """The value of a stored entry (its cost counted). The latest model entry's stays in `parsed`
        (a model value goes to the loop, which only reads it)."""
        memo = self.parsed.get(key)
        if memo is None:
            memo = decode_entry(stored)
            if key.startswith("model:"):
                self.parsed = {key: memo}
        self.cost_usd += memo[0]
        return memo[1]

    def keys(self) -> list[str]:
        return list(self.entries)
