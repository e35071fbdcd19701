"""`McpServers`: the MCP connections one worker process owns, on its asyncio loop.

One connection per registered server (workers/config/mcp.py `McpServer`), opened when a run first
needs it with the official `mcp` SDK's `Client`: a stdio server is one child process of the worker,
started once and started again when it died; a streamable-HTTP server is one session over one pooled
keep-alive HTTP client. Every run of the process shares them; calls go out concurrently on the same
session (JSON-RPC ids tell them apart).

A connection lives in a task of its own (`_Connection._own`): the SDK's transports are anyio context
managers, entered and left in one task. Callers only send requests over it. What a call can meet
becomes an `McpCallError` with a two-line message, and never reaches the worker's loop: the server
does not start or answer the handshake (`timeout_s`), a call outlives `timeout_s`, the server dies
mid-call or answers what is not JSON-RPC (the connection is dropped: the next call starts it again).
`${VAR}` in a server's headers or env is filled in here, from the worker's environment, and is in
no error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any, Literal

import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client._probe import negotiate_auto
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.config.mcp import McpServer, expand
from workers.protocol.errors import ToolsetError

log = logging.getLogger("toolloop.workers")


class McpCallError(Exception):
    """A request to an MCP server that did not get a usable answer (see the module docstring);
    `code`: the JSON-RPC error code when the server answered with an error."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


Bound = tuple[str, dict[str, Any]]
"""Where an MCP task lives on a server that binds tasks to sessions: the `Mcp-Session-Id` and the
handshake (`InitializeResult`, without its instructions) of the session it was created on."""


class TaskRequest(mcp_types.Request[dict[str, Any], str]):
    """A `tasks/*` request (MCP 2025-11-25): the SDK's session sends it as any request; its result
    is not in the SDK's per-version tables, so it is checked as the model it is read with."""

    method: str
    params: dict[str, Any]


class AnyResult(BaseModel):
    """A result kept whole (its fields checked by workers/step/mcptasks.py)."""

    model_config = ConfigDict(extra="allow")


class Task(BaseModel):
    """The MCP `Task` (2025-11-25, basic/utilities/tasks): what `tasks/get` answers and a
    `CreateTaskResult` carries."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    task_id: str = Field(alias="taskId", min_length=1, max_length=512)
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = Field(default=None, alias="statusMessage")
    poll_interval: int | None = Field(default=None, alias="pollInterval")
    ttl: int | None = None


class CreatedTask(BaseModel):
    """`CreateTaskResult`: the answer of a task-augmented request."""

    task: Task


START_TIMEOUT_S = 15.0
"""The least time a server gets to start and finish its handshake (a stdio server's interpreter and
imports can take seconds on a busy machine): `timeout_s` when that is longer."""


def start_timeout(server: McpServer) -> float:
    return max(server.timeout_s, START_TIMEOUT_S)


@dataclasses.dataclass
class Live:
    """One open session: the SDK's `ClientSession` over the `JSONRPCDispatcher` it runs on (held
    here so a task-augmented `tools/call`, whose `CreateTaskResult` the session's typed layer
    refuses, can go out as the dispatcher's raw request: workers/step/mcptasks.py), and, over HTTP, the
    `Mcp-Session-Id` the server gave it (a task bound to its session is found again by it)."""

    session: ClientSession
    dispatcher: JSONRPCDispatcher
    session_id: str | None = None


class _Connection:
    """One server's session, owned by a task; `client()` starts it (again) when it is not up.

    `resume`, for an HTTP server: the journaled session id and handshake of a session another
    process opened (a task bound to it): the connection sends that `Mcp-Session-Id` and adopts the
    handshake instead of making one (the server keeps the session; a new handshake would open
    another)."""

    def __init__(
        self, server: McpServer, resume: tuple[str, dict[str, Any]] | None = None
    ) -> None:
        self.server = server
        self.resume = resume
        self._client: Live | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Live] | None = None
        self._closing: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.starts = 0
        """How many times this process started (or connected to) the server."""

    async def client(self) -> Live:
        async with self._lock:
            if (
                self._client is not None
                and self._task is not None
                and not self._task.done()
            ):
                return self._client
            self._drop()
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Live] = loop.create_future()
            self._ready = ready
            self._closing = asyncio.Event()
            self.starts += 1
            self._task = loop.create_task(
                self._own(ready, self._closing), name=f"mcp:{self.server.label}"
            )
            try:
                async with asyncio.timeout(start_timeout(self.server)):
                    self._client = client = await asyncio.shield(ready)
            except TimeoutError:
                self._drop()
                raise McpCallError(
                    f"The MCP server {self.server.label!r} ({self.server.where}) did not finish its "
                    f"handshake in {start_timeout(self.server):g} s.\n"
                    "  Check that it starts and answers (`toolloop doctor`), or raise its timeout_s."
                ) from None
            return client

    async def _own(self, ready: asyncio.Future[Live], closing: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                seen: dict[str, str] = {}
                read, write = await stack.enter_async_context(
                    self._transport(stack, seen)
                )
                dispatcher = JSONRPCDispatcher(read, write)
                session = await stack.enter_async_context(
                    ClientSession(dispatcher=dispatcher)
                )
                if self.resume is not None:
                    session.adopt(
                        mcp_types.InitializeResult.model_validate(self.resume[1])
                    )
                else:  # what the SDK's Client(mode="auto") does: discover, else initialize
                    await negotiate_auto(session)
                live = Live(
                    session,
                    dispatcher,
                    self.resume[0] if self.resume else seen.get("id"),
                )
                if not ready.done():
                    ready.set_result(live)
                await closing.wait()
        except (
            BaseException
        ) as error:  # the connection failed or ended: the next call starts it again
            if not ready.done():
                ready.set_exception(_start_error(self.server, error))
            if not isinstance(error, asyncio.CancelledError | Exception):
                raise
        finally:
            if not ready.done():
                ready.set_exception(
                    McpCallError(
                        f"The MCP server {self.server.label!r} closed.\n  Retry."
                    )
                )

    def _transport(self, stack: contextlib.AsyncExitStack, seen: dict[str, str]) -> Any:
        server = self.server
        if server.url is not None:
            headers = {
                name: expand(value, label=server.label)
                for name, value in server.headers
            }
            if self.resume is not None:
                headers[MCP_SESSION_ID] = self.resume[0]
            http = create_mcp_http_client(
                headers=headers,
                timeout=httpx2.Timeout(
                    server.timeout_s, read=max(server.timeout_s, 300.0)
                ),
            )

            async def session_id(response: httpx2.Response) -> None:
                found = response.headers.get(MCP_SESSION_ID)
                if found and "id" not in seen:
                    seen["id"] = found

            http.event_hooks = {"request": [], "response": [session_id]}
            stack.push_async_callback(http.aclose)
            # Not terminated on close: a task started on this session outlives the connection (and
            # the worker); the server expires the session.
            return streamable_http_client(
                server.url, http_client=http, terminate_on_close=False
            )
        # Only the server's own `env` over the SDK's default environment (HOME, PATH, ...): the
        # worker's environment, its provider keys among it, is not handed to the server.
        env = {name: expand(value, label=server.label) for name, value in server.env}
        command = [expand(part, label=server.label) for part in server.command]
        return stdio_client(
            StdioServerParameters(command=command[0], args=command[1:], env=env)
        )

    @property
    def session_id(self) -> str | None:
        """The `Mcp-Session-Id` of the open session (None: not open, or not HTTP)."""
        return self._client.session_id if self._client is not None else None

    def dead(self) -> None:
        """The session broke (closed mid-call, malformed answers): the next call starts it again."""
        self._drop()

    def _drop(self) -> None:
        client, self._client = self._client, None
        if self._closing is not None:
            self._closing.set()
        task = self._task
        if task is not None and not task.done() and client is None:
            task.cancel()
        self._task = None

    async def aclose(self) -> None:
        task = self._task
        self._drop()
        if task is not None:
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(5):
                    await task


def _start_error(server: McpServer, error: BaseException) -> McpCallError:
    reason = _reason(error)
    return McpCallError(
        f"The MCP server {server.label!r} ({server.where}) could not be reached: {reason}.\n"
        "  Check that it starts and answers (`toolloop doctor`); the next call tries again."
    )


def _reason(error: BaseException) -> str:
    """A short reason for `error` that carries no header or env value (only its type and SDK text)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _reason(error.exceptions[0])
    if isinstance(
        error, ToolsetError
    ):  # a ${VAR} that is not set: it names VAR, never a value
        return str(error).splitlines()[0].rstrip(".")
    if isinstance(error, MCPError):
        return f"MCP error {error.code}: {error.message[:300]}"
    if isinstance(error, httpx2.HTTPStatusError):
        return f"HTTP {error.response.status_code}"
    if isinstance(error, httpx2.HTTPError | OSError):
        return f"{type(error).__name__}: {str(error)[:200] or 'connection failed'}"
    return type(error).__name__


class McpServers:
    """The process's MCP connections, by server label (made on first use; see the module docstring)."""

    def __init__(self) -> None:
        self._connections: dict[str, _Connection] = {}
        self.specs: dict[tuple[McpServer, str], list[Any]] = {}
        """The ToolSpecs made of each journaled tool list, by (server, digest of the list)
        (workers/step/mcptools.py `specs_for`): a run's steps reuse them."""

    def connection(self, server: McpServer) -> _Connection:
        found = self._connections.get(server.label)
        if found is None or found.server != server:
            found = self._connections[server.label] = _Connection(server)
        return found

    def bound(self, server: McpServer, where: Bound | None) -> _Connection:
        """The connection a task bound to `where` (a session id and its handshake, journaled with
        the task) is reached on: the process's own when it is that session (or `where` is None: a
        stdio server, or one that gave no session id), else one that resumes that session."""
        own = self.connection(server)
        if where is None:
            return own
        live = own._client
        if live is not None and live.session_id == where[0]:
            return own
        key = f"{server.label}\x00{where[0]}"
        found = self._connections.get(key)
        if found is None or found.server != server:
            found = self._connections[key] = _Connection(server, resume=where)
        return found

    async def list_tools(self, server: McpServer) -> list[mcp_types.Tool]:
        """Every tool the server lists (all pages), or `McpCallError`."""
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang a run
            page = await self._request(
                server,
                "tools/list",
                lambda c, cur=cursor: c.session.list_tools(
                    params=mcp_types.PaginatedRequestParams(cursor=cur)
                ),
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise McpCallError(
            f"The MCP server {server.label!r} listed more than 100 pages of tools.\n"
            "  Check the server's tools/list pagination."
        )

    async def call_tool(
        self,
        server: McpServer,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
    ) -> mcp_types.CallToolResult:
        """One `tools/call`, or `McpCallError` (the call may have reached the server)."""
        result: mcp_types.CallToolResult = await self._request(
            server,
            f"tools/call {name!r}",
            lambda c: c.session.call_tool(
                name, arguments, read_timeout_seconds=server.timeout_s, meta=meta
            ),
        )
        return result

    async def call_task(
        self,
        server: McpServer,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        ttl_ms: int,
    ) -> tuple[dict[str, Any], Bound | None]:
        """One task-augmented `tools/call` (MCP 2025-11-25 Tasks): the `CreateTaskResult`'s task (JSON,
        checked) and where the task is bound (None: the process's own connection, which is the
        server's only session, as over stdio). `McpCallError` when there is no task."""
        params = {
            "name": name,
            "arguments": arguments,
            "task": {"ttl": ttl_ms},
            "_meta": meta,
        }

        async def send(live: Live) -> tuple[dict[str, Any], Bound | None]:
            version = live.session.protocol_version or ""
            handshake = live.session.initialize_result
            if handshake is None:
                raise McpCallError(
                    f"The MCP server {server.label!r} speaks MCP {version}, where tasks are an "
                    "extension toolloop does not implement (it implements 2025-11-25 Tasks).\n"
                    "  Call the tool without a task, or serve it at 2025-11-25."
                )
            raw = await live.dispatcher.send_raw_request(
                "tools/call",
                params,
                {
                    "timeout": server.timeout_s,
                    "headers": {MCP_PROTOCOL_VERSION_HEADER: version},
                },
            )
            try:
                task = CreatedTask.model_validate(raw).task
            except (
                ValidationError
            ):  # the session is fine (its other tasks too): only this call failed
                raise McpCallError(
                    f"The MCP server {server.label!r} answered the task-augmented tools/call {name!r} "
                    "with what is not a CreateTaskResult.\n"
                    "  Check that the server implements MCP Tasks (2025-11-25) for this tool."
                ) from None
            where: Bound | None = None
            if (
                live.session_id is not None
            ):  # kept so another process can reach the same session
                kept = handshake.model_dump(
                    mode="json", by_alias=True, exclude_none=True
                )
                kept.pop("instructions", None)
                where = (live.session_id, kept)
            return task.model_dump(mode="json", by_alias=True, exclude_none=True), where

        found: tuple[dict[str, Any], Bound | None] = await self._request(
            server, f"tools/call {name!r}", send
        )
        return found

    async def task_request(
        self, server: McpServer, where: Bound | None, method: str, task_id: str
    ) -> dict[str, Any]:
        """`tasks/get`, `tasks/result` or `tasks/cancel` of `task_id` on the session it is bound to:
        the result as JSON (its shape checked by the caller), or `McpCallError`."""
        request = TaskRequest(method=method, params={"taskId": task_id})

        async def send(live: Live) -> dict[str, Any]:
            found = await live.session.send_request(
                request, AnyResult, server.timeout_s
            )
            return found.model_dump(mode="json", by_alias=True, exclude_none=True)

        result: dict[str, Any] = await self._request(
            server, f"{method} {task_id!r}", send, self.bound(server, where)
        )
        return result

    async def _request(
        self,
        server: McpServer,
        what: str,
        send: Any,
        connection: _Connection | None = None,
    ) -> Any:
        connection = connection or self.connection(server)
        client = await connection.client()
        try:
            async with asyncio.timeout(server.timeout_s + 1):
                return await send(client)
        except MCPError as error:
            if error.code == mcp_types.CONNECTION_CLOSED:
                connection.dead()
                raise McpCallError(
                    f"The MCP server {server.label!r} closed the connection during {what}.\n"
                    "  It is started again for the next call; check its log if it keeps dying."
                ) from None
            if error.code == mcp_types.REQUEST_TIMEOUT:
                raise _timed_out(server, what) from None
            raise McpCallError(
                f"The MCP server {server.label!r} answered {what} with an error: {error.message[:500]}\n"
                "  Check the call's input and the server's log.",
                error.code,
            ) from None
        except TimeoutError:
            raise _timed_out(server, what) from None
        except ValidationError as error:
            connection.dead()
            raise McpCallError(
                f"The MCP server {server.label!r} answered {what} with what is not a valid MCP result "
                f"({error.error_count()} problems).\n  The connection is started again; check the server."
            ) from None
        except (OSError, httpx2.HTTPError, RuntimeError) as error:
            connection.dead()
            raise McpCallError(
                f"The MCP server {server.label!r} failed during {what}: {_reason(error)}.\n"
                "  It is started again for the next call; check it (`toolloop doctor`)."
            ) from None

    async def release(self, server: McpServer, where: Bound | None) -> None:
        """Close the connection that resumed `where` (its task is over); the process's own stays."""
        if where is None:
            return
        found = self._connections.pop(f"{server.label}\x00{where[0]}", None)
        if found is not None:
            await found.aclose()

    def starts(self, label: str) -> int:
        found = self._connections.get(label)
        return found.starts if found is not None else 0

    async def aclose(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.aclose()


def _timed_out(server: McpServer, what: str) -> McpCallError:
    return McpCallError(
        f"The MCP server {server.label!r} did not answer {what} in {server.timeout_s:g} s (timeout_s) "
        "with a valid JSON-RPC response.\n"
        "  The call may have run; raise timeout_s for slow tools, or check the server and its log."
    )


async def probe(servers: list[McpServer]) -> list[list[mcp_types.Tool] | McpCallError]:
    """List each server's tools once, on connections of their own closed after (the CLI's `toolloop
    tools` and `toolloop doctor`): the tools, or the error saying why the server did not answer."""
    pool = McpServers()
    found: list[list[mcp_types.Tool] | McpCallError] = []
    try:
        for server in servers:
            try:
                found.append(await pool.list_tools(server))
            except McpCallError as error:
                found.append(error)
            except ValueError as error:  # ToolsetError: a ${VAR} that is not set
                found.append(McpCallError(str(error)))
    finally:
        await pool.aclose()
    return found
