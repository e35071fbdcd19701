"""Errors of durable runs (everything here survives pickling and Celery's JSON error transport).

    WorkersError
    ├── RunNotFoundError       no run has this id (a typo, or its keys were deleted)
    ├── RunStateError          the run is not in a state that allows this (retry of a run that is not failed)
    ├── ToolsetError           the toolset is not registered, or its registered path does not
    │                          import to a list of ToolSpec
    ├── LimitError             a run spec is over a limit (size, messages, an image): refused at enqueue
    ├── EnqueueError           Redis refused or lost an enqueue (out of memory, unreachable)
    ├── ScheduleError          a schedule's trigger, target or policy is bad: refused when added
    ├── ScheduleNotFoundError  no schedule has this id (never added, removed, or not a schedule id)
    ├── NoRedisError           no REDIS_URL and no embedded server running (nothing to connect to)
    ├── DeliveryLimitError     one step was delivered too many times (its worker keeps dying)
    ├── LeaseLostError         a step's lease is no longer certainly its own (the reason its abort
    │                          signal fired: its work stops, and nothing of it is committed)
    └── StepFailedError        a step ended its run `failed` (how Celery's pool reports it as FAILURE)

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

REDIS_AWAY: tuple[type[BaseException], ...] = tuple(
    kind for kind in REDIS_LOST if issubclass(kind, redis.RedisError)
)
"""REDIS_LOST as redis-py raises it (no bare OSError): what a step's work may meet when Redis is away
(a flow-control booking, a lease round trip) and that makes the step run again, not the run fail.
An OSError from a tool or a provider is theirs, not Redis's."""


class NotReplicatedError(redis.ConnectionError):
    """Redis took a write, but fewer replicas than TOOLLOOP_COMMIT_WAIT confirmed it in time: a failover
    now could lose it, so it counts as not made (a step's commit is retried, a client's call raises)."""

    def __init__(self, wanted: int, got: int, timeout_ms: int) -> None:
        super().__init__(
            f"Redis took the write, but {got} of the {wanted} replicas TOOLLOOP_COMMIT_WAIT asks for "
            f"confirmed it within {timeout_ms} ms, so a failover could lose it.\n"
            "  Send it again (an enqueue or an answer with the same idempotency key is applied once); "
            "check the replicas (INFO replication) if this persists."
        )
        self.wanted, self.got, self.timeout_ms = wanted, got, timeout_ms

    def __reduce__(self) -> tuple[type[NotReplicatedError], tuple[int, int, int]]:
        return NotReplicatedError, (self.wanted, self.got, self.timeout_ms)


def replicated(reply: object, wanted: int, timeout_ms: int) -> None:
    """Raise `NotReplicatedError` unless `reply` (of WAIT) counts `wanted` replicas or more."""
    got = reply if isinstance(reply, int) else 0
    if got < wanted:
        raise NotReplicatedError(wanted, got, timeout_ms)


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


class NoRedisError(WorkersError):
    pass


class DeliveryLimitError(WorkersError):
    pass


class LeaseLostError(WorkersError):
    pass


class LimitError(WorkersError, ValueError):
    """A run spec over one of the limits (workers/client/limits.py); `setting` names the one to raise."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message, setting)
        self.setting = setting


class EnqueueError(WorkersError):
    """`Client.enqueue` could not store the run. The message names no prompt text; `stored` says
    whether the run may exist anyway (None: unknown, the connection was lost mid-call)."""

    def __init__(self, message: str, stored: bool | None = False) -> None:
        super().__init__(message, stored)
        self.stored = stored


class ScheduleError(WorkersError, ValueError):
    """A schedule that cannot be added (workers/protocol/schedules.py): the message names the bad value."""


class ScheduleNotFoundError(WorkersError, KeyError):
    def __init__(self, schedule_id: str) -> None:
        super().__init__(
            f"No schedule has the id {schedule_id[:80]!r}.\n"
            "  List them with `toolloop schedule list` (Client.schedule returns the id)."
        )
        self.schedule_id = schedule_id

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (self.schedule_id,))


class StepFailedError(WorkersError):
    """Raised by the `toolloop.advance` task (Celery's pool) once a step has committed its run as
    `failed`, so Celery and Flower report the task FAILURE; its repr is the run's error class and the
    first line of its message (`ValueError('...')`), as the step consumer reports it."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message, error_class)
        self.error_class = error_class
        self.message = message

    def __repr__(self) -> str:
        return failure_repr(self.error_class, self.message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.error_class, self.message))


def failure_repr(error_class: str, message: str) -> str:
    """How a step that failed its run shows in Flower: `ErrorClass('first line of the message')`.
    Error messages of toolloop name no prompt text; only the first line (what happened), at most 300
    characters, goes out."""
    first = message.splitlines()[0] if message else ""
    return f"{error_class}({first[:300]!r})"
