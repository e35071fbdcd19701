"""`RedisJournal`: the journal of SPEC.md 2.5 in a Redis hash, one hash per run segment.

Replay contract: a key whose field is in the hash returns the stored value and runs nothing. A key
that is not runs its work once, under the run's lease (SET NX PX, fencing token from INCR), and
is written by one atomic script (fence check + HSETNX) that returns the value Redis holds, which is
what `step` returns: two copies of one step end with one stored value and both continue with it.

Every live step is leased, run and committed at once; a step whose lease another process holds
waits for that value (or for the lease to lapse). While the work runs, `idempotency_key()` is
"<run id>/<prefix><key>". The durable worker reads and writes the same entries (`encode_entry`) one
step per task, through its own segment journal (workers/process/segment.py), which commits with the run.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import redis as redis_lib

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.fastjson import loads_exact
from toolloop.journal import keys, scripts
from toolloop.journal.base import step_scope
from toolloop.loop.types import StepResult, StepWork

DEFAULT_LEASE_MS = 600_000
_POLL_S = 0.05


class JournalFencedError(RuntimeError):
    """A newer holder took this run's lease while our step ran; its value was not stored."""


def encode_entry(result: StepResult) -> str:
    """The stored JSON text of a step: `{"value": ..., "cost_usd": ...}` (rejects NaN, non-JSON)."""
    return json.dumps(
        {"value": result.value, "cost_usd": result.cost_usd},
        ensure_ascii=False,
        allow_nan=False,
    )


def decode_entry(stored: str | bytes) -> tuple[float, Any]:
    """(cost, value) of a stored entry (`encode_entry`'s text), read as `json.loads` reads it
    (orjson where that is the same: `toolloop.fastjson.loads_exact`)."""
    entry = loads_exact(stored)
    return entry["cost_usd"], entry["value"]


class RedisJournal:
    """A journal over the hash `keys.journal(run_id, prefix)` (sync redis-py client).

    `signal` is passed to every step's work; a live step with an aborted signal raises `AbortError`
    and runs nothing. `lease_ms` bounds how long a dead holder blocks a step.
    """

    def __init__(
        self,
        redis: redis_lib.Redis,
        run_id: str,
        prefix: str = "s0/",
        *,
        signal: AbortSignal = NEVER_ABORTED,
        lease_ms: int = DEFAULT_LEASE_MS,
        owner: str | None = None,
    ) -> None:
        self.redis = redis
        self.run_id = run_id
        self.prefix = prefix
        self.signal = signal
        self.lease_ms = lease_ms
        self.entries: dict[str, str] = {}
        """The entries this journal read or wrote (`load` reads them all)."""
        self.owner = owner or uuid.uuid4().hex
        self.cost_usd = 0.0
        """The cost of every step `step` has returned so far, replayed ones included."""
        self.replayed = 0
        """How many times `step` returned a stored value without running anything."""
        self.hash_key = keys.journal(run_id, prefix)

    async def step(self, key: str, work: StepWork) -> Any:
        stored: Any = self.entries.get(key)
        if stored is None:
            stored = await asyncio.to_thread(self.redis.hget, self.hash_key, key)
        if stored is not None:
            self.replayed += 1
        else:
            self.signal.throw_if_aborted()
            stored = await self._run_leased(key, work)
        self.entries[key] = _text(stored)
        cost, value = decode_entry(stored)
        self.cost_usd += cost
        return value

    def keys(self) -> list[str]:
        return list(self.entries)

    def segment(self, prefix: str) -> RedisJournal:
        """A journal of the same run under another key prefix (a continued conversation)."""
        return RedisJournal(
            self.redis,
            self.run_id,
            prefix,
            signal=self.signal,
            lease_ms=self.lease_ms,
            owner=self.owner,
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
        stored_value = await asyncio.to_thread(
            self._commit, key, text, token, lease_value
        )
        if stored_value is not None:
            return stored_value
        raise JournalFencedError(
            f"Run {self.run_id!r}: another process took the lease while step {key!r} ran; "
            "its value was not stored.\n"
            "  Run the step again: it replays the other copy's value once that copy commits."
        )

    def _acquire(self) -> int | None:
        got, value = self.redis.register_script(scripts.LEASE_ACQUIRE)(
            keys=[keys.lease(self.run_id), keys.fence(self.run_id)],
            args=[self.owner, self.lease_ms],
        )
        return int(value) if int(got) == 1 else None

    def _release(self, lease_value: str) -> None:
        self.redis.register_script(scripts.LEASE_RELEASE)(
            keys=[keys.lease(self.run_id)], args=[lease_value]
        )

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
