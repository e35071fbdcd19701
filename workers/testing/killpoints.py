"""Kill points: a test-only hook that SIGKILLs this worker's process group at a named place.

Used by the reliability suite (tests/faults/, docs/faults.md) to crash a worker at every step boundary
and inside every kind of step. It is off, and costs one environment lookup, unless the variable
`TOOLLOOP_KILL_PLAN` names a JSON file holding a list of entries:

    [{"point": "commit:after", "run": "<run id>", "key": "s0/model:2"},
     {"point": "tool:after", "tag": "r3.1.0"}]

An entry matches a call `kill_point(point, **fields)` when its point is the same and every other
field it names has the same value in `fields`. Each entry fires once across every process that
reads the plan: the first match creates `<plan>.fired/<index>` (O_EXCL), appends one JSON line to
`<plan>.log` saying what was killed where, and SIGKILLs the whole process group (the worker, its
pool and its children), as an OOM kill or a machine loss would. A restarted worker reading the same
plan skips the entries already fired, so it makes progress.

In a worker (its hooks a `KillPlan`), every kill's line also says which steps the kill interrupts,
whichever point it fired at (a worker hook, or the fault suite's tools and model wrapper, which
read the worker's record from `<plan>.steps/<pid>`): `in_flight`, run id -> when this process began
its step (`advance:begin`), for each step whose commit Redis did not hold when the process died; and
`landed`, run id -> [n, ...], for tasks still on the process's list whose commit `n` Redis already
held (their commit script ran and the process had not reached `commit:after` yet, or a redelivered
copy of a committed task that left `stale`). Redis is asked (the run's
state `n`) just before the SIGKILL: a step listed under `in_flight` had not committed then.

Points of the worker's step: the hooks of workers/observe/hooks.py. When TOOLLOOP_KILL_PLAN is set, the
worker process installs a `KillPlan` as its hooks (the step's code is the same either way):
    advance:begin   task `n` of a run was received, before it loads the run (a step boundary)
    commit:before   the step's work returned, before the commit script
    commit:after    the commit script ran, before the successor is enqueued
    enqueue:after   the successor was enqueued (its batch written), before the task returns
    work:before     a step's model call or tool is about to begin (its state read, its cancel not armed)
    answer:after    an answer was stored, before the resume is enqueued (field `run` only)
    mcp:called      an MCP tool's `tools/call` returned, before its step is committed (run, key, tool)
    spawn:after     `spawn`'s start stored its children and queued them, before its step is committed
                    (run, key = "<segment>/<call id>"; workers/step/children.py): a fan-out cut short
    mcp:task        an MCP task was created and journaled, before its start step is committed (run,
                    key, tool, task)
    mcp:polled      an MCP task's wait read its status from `tasks/get` (run, key, task, status)
    stream:write    a streaming run queues its `write`-th delta write of a step (workers/process/deltas.py;
                    the writes before it reached Redis in earlier loop turns): a worker dying mid-stream
Points called from the fault suite's own tools and model wrapper (field `tag`): see tests/faults/.

Stop points (`stop_point`) freeze instead of kill: the first match SIGSTOPs this process (every
thread of it) after logging, as a long GC or VM pause, or a Redis stall, would; the test sends
SIGCONT. The lease suite (tests/faults/test_lease_freeze.py) freezes a worker past its lease there:
    model:send      in the model wrapper, just before the model call is sent
    model:inflight  in the model wrapper, once the simulator has the call (tests/faults/test_lease_pause.py)
    tool:inside     inside a one-phase tool, before its effect
    start:inside    inside a two-phase tool's start, before its effect
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import redis

from toolloop import redisurl
from workers.observe.hooks import Hooks
from workers.protocol import keys

PLAN_ENV = "TOOLLOOP_KILL_PLAN"


@functools.cache
def _plan(path: str) -> tuple[dict[str, Any], ...]:
    """The entries of the plan file at `path`, read once (a plan never changes while it runs)."""
    with open(path, encoding="utf-8") as file:
        return tuple(json.load(file))


def _matches(entry: dict[str, Any], point: str, fields: dict[str, Any]) -> bool:
    if entry.get("point") != point:
        return False
    return all(
        fields.get(name) == value
        for name, value in entry.items()
        if name not in ("point", "action")
    )


def active() -> bool:
    """True when a kill plan is set (tests only)."""
    return bool(os.environ.get(PLAN_ENV))


def pending(point: str, **fields: Any) -> bool:
    """True when the plan has an entry for this point and fields that has not fired yet."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return False
    return any(
        _matches(entry, point, fields)
        and not os.path.exists(os.path.join(f"{path}.fired", str(index)))
        for index, entry in enumerate(_plan(path))
    )


def claim(point: str, **fields: Any) -> bool:
    """True once for the first call that matches an entry not yet fired (and records it as fired).

    For callers that kill another process themselves; `kill_point` is claim + SIGKILL of self.
    """
    path = os.environ.get(PLAN_ENV)
    if not path:
        return False
    for index, entry in enumerate(_plan(path)):
        if not _matches(entry, point, fields):
            continue
        fired = f"{path}.fired"
        os.makedirs(fired, exist_ok=True)
        try:
            os.close(
                os.open(
                    os.path.join(fired, str(index)),
                    os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                )
            )
        except FileExistsError:
            continue
        record = {
            "index": index,
            "point": point,
            **fields,
            "pid": os.getpid(),
            "at": time.time(),
        }
        line = (json.dumps(record, default=str) + "\n").encode()
        descriptor = os.open(
            f"{path}.log", os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644
        )
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
        return True
    return False


def _steps_file(path: str, pid: int) -> str:
    return os.path.join(f"{path}.steps", f"{pid}.json")


def interrupted(path: str) -> dict[str, Any]:
    """`in_flight` and `landed` (see the module docstring) of this process, from the record its
    `KillPlan` keeps in `<plan>.steps/<pid>`, checked against Redis now; {} outside a worker."""
    try:
        with open(_steps_file(path, os.getpid()), encoding="utf-8") as file:
            record = json.load(file)
    except FileNotFoundError:
        return {}
    steps = {
        run: {int(n): since for n, since in tasks.items()}
        for run, tasks in record["steps"].items()
    }
    if not record["redis"]:  # a KillPlan built without a Redis URL (a unit test's)
        return {"in_flight": _first(steps), "landed": {}, "unchecked": "no Redis URL"}
    try:
        client = redisurl.sync_client(
            record["redis"], socket_timeout=2.0, decode_responses=True
        )
        with client:
            pipe = client.pipeline(transaction=False)
            for run in steps:
                pipe.hget(keys.state(run), "n")
            done = {
                run: int(n or 0) for run, n in zip(steps, pipe.execute(), strict=True)
            }
    except (
        redis.RedisError
    ) as error:  # Redis away (a Redis fault test): every listed step counts
        return {"in_flight": _first(steps), "landed": {}, "unchecked": repr(error)}
    open_ = {
        run: {n: t for n, t in tasks.items() if n > done[run]}
        for run, tasks in steps.items()
    }
    landed = {
        run: sorted(n for n in tasks if n <= done[run]) for run, tasks in steps.items()
    }
    return {
        "in_flight": _first(open_),
        "landed": {run: ns for run, ns in landed.items() if ns},
    }


def _first(steps: dict[str, dict[int, float]]) -> dict[str, float]:
    """run id -> when its lowest open task began: the one that can hold the run's lease (a higher
    one is early and does nothing)."""
    return {run: tasks[min(tasks)] for run, tasks in steps.items() if tasks}


@contextlib.contextmanager
def _steps_held(path: str) -> Iterator[None]:
    """Hold this process's step record still (an exclusive flock of `<plan>.steps/<pid>.lock`): no
    step of it begins or commits on the record (`KillPlan.point` waits) until released, so a kill
    decided from one thread (a tool's, a control task's) lists what the others are doing then."""
    lock = f"{_steps_file(path, os.getpid())}.lock"
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    descriptor = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def kill_point(point: str, **fields: Any) -> None:
    """SIGKILL this process group when the plan has an unfired entry for this point and fields."""
    path = os.environ.get(PLAN_ENV)
    if not path or not pending(point, **fields):
        return
    with _steps_held(path):  # until the SIGKILL: the line lists the steps the kill ends
        if claim(point, **fields, **interrupted(path)):
            group = os.getpgid(0)
            if group in (
                os.getpid(),
                os.getppid(),
            ):  # the worker leads its group: kill all of it
                os.killpg(group, signal.SIGKILL)
            # never kill a group we do not lead (a test runner's)
            os.kill(os.getpid(), signal.SIGKILL)


def stop_point(point: str, **fields: Any) -> None:
    """SIGSTOP this process when the plan has an unfired entry for this point and fields; it goes on
    where it stopped once someone sends it SIGCONT."""
    if os.environ.get(PLAN_ENV) and claim(point, **fields):
        # to this thread: it stops on its way out of the call (a SIGSTOP sent to the process may be
        # taken by another thread, and this one would run on for a moment); the whole process stops
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        time.sleep(0.01)


class KillPlan(Hooks):
    """The worker hooks of a kill plan: each point of workers/observe/hooks.py is a kill point of the plan
    at `path` (entries for other points are the fault suite's own: its tools and model)."""

    def __init__(self, path: str, redis_url: str = "") -> None:
        self.path = path
        self.redis_url = redis_url
        self.steps: dict[str, dict[int, float]] = {}
        """run id -> {n: when this process began task `n` (`advance:begin`)}, until a commit of the
        run landed here (`commit:after`): the steps a kill here may interrupt. Per task, as a
        redelivered copy of a committed task can begin beside the run's next one (it leaves `stale`,
        with no commit). Kept in
        `<plan>.steps/<pid>` too (rewritten whole at each change), so that a kill from a tool's thread
        lists them; `interrupted` drops those whose commit Redis holds (the script ran, `commit:after`
        not reached yet). The fault suite lets each of the others run again once
        (tests/faults/matrix.py `allowed_reruns`)."""
        self.lock = threading.Lock()
        """`point` is called from the loop thread, tools' threads and control tasks' threads."""

    def point(self, name: str, **fields: Any) -> None:
        run = str(fields.get("run") or "")
        if run and name in ("advance:begin", "commit:after"):
            with self.lock, _steps_held(self.path):
                if (
                    name == "advance:begin"
                ):  # a second copy of task n keeps the first's time
                    self.steps.setdefault(run, {}).setdefault(
                        int(fields.get("n") or 0), time.time()
                    )
                else:  # its successor, if this process runs it (go_on), begins after this
                    self.steps.pop(run, None)
                self._write()
        kill_point(name, **fields)

    def _write(self) -> None:
        """The record `interrupted` reads, replaced whole (a reader sees the old one or the new)."""
        target = _steps_file(self.path, os.getpid())
        os.makedirs(os.path.dirname(target), exist_ok=True)
        staging = f"{target}.{threading.get_ident()}"
        with open(staging, "w", encoding="utf-8") as file:
            json.dump({"redis": self.redis_url, "steps": self.steps}, file)
        os.replace(staging, target)

    def sent(
        self, name: str, flushed: Callable[[], Awaitable[Any]], **fields: Any
    ) -> Awaitable[None] | None:
        if not pending(name, **fields):
            return None
        return self._after(flushed, name, fields)

    async def _after(
        self, flushed: Callable[[], Awaitable[Any]], name: str, fields: dict[str, Any]
    ) -> None:
        # a kill after the send must follow the write: wait for the batch that carries it (a failed
        # send is the outbox's to repair; the kill still comes)
        with contextlib.suppress(Exception):
            await flushed()
        kill_point(name, **fields)
