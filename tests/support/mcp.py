"""MCP servers for tests: the reference server `@modelcontextprotocol/server-everything` (installed by
`.ci/run` with `npm install --prefix tests/.mcp`; run with node, offline) and the counting server of
examples/mcp_counter.py (the mcp SDK), over stdio or streamable HTTP on 127.0.0.1, and a simulator
policy that runs one script per system text."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import end
from toolloop.embedded import free_port
from toolloop.sim import Script, SimRequest, SimTurn

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = (
    ROOT
    / "tests/.mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
COUNTER = [sys.executable, "-m", "examples.mcp_counter"]


def everything_command() -> list[str]:
    """The stdio command of the reference server (skips the test, saying how to install it, when the
    npm install of `.ci/run` was not made)."""
    if not EVERYTHING.exists():
        pytest.fail(
            "The MCP reference server is not installed.\n"
            "  Run: npm install --prefix tests/.mcp @modelcontextprotocol/server-everything"
        )
    return ["node", str(EVERYTHING), "stdio"]


def wait_port(
    port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"The MCP server exited at start:\n{log.read_text()[-2000:]}"
            )
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(
        f"The MCP server did not listen on {port} in {timeout} s:\n{log.read_text()[-2000:]}"
    )


@contextmanager
def http_server(
    command: list[str], log: Path, port: int, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run `command` (a streamable-HTTP MCP server on 127.0.0.1:`port`) until the block ends; yields
    its endpoint URL."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_port(port, process, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        end(process, 10, group=True)


@contextmanager
def everything_http(log: Path) -> Iterator[str]:
    everything_command()
    port = free_port()
    with http_server(
        ["node", str(EVERYTHING), "streamableHttp"], log, port, {"PORT": str(port)}
    ) as url:
        yield url


@contextmanager
def counter_http(log: Path, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    with http_server([*COUNTER, "http", "--port", str(port)], log, port, env) as url:
        yield url


def calls(log: Path) -> list[dict[str, Any]]:
    """The calls the counting server logged (MCP_COUNTER_LOG), in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


class Scripts:
    """A simulator policy: the script of the request's system text (toolloop.sim.Script), and every
    request kept, by system text."""

    def __init__(self, scripts: dict[str, list[Any]]) -> None:
        self.scripts = {system: Script(turns) for system, turns in scripts.items()}
        self.lock = threading.Lock()
        self.seen: dict[str, list[SimRequest]] = {}

    def __call__(self, request: SimRequest) -> SimTurn:
        system = request.system or ""
        with self.lock:
            self.seen.setdefault(system, []).append(request)
        return self.scripts[system](request)

    def bodies(self, system: str) -> list[dict[str, Any]]:
        with self.lock:
            return [request.body for request in self.seen.get(system, [])]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `tool_result` blocks of the last user turn of an Anthropic request body."""
    last = body["messages"][-1]
    return [
        block
        for block in last["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def session_tasks(url: str, where: list[Any]) -> list[dict[str, Any]]:
    """`tasks/list` on the server-side session `where` (a task record's journaled session id and
    handshake, workers/step/mcptasks.py): every task that session holds, as the server says. Made with the
    mcp SDK alone, as a second client of the same session would."""
    import asyncio

    import mcp_types
    from mcp import ClientSession
    from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

    from workers.process.mcpservers import AnyResult, TaskRequest

    async def listed() -> list[dict[str, Any]]:
        http = create_mcp_http_client(headers={MCP_SESSION_ID: where[0]})
        async with (
            http,
            streamable_http_client(url, http_client=http, terminate_on_close=False) as (
                read,
                write,
            ),
            ClientSession(dispatcher=JSONRPCDispatcher(read, write)) as session,
        ):
            session.adopt(mcp_types.InitializeResult.model_validate(where[1]))
            found = await session.send_request(
                TaskRequest(method="tasks/list", params={}), AnyResult, 10
            )
            return list(found.model_dump(by_alias=True)["tasks"])

    return asyncio.run(listed())
