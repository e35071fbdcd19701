"""Memory a worker gives back once it is idle: glibc's `malloc_trim(0)`, from the sweeper thread.

A worker that ran many steps at once keeps the allocator's high-water mark of them (freed memory
stays in the C heap for the next allocation) even when none of its runs is on it any more: after
10,000 runs parked, that is most of what its RSS grew by. So when no step has held a lease for
`idle_ticks` ticks of the sweeper (about a second each) and some step ran since the last trim, the
free pages go back to the OS, and the threads sync tools ran in end (their stacks go back; a fresh
pool starts threads again on demand). A busy worker never trims (no step is slowed by it), an idle
one trims once. What no trim gives back: pymalloc's 1 MiB arenas that a few live objects keep
after a burst (bench/PROFILE-19.md, section 7). `malloc_trim` only with glibc (found by ctypes);
elsewhere `IdleTrim.trim` is None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Sized
from typing import Protocol


class Activity(Protocol):
    """What the trimmer reads of the process's leases (workers/process/leases.py `Leases`)."""

    @property
    def held(self) -> Sized:
        """The leases held now: one per step running here."""

    @property
    def taken(self) -> int:
        """How many leases were held so far."""


def malloc_trim() -> Callable[[], object] | None:
    """`malloc_trim(0)` of the C library when it has one (glibc), else None."""
    name = ctypes.util.find_library("c")
    try:
        function = getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None
    if function is None:
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: function(0)


class IdleTrim:
    """`tick()` once a sweeper tick: trims when the worker has been idle for `idle_ticks` ticks
    since a step last ran (see the module docstring)."""

    def __init__(
        self,
        leases: Activity,
        *,
        idle_ticks: int = 2,
        trim: Callable[[], object] | None = None,
        shed: Callable[[], None] | None = None,
    ) -> None:
        self.leases = leases
        self.shed = shed
        """Called first when idle (the process's `shed_tool_threads`: a thread's stack goes back
        when it ends)."""
        self.idle_ticks = idle_ticks
        self.trim = trim if trim is not None else malloc_trim()
        self.trims = 0
        self._trimmed_at = self._seen = leases.taken
        self._idle = 0

    def tick(self) -> bool:
        """True when this tick trimmed."""
        if self.trim is None and self.shed is None:
            return False
        taken = self.leases.taken
        if (
            self.leases.held or taken != self._seen
        ):  # a step runs, or ran since the last tick
            self._seen, self._idle = taken, 0
            return False
        self._idle += 1
        if self._idle < self.idle_ticks or taken == self._trimmed_at:
            return False
        self._trimmed_at = taken
        if self.shed is not None:
            self.shed()
        if self.trim is not None:
            self.trim()
        self.trims += 1
        return True
