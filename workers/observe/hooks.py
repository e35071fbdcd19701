"""Observation points of a worker: what the fault suite (and any test) may watch or break.

A `WorkerProcess` holds one `Hooks`; the default does nothing, and the step runs the same code with
or without another one installed (temporalio's interceptors, dramatiq's middleware): the path under
test is the production path. The kill plans of the fault suite (workers/testing/killpoints.py `KillPlan`,
installed when TOOLLOOP_KILL_PLAN names a plan) crash or freeze the worker at these points:

    advance:begin   task `n` of a run was received, before it loads the run (fields run, n)
    commit:before   the step's work returned, before the commit script (run, key)
    commit:after    the commit script ran, before the successor is sent (run, key)
    enqueue:after   the successor was sent (`sent`), before the task returns and is acked (run, key)
    work:before     a step read the run's state and its work (model call, tool) is about to begin,
                    before its cancel is armed (run, key: the step key, e.g. "tool:toolu_01")
    answer:after    an answer was stored, before the resume is sent (run)
    stream:write    a batch of a streaming model step's deltas is about to be queued (run, key, write)
    mcp:called      an MCP tool's `tools/call` returned, before its step is committed (run, key: the
                    call's idempotency key, tool: the MCP tool's name; workers/step/mcptools.py)
    mcp:task        a task-augmented `tools/call` returned and its task was journaled, before the
                    start step is committed (run, key, tool, task: the task id; workers/step/mcptasks.py)
    mcp:polled      a two-phase MCP tool's wait read its task's status (run, key, task, status)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class Hooks:
    """No-op observation points (see the module docstring); subclass to watch or inject faults."""

    def point(self, name: str, **fields: Any) -> None:
        """A named place in a step was reached (synchronous: it may kill the process)."""

    def sent(
        self, name: str, flushed: Callable[[], Awaitable[Any]], **fields: Any
    ) -> Awaitable[None] | None:
        """A successor was handed to the process's Redis batch. `flushed()` waits until the batch
        that carries it was written. An awaitable is awaited by the step before it goes on."""
        return None


NO_HOOKS = Hooks()
"""The hooks of a process that installs none (immutable: shared)."""
