"""`AbortController` / `AbortSignal`, as in the web platform: one controller aborts, many listen.

`abort()` is safe from any thread; `wait()` is awaitable from any event loop (each waiter is woken on
its own loop). A signal that is already aborted stays aborted.

A controller may also give its signal a deadline on the monotonic clock (`abort_at`): from that
instant the signal reads as aborted, with the reason given, the first time anyone looks (`aborted`,
`throw_if_aborted`), with no timer and no thread. A durable worker bounds the work of a step by its
lease this way: a process frozen past its lease (SIGSTOP, a VM pause, a stalled Redis) finds its
signal aborted the moment it runs again, before it can start anything (docs/workers.md).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from toolloop.errors import AbortError

T = TypeVar("T")


class AbortSignal:
    __slots__ = (
        "_aborted",
        "_callbacks",
        "_deadline",
        "_deadline_reason",
        "_lock",
        "_reason",
        "_waiters",
    )

    def __init__(self) -> None:
        self._aborted = False
        self._reason: Any = None
        self._deadline: float | None = None
        self._deadline_reason: Any = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._callbacks: dict[Callable[[], None], int] = {}
        """Each callback to call, with how many times it was added (in order: a dict, so removing
        one is O(1) even when thousands of steps listen to one signal)."""

    @property
    def aborted(self) -> bool:
        if self._aborted:
            return True
        deadline = self._deadline
        if deadline is not None and time.monotonic() >= deadline:
            self._abort(self._deadline_reason)
            return True
        return False

    @property
    def reason(self) -> Any:
        return self._reason

    def throw_if_aborted(self) -> None:
        if self.aborted:
            raise AbortError(_abort_message(self._reason), self._reason)

    async def wait(self) -> None:
        """Return once the signal is aborted."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._aborted:
                return
            self._waiters.append((loop, future))
        try:
            await future
        finally:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once when the signal aborts (at once when it already has)."""
        with self._lock:
            if not self._aborted:
                callbacks = self._callbacks
                callbacks[callback] = callbacks.get(callback, 0) + 1
                return
        callback()

    def remove_callback(self, callback: Callable[[], None]) -> None:
        """Forget a callback given to `add_callback` (nothing when it ran or was never added)."""
        with self._lock:
            callbacks = self._callbacks
            count = callbacks.get(callback)
            if count is None:
                return
            if count > 1:
                callbacks[callback] = count - 1
            else:
                del callbacks[callback]

    def _abort(self, reason: Any) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason
            waiters, self._waiters = self._waiters, []
            callbacks, self._callbacks = self._callbacks, {}
        for loop, future in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)
        for callback, count in callbacks.items():
            for _ in range(count):
                callback()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _abort_message(reason: Any) -> str:
    if reason is None:
        return "The operation was aborted."
    return f"The operation was aborted: {reason}."


class AbortController:
    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: Any = None) -> None:
        self.signal._abort(reason)

    def abort_at(self, deadline: float | None, reason: Any = None) -> None:
        """Abort the signal with `reason` once `time.monotonic()` reaches `deadline` (read lazily,
        when the signal is looked at); None takes the deadline away. An aborted signal stays so."""
        signal = self.signal
        signal._deadline_reason = reason
        signal._deadline = deadline


NEVER_ABORTED = AbortSignal()
"""A signal nobody can abort: the default of every `signal` option."""


async def race(awaitable: Awaitable[T], signal: AbortSignal) -> T:
    """Await `awaitable`, or raise the signal's `AbortError` as soon as it aborts (the work is
    cancelled then). The work runs in the calling task (no task of its own): the signal's callback
    cancels that task, and the cancel is taken back (`uncancel`) once it has stopped the work."""
    if signal.aborted:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: close it so it is not reported as never awaited
        signal.throw_if_aborted()
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    state = [False, False]  # [the work is over, the signal cancelled the task]

    def fire() -> None:  # on the loop
        if not state[0]:
            state[1] = True
            task.cancel()

    def cancel() -> None:  # the signal may abort from another thread
        loop.call_soon_threadsafe(fire)

    signal.add_callback(cancel)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if state[1]:
            state[1] = False
            if (
                task.uncancel() == 0
            ):  # nobody else cancelled the task: the abort is what stopped it
                signal.throw_if_aborted()
        raise
    finally:
        state[0] = True
        signal.remove_callback(cancel)
        if state[1]:  # cancelled as the work ended: the cancel never reached it
            task.uncancel()
