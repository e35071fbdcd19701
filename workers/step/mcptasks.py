"""MCP Tasks (2025-11-25, task-augmented `tools/call`) as two-phase tools.

A server tool listed with `execution.taskSupport: "required"` is a two-phase tool (SPEC 2.4's
`start` and `wait`, two journal steps `tool:<id>:start` and `tool:<id>:wait`):

- `start` sends the task-augmented `tools/call` (its `_meta` carries the step's idempotency key, as
  any MCP call) and writes what it got to the run's `tl:{<run>}:mcptasks` hash, field = the step's
  key, before the step commits: the server, the tool, the task id and, when the server gave the
  session an `Mcp-Session-Id`, that id and the session's handshake (a server such as
  server-everything keeps each session's tasks apart). A start that runs again (its worker died
  before the commit) finds the record and sends nothing: the task is not started twice. What is
  left is the time between the server's answer and that one HSET.
- `wait` polls `tasks/get` on the session the task is bound to (the process's own connection when it
  is that session, else a connection that sends the journaled session id and adopts the journaled
  handshake, so the server sees the same session), then reads `tasks/result`. A worker that dies
  while waiting leaves the wait step uncommitted; the step runs again, reads the same handle, and
  polls the same task id at once.
- A run cancelled while it waits sends `tasks/cancel`; a wait stopped for any other reason (its
  lease lost, the worker stopping) sends nothing and is not committed, so another worker goes on
  polling.
- `input_required`: toolloop advertises no elicitation or sampling, so a conforming server does not
  ask; a task that does is cancelled and the model reads an error result saying what it wanted
  (docs/mcp.md says why it is not the run's `ask`).
- A task the server no longer knows (`-32602`: expired, or its server restarted: a stdio server dies
  with the worker that started it) is an error result, never a second start.

The record's `ended` field says how each task ended (completed, failed, cancelled, gone, ...;
`cancel_failed`: the server did not answer `tasks/cancel`, the task may run until its ttl).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mcp_types
from pydantic import BaseModel, ValidationError

from toolloop.abort import AbortSignal
from toolloop.contract import TextPart
from toolloop.journal.base import idempotency_key
from toolloop.loop.types import Started, ToolOutput, ToolSpec
from workers.config.mcp import McpServer
from workers.process.mcpservers import Bound, McpCallError, Task
from workers.protocol import keys

if TYPE_CHECKING:
    from workers.process.worker_process import WorkerProcess

log = logging.getLogger("toolloop.workers")

META_KEY = "toolloop/idempotency_key"
"""The `_meta` field of every `tools/call` that carries the step's idempotency key."""
Convert = Callable[[mcp_types.CallToolResult], ToolOutput]

TASK_TTL_MS = 3_600_000
"""The `ttl` a task-augmented call asks for (one hour); the server may give less."""
POLL_S = (0.2, 5.0)
"""The least and most time between two `tasks/get` (the server's `pollInterval`, clamped)."""
FAILURES = 3
"""`tasks/get` failing this many times in a row (the server unreachable) ends the wait in an error
result, after a `tasks/cancel`."""


def task_spec(
    process: WorkerProcess,
    server: McpServer,
    name: str,
    description: str,
    schema: type[BaseModel],
    needs_approval: bool,
    convert: Convert,
) -> ToolSpec:
    """The two-phase ToolSpec of a server tool whose calls must be tasks; `convert` makes the task's
    `CallToolResult` what the model reads (workers/step/mcptools.py `output_of`)."""

    async def start(checked: BaseModel, signal: AbortSignal) -> Started:
        key = idempotency_key() or ""
        run_id = key.split("/", 1)[0]
        client = process.batch.client
        kept = await client.hget(keys.mcp_tasks(run_id), key)
        if (
            kept is not None
        ):  # this start ran before and got a task: the same one, not another
            return Started(started=json.loads(kept))
        meta = {META_KEY: key}
        try:
            task, where = await process.mcp.call_task(
                server, name, checked.model_dump(mode="json"), meta, TASK_TTL_MS
            )
        except McpCallError as error:
            return Started(started={"error": str(error)})
        handle = {
            "server": server.label,
            "tool": name,
            "task": task["taskId"],
            "where": where,
        }
        await client.hset(
            keys.mcp_tasks(run_id), key, json.dumps(handle, separators=(",", ":"))
        )
        process.hooks.point(
            "mcp:task", run=run_id, key=key, tool=name, task=task["taskId"]
        )
        return Started(started=handle)

    async def wait(handle: dict[str, Any], signal: AbortSignal) -> ToolOutput:
        if "error" in handle:
            return error_output(str(handle["error"]))
        return await _wait(process, server, handle, signal, convert)

    return ToolSpec(
        name=name,
        description=description,
        schema=schema,
        start=start,
        wait=wait,
        needs_approval=needs_approval,
    )


async def _wait(
    process: WorkerProcess,
    server: McpServer,
    handle: dict[str, Any],
    signal: AbortSignal,
    convert: Convert,
) -> ToolOutput:
    task_id = str(handle["task"])
    where: Bound | None = (
        (str(handle["where"][0]), dict(handle["where"][1]))
        if handle.get("where")
        else None
    )
    key = idempotency_key() or ""
    run_id = key.split("/", 1)[0]
    start_key = key.removesuffix(":wait") + ":start"
    label = f"task {task_id!r} of {server.label!r}"
    failures, first = 0, True
    while True:
        if signal.aborted:
            if signal.reason == "cancel":  # the run was cancelled: so is its task
                cancelled = await _cancel(process, server, where, task_id)
                await _ended(
                    process,
                    run_id,
                    start_key,
                    "cancelled" if cancelled else "cancel_failed",
                )
            signal.throw_if_aborted()
        try:
            task = Task.model_validate(
                await process.mcp.task_request(server, where, "tasks/get", task_id)
            )
        except McpCallError as error:
            if error.code == mcp_types.INVALID_PARAMS:
                await _ended(process, run_id, start_key, "gone")
                await process.mcp.release(server, where)
                return error_output(
                    f"The MCP {label} is gone: the server no longer knows it (it expired, or the "
                    "server restarted; a stdio server ends with the worker that started it). It was "
                    "not started again."
                )
            failures += 1
            if failures >= FAILURES:
                cancelled = await _cancel(process, server, where, task_id)
                await _ended(process, run_id, start_key, "unreachable")
                after = (
                    "it was cancelled"
                    if cancelled
                    else "tasks/cancel failed too: it may still run"
                )
                return error_output(
                    f"{error}\n  The {label} could not be polled {FAILURES} times in a row; {after}."
                )
            await _pause(signal, 1.0)
            continue
        except ValidationError:
            await _cancel(process, server, where, task_id)
            await _ended(process, run_id, start_key, "malformed")
            return error_output(
                f"The MCP server {server.label!r} answered tasks/get with what is not a Task."
            )
        if failures == 0 and first:
            log.info(
                "run %s: %s is %s (the first tasks/get of this wait)",
                run_id,
                label,
                task.status,
            )
        failures, first = 0, False
        process.hooks.point(
            "mcp:polled", run=run_id, key=key, task=task_id, status=task.status
        )
        if task.status in ("completed", "failed"):
            return await _result(
                process, server, where, task, run_id, start_key, convert
            )
        if task.status == "cancelled":
            await _ended(process, run_id, start_key, "cancelled")
            await process.mcp.release(server, where)
            return error_output(
                f"The MCP {label} was cancelled by the server: {task.status_message or ''}"
            )
        if task.status == "input_required":
            await _cancel(process, server, where, task_id)
            await _ended(process, run_id, start_key, "input_required")
            return error_output(
                f"The MCP {label} asked for input ({task.status_message or 'no message'}); toolloop "
                "gives MCP tasks no input, so it was cancelled."
            )
        interval = (task.poll_interval or 1000) / 1000
        await _pause(signal, min(max(interval, POLL_S[0]), POLL_S[1]))


async def _result(
    process: WorkerProcess,
    server: McpServer,
    where: Bound | None,
    task: Task,
    run_id: str,
    start_key: str,
    convert: Convert,
) -> ToolOutput:
    try:
        raw = await process.mcp.task_request(
            server, where, "tasks/result", task.task_id
        )
        result = mcp_types.CallToolResult.model_validate(raw)
    except (
        McpCallError
    ) as error:  # a failed task's result may be the JSON-RPC error itself
        await _ended(process, run_id, start_key, task.status)
        await process.mcp.release(server, where)
        return error_output(str(error).splitlines()[0])
    except ValidationError:
        await _ended(process, run_id, start_key, "malformed")
        await process.mcp.release(server, where)
        return error_output(
            f"The MCP server {server.label!r} answered tasks/result with what is not a CallToolResult."
        )
    await _ended(process, run_id, start_key, task.status)
    await process.mcp.release(server, where)
    output = convert(result)
    if task.status == "failed" and not output.is_error:
        output = output.model_copy(update={"is_error": True})
    return output


async def _cancel(
    process: WorkerProcess, server: McpServer, where: Bound | None, task_id: str
) -> bool:
    """`tasks/cancel`, once, best effort (a task already over answers an error: nothing to do).
    True when the server answered it."""
    try:
        await process.mcp.task_request(server, where, "tasks/cancel", task_id)
    except McpCallError as error:
        log.warning(
            "tasks/cancel of MCP task %r of %r: %s",
            task_id,
            server.label,
            str(error).splitlines()[0],
        )
        return False
    finally:
        await process.mcp.release(server, where)
    return True


async def _ended(process: WorkerProcess, run_id: str, start_key: str, how: str) -> None:
    """Mark the task's record with how it ended (what docs/mcp.md calls 0 orphaned tasks)."""
    client = process.batch.client
    kept = await client.hget(keys.mcp_tasks(run_id), start_key)
    if kept is None:
        return
    record = json.loads(kept)
    record["ended"] = how
    await client.hset(
        keys.mcp_tasks(run_id), start_key, json.dumps(record, separators=(",", ":"))
    )


async def cancel_open(process: WorkerProcess, run_id: str) -> int:
    """A run stopped by a cancel: `tasks/cancel` for each task it started that has not ended (its
    start committed, and the cancel came before its wait polled it). Returns how many it sent."""
    client = process.batch.client
    stored: dict[str, str] = await client.hgetall(keys.mcp_tasks(run_id))  # type: ignore[assignment]
    sent = 0
    for start_key, text in stored.items():
        record = json.loads(text)
        if "ended" in record or "task" not in record:
            continue
        server = _server(process, str(record["server"]))
        if server is None:
            continue
        where = record.get("where")
        bound = (str(where[0]), dict(where[1])) if where else None
        task_id = str(record["task"])
        cancelled = await _cancel(process, server, bound, task_id)
        how = "cancelled" if cancelled else "cancel_failed"
        await _ended(process, run_id, start_key, how)
        log.info(
            "run %s stopped by a cancel: MCP task %r of %r %s",
            run_id,
            task_id,
            server.label,
            how,
        )
        sent += 1
    return sent


def _server(process: WorkerProcess, label: str) -> McpServer | None:
    """The registered server labelled `label` ("docs", "docs#2"), if this worker still has it."""
    try:
        toolset = process.toolsets.toolset(label.split("#", 1)[0])
    except (KeyError, ValueError):
        return None
    return next((server for server in toolset.servers if server.label == label), None)


async def _pause(signal: AbortSignal, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await signal.wait()


def error_output(text: str) -> ToolOutput:
    return ToolOutput(value=text, content=[TextPart(text=text)], is_error=True)
