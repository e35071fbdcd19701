"""Errors of durable runs (everything here survives pickling and Celery's JSON error transport).

    WorkersError
    ├── RunNotFoundError       no run has this id (a typo, or its keys were deleted)
    ├── RunStateError          the run is not in a state that allows this (retry of a run that is not failed)
    ├── ToolsetError           the toolset is not registered, or its registered path does not
    │                          import to a list of ToolSpec
    ├── LimitError             a run spec is over a limit (size, messages, an image): refused at enqueue
    ├── EnqueueError           Redis refused or lost an enqueue (out of memory, unreachable)
    ├── DeliveryLimitError     one step was delivered too many times (its worker keeps dying)
    └── LeaseLostError         a step's lease is no longer certainly its own (the reason its abort
                               signal fired: its work stops, and nothing of it is committed)

Every message: first line what happened, second line (indented) what to do.
"""

from __future__ import annotations

import redis

REDIS_LOST: tuple[type[BaseException], ...] = (
    OSError,
    redis.ConnectionError,  # BusyLoadingError (a restarted Redis loading its AOF) included
    redis.TimeoutError,
    redis.ReadOnlyError,  # a replica promoted under us
    redis.exceptions.OutOfMemoryError,  # maxmemory reached (noeviction): nothing of the write was made
)
"""What a step fails with when Redis or the network went away, or Redis is full (maxmemory): the step
goes back on its queue and runs again; any other error fails the step. (Scripts are atomic under
OOM too: Redis refuses a script at its first write that needs memory, before it wrote anything.)"""

OOM_HINT = (
    "Redis is out of memory (maxmemory reached, policy noeviction): it refuses writes that need memory.\n"
    "  Raise maxmemory (CONFIG SET maxmemory <bytes>, and in redis.conf) or free memory (delete the "
    "keys of finished runs you no longer need); runs go on by themselves once Redis accepts writes."
)
"""What a worker logs when Redis refuses a write for OOM."""


class WorkersError(Exception):
    """Base class of the errors of `workers`."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__


class RunNotFoundError(WorkersError, KeyError):
    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"No run has the id {run_id!r}.\n"
            "  Check the id (Client.enqueue returns it), and that the client uses the worker's REDIS_URL."
        )
        self.run_id = run_id

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (self.run_id,))


class RunStateError(WorkersError):
    pass


class ToolsetError(WorkersError, ValueError):
    pass


class DeliveryLimitError(WorkersError):
    pass


class LeaseLostError(WorkersError):
    pass


class LimitError(WorkersError, ValueError):
    """A run spec over one of the limits (workers/limits.py); `setting` names the one to raise."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message, setting)
        self.setting = setting


class EnqueueError(WorkersError):
    """`Client.enqueue` could not store the run. The message names no prompt text; `stored` says
    whether the run may exist anyway (None: unknown, the connection was lost mid-call)."""

    def __init__(self, message: str, stored: bool | None = False) -> None:
        super().__init__(message, stored)
        self.stored = stored
