"""`RedisJournal`: the journal of SPEC.md 2.5 in a Redis hash, one hash per run segment.

Replay contract: a key whose field is in the hash returns the stored value and runs nothing. A key
that is not runs its work once, under the run's lease (SET NX PX, fencing token from INCR), and
is written by one atomic script (fence check + HSETNX) that returns the value Redis holds, which is
what `step` returns: two copies of one step end with one stored value and both continue with it.

Two ways to use it:
- on its own (`RedisJournal(redis, run_id)`): every live step is leased, run and committed at once;
  a step whose lease another process holds waits for that value (or for the lease to lapse).
- one step per task (`live_steps=1`, `entries` preloaded): the durable worker's mode. Stored steps
  replay from `entries` with no Redis call; the first missing step runs and its value is kept in
  `pending` (not written: the worker commits it with the run's events in one script); the next
  missing step raises `StepBoundary(key)` from `step` itself, before any work, so it leaves
  `run_tool_loop` unchanged and tells the worker what runs next. With `pause`, the next missing
  step awaits `pause(key)` instead and, once that returns (the worker committed the pending step and
  runs the next one in the same process), runs: the loop goes on where it stopped, with no replay.

Hooks around a live step's work (the durable worker's lease check): `before_live(key)` runs just
before it and may return an awaitable, which is awaited before the signal is checked and the work
begins (a fence read when the lease's local deadline is near); `after_live(key)` runs when the work
has returned or raised. While the work runs, `idempotency_key()` is "<run id>/<prefix><key>".
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis as redis_lib

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.journal import keys, scripts
from toolloop.journal.base import step_scope
from toolloop.loop.types import StepResult, StepWork

DEFAULT_LEASE_MS = 600_000
_POLL_S = 0.05


class StepBoundary(BaseException):
    """Raised by `step` in one-step mode at the second step that is not in the journal.

    A BaseException so that no `except Exception` of the loop or of a tool turns it into an error.
    `key` is the (unprefixed) step key that runs next.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class JournalFencedError(RuntimeError):
    """A newer holder took this run's lease while our step ran; its value was not stored."""


def encode_entry(result: StepResult) -> str:
    """The stored JSON text of a step: `{"value": ..., "cost_usd": ...}` (rejects NaN, non-JSON)."""
    return json.dumps(
        {"value": result.value, "cost_usd": result.cost_usd}, ensure_ascii=False, allow_nan=False
    )


class RedisJournal:
    """A journal over the hash `keys.journal(run_id, prefix)` (sync redis-py client).

    `signal` is passed to every step's work; a live step with an aborted signal raises `AbortError`
    and runs nothing. `before_live(key)` is called just before a live step's work (the worker uses
    it to arm cancellation). `lease_ms` bounds how long a dead holder blocks a step.
    """

    def __init__(
        self,
        redis: redis_lib.Redis,
        run_id: str,
        prefix: str = "s0/",
        *,
        signal: AbortSignal = NEVER_ABORTED,
        lease_ms: int = DEFAULT_LEASE_MS,
        entries: dict[str, str] | None = None,
        live_steps: int | None = None,
        before_live: Callable[[str], Awaitable[None] | None] | None = None,
        after_live: Callable[[str], None] | None = None,
        owner: str | None = None,
        pause: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.redis = redis
        self.run_id = run_id
        self.prefix = prefix
        self.signal = signal
        self.lease_ms = lease_ms
        self.entries: dict[str, str] = dict(entries or {})
        self.parsed: dict[str, tuple[float, Any]] = {}
        """Entries already decoded: key -> (cost, value). Fields are write-once, so a value decoded
        once is not decoded again (a replayed run's loop, and `route` after it, read each once)."""
        self.live_steps = live_steps
        self.pause = pause
        self.before_live = before_live
        self.after_live = after_live
        self.owner = owner or uuid.uuid4().hex
        self.pending: list[tuple[str, str, float]] = []
        """Live steps run but not written (one-step mode): (key, stored JSON, cost)."""
        self.cost_usd = 0.0
        """The cost of every step `step` has returned so far, replayed ones included."""
        self.replayed = 0
        """How many times `step` returned a stored value without running anything."""
        self.hash_key = keys.journal(run_id, prefix)

    async def step(self, key: str, work: StepWork) -> Any:
        stored: Any = self.entries.get(key)
        if stored is None and self.live_steps is None:
            stored = await asyncio.to_thread(self.redis.hget, self.hash_key, key)
        if stored is not None:
            self.replayed += 1
            return self._returned(stored, key)
        if self.live_steps is not None and len(self.pending) >= self.live_steps:
            if self.pause is None:
                raise StepBoundary(key)
            await self.pause(key)  # the pending steps were committed meanwhile
            self.pending.clear()
        if self.before_live is not None:
            checking = self.before_live(key)
            if checking is not None:
                await checking
        self.signal.throw_if_aborted()
        if self.live_steps is not None:
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
        text = await self._run_leased(key, work)
        self.entries[key] = text
        return self._returned(text)

    def _returned(self, stored: str | bytes, key: str | None = None) -> Any:
        """The value of a stored entry (its cost counted). Values are memoized in `parsed`, except a
        two-phase tool's `:start` handle, which goes to user code that may change it."""
        memo = self.parsed.get(key) if key is not None else None
        if memo is None:
            entry = json.loads(stored)
            memo = (entry["cost_usd"], entry["value"])
            if key is not None and not key.endswith(":start"):
                self.parsed[key] = memo
        self.cost_usd += memo[0]
        return memo[1]

    def keys(self) -> list[str]:
        return list(self.entries)

    def segment(self, prefix: str) -> RedisJournal:
        """A journal of the same run under another key prefix (a continued conversation)."""
        return RedisJournal(
            self.redis, self.run_id, prefix, signal=self.signal, lease_ms=self.lease_ms, owner=self.owner
        )

    def load(self) -> dict[str, str]:
        """Read the whole segment hash into `entries` (one HGETALL) and return it."""
        raw: dict[Any, Any] = self.redis.hgetall(self.hash_key)
        self.entries = {_text(k): _text(v) for k, v in raw.items()}
        return self.entries

    async def _run_leased(self, key: str, work: StepWork) -> str:
        while True:
            token = await asyncio.to_thread(self._acquire)
            if token is not None:
                break
            stored = await self._wait_for_value(key)
            if stored is not None:
                return stored
        lease_value = f"{self.owner}:{token}"
        try:
            with step_scope(f"{self.run_id}/{self.prefix}{key}"):
                text = encode_entry(await work(self.signal))
        except BaseException:
            await asyncio.to_thread(self._release, lease_value)
            raise
        stored_value = await asyncio.to_thread(self._commit, key, text, token, lease_value)
        if stored_value is not None:
            return stored_value
        raise JournalFencedError(
            f"Run {self.run_id!r}: another process took the lease while step {key!r} ran; "
            "its value was not stored.\n"
            "  Run the step again: it replays the other copy's value once that copy commits."
        )

    def _acquire(self) -> int | None:
        got, value = self.redis.register_script(scripts.LEASE_ACQUIRE)(
            keys=[keys.lease(self.run_id), keys.fence(self.run_id)], args=[self.owner, self.lease_ms]
        )
        return int(value) if int(got) == 1 else None

    def _release(self, lease_value: str) -> None:
        self.redis.register_script(scripts.LEASE_RELEASE)(keys=[keys.lease(self.run_id)], args=[lease_value])

    def _commit(self, key: str, text: str, token: int, lease_value: str) -> str | None:
        """The stored value after the commit script (None: fenced and nothing stored yet)."""
        _ok, stored = self.redis.register_script(scripts.STEP_COMMIT)(
            keys=[self.hash_key, keys.fence(self.run_id), keys.lease(self.run_id)],
            args=[key, text, token, lease_value],
        )
        return None if stored is None else _text(stored)

    async def _wait_for_value(self, key: str) -> str | None:
        """Another holder runs this step: wait for its value, or for its lease to lapse (None)."""
        lease_key = keys.lease(self.run_id)
        while True:
            stored, held = await asyncio.to_thread(self._peek, key, lease_key)
            if stored is not None:
                return stored
            if not held:
                return None
            await asyncio.sleep(_POLL_S)

    def _peek(self, key: str, lease_key: str) -> tuple[str | None, bool]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.hash_key, key)
        pipe.exists(lease_key)
        stored, held = pipe.execute()
        return (None if stored is None else _text(stored)), bool(held)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
