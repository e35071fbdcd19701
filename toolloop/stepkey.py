"""The idempotency key of the journal step whose work is running, as a context variable (a leaf
module: the journals set it, the loop and tools read it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# The key of the step whose work runs in this context: a context variable, not process state (each
# asyncio task and each thread `asyncio.to_thread` starts sees the value of the step that started it).
_STEP_KEY: ContextVar[str | None] = ContextVar("toolloop_idempotency_key", default=None)


def idempotency_key() -> str | None:
    """The idempotency key of the journal step whose work is running: "<run id>/<segment>/<step key>"
    (e.g. "9f2c.../s0/tool:toolu_01A:start"), the same on every re-run of that step, so an outside
    service that dedupes by key (payment, render and job APIs) starts a tool's work once even when
    the step runs twice (a worker lost its lease after the effect, before its commit). Call it in a
    tool's `run` or `start` (sync tools included); None outside a step, or under a journal that
    names no run (`MemoryJournal`)."""
    return _STEP_KEY.get()


@contextmanager
def step_scope(key: str | None) -> Iterator[None]:
    """Run a step's work with `idempotency_key()` returning `key` (a journal calls this)."""
    token = _STEP_KEY.set(key)
    try:
        yield
    finally:
        _STEP_KEY.reset(token)
