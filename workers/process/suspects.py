"""Suspects: a step delivered again after its worker died runs alone among the redelivered steps of
its process, so that a step that kills its process is the one charged for it.

Invariant: only the step that was running alone among its process's suspects when the process died
counts a delivery toward TOOLLOOP_MAX_DELIVERIES; steps in flight beside it run again uncharged.

RUN_BEGIN counts every delivery of task n (`tl:{<run>}:attempts` field `n`). A delivery after the
first is a suspect: its earlier delivery ended without a commit, most often because its process
died (SIGKILL, out of memory, a native crash in a tool: `os.abort`, a segfault). In one process the
suspects run one at a time (`Suspects.turn`, FIFO), beside any number of first deliveries; as one
begins its turn it is charged (field `<n>:alone`, +1), before its work begins. A step's charged
deliveries are its first one plus its turns; past TOOLLOOP_MAX_DELIVERIES its run fails with
`DeliveryLimitError`, before its work begins again. A process that dies while a suspect runs its turn
charges that suspect alone: the other suspects of the process were waiting for their turn, and the
first deliveries beside it are not charged (they come back as suspects, and take their turn).

A crash that a first delivery causes while a suspect has its turn also charges that suspect: once
per such crash, and a poison step is a first delivery once, so a bystander is charged at most once
per poison step it meets. A suspect that waits for its turn keeps its step slot (it does not lend it
as a rate-limit wait does: the next message could be another suspect, and a process would claim
every redelivered step of the fleet), so a process holds at most its `--steps-in-flight` of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from workers.protocol.errors import DeliveryLimitError


class Suspects:
    """One process's turn for its suspects (made on the process's loop, used only from it)."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None

    async def turn(self) -> Callable[[], None]:
        """Wait for the process's one suspect turn (FIFO); returns the call that ends it (idempotent)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        lock = self._lock
        await lock.acquire()
        held = [True]

        def end() -> None:
            if held:
                held.clear()
                lock.release()

        return end


def limit_error(
    run_id: str, n: int, delivered: int, counted: int
) -> DeliveryLimitError:
    return DeliveryLimitError(
        f"Step {n} of run {run_id!r} was delivered {delivered} times without finishing; {counted} of "
        "them count (its first, and each it ran alone among the steps redelivered to its worker).\n"
        "  Its worker dies while it runs (a crash in a tool? memory?); fix that, then retry the run."
    )
