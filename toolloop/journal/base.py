"""The journal protocol of SPEC.md 2.5.

Replay contract: `step(key, work)` runs `work(signal)` at most once per key and stores what it returns
(`{"value": ..., "cost_usd": ...}`, JSON); a later call with the same key returns the stored value
without running `work`. A `work` that raises stores nothing and its exception reaches the caller
unchanged.
"""

from __future__ import annotations

from typing import Any, Protocol

from toolloop.loop.types import StepWork
from toolloop.stepkey import idempotency_key, step_scope

__all__ = ["Journal", "idempotency_key", "step_scope"]


class Journal(Protocol):
    async def step(self, key: str, work: StepWork) -> Any: ...
