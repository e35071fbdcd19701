"""A small MCP server made with the official `mcp` SDK, that counts what it does: the offline example
of docs/mcp.md and the server the tests count calls at.

    python -m examples.mcp_counter stdio                       # over stdin/stdout (a worker starts it)
    python -m examples.mcp_counter http --port 3011            # streamable HTTP on 127.0.0.1:3011/mcp

Its tools: `add(a, b)`, `shout(text)`, `pixel()` (a 1x1 PNG), `weather(city)` (structured content),
`fail(why)` (an `isError` result), `slow(seconds)`, `big(size)` (a long text), `die()` (the server
exits mid-call) and `remove(path)` (annotated destructive). Each call appends one JSON line to the
file named by MCP_COUNTER_LOG (when set): the tool, its arguments, the request's
`_meta["toolloop/idempotency_key"]` and, over HTTP, the `Authorization` header it got. With
MCP_COUNTER_DEDUPE=1 a call whose idempotency key was seen before answers what the first call
answered without doing the work again (logged with `"replayed": true`), as a server honouring
toolloop's key would. With MCP_COUNTER_TOKEN set, an HTTP request without `Authorization: Bearer
<token>` is refused (401).
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
server = MCPServer("toolloop-counter")


def _seen(ctx: Context[Any, Any]) -> tuple[str, dict[str, Any]]:
    request = ctx.request_context
    meta = request.meta or {}
    key = (
        str(meta.get("toolloop/idempotency_key", "")) if isinstance(meta, dict) else ""
    )
    http = request.request
    auth = (
        http.headers.get("authorization", "")
        if http is not None and hasattr(http, "headers")
        else ""
    )
    return key, {"auth": auth}


def _log(
    tool: str, arguments: dict[str, Any], ctx: Context[Any, Any], answer: Any
) -> Any:
    """Log the call (once per idempotency key with MCP_COUNTER_DEDUPE=1) and return its answer: the
    first answer under the same key when it was seen before."""
    path = os.environ.get("MCP_COUNTER_LOG")
    key, extra = _seen(ctx)
    if not path:
        return answer
    with open(path, "a+", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        earlier = [
            json.loads(line) for line in file.read().splitlines() if line.strip()
        ]
        first = next(
            (e for e in earlier if key and e["key"] == key and not e.get("replayed")),
            None,
        )
        replayed = first is not None and os.environ.get("MCP_COUNTER_DEDUPE") == "1"
        entry = {
            "tool": tool,
            "arguments": arguments,
            "key": key,
            "pid": os.getpid(),
            **extra,
        }
        file.write(
            json.dumps(
                {
                    **entry,
                    "replayed": replayed,
                    "answer": answer if not replayed else None,
                }
            )
            + "\n"
        )
    return first["answer"] if replayed and first is not None else answer


@server.tool(description="Add two integers.", structured_output=False)
def add(a: int, b: int, ctx: Context[Any, Any]) -> str:
    return str(_log("add", {"a": a, "b": b}, ctx, str(a + b)))


@server.tool(description="The text in capitals.", structured_output=False)
def shout(text: str, ctx: Context[Any, Any]) -> str:
    return str(_log("shout", {"text": text}, ctx, text.upper()))


@server.tool(description="A 1x1 PNG.")
def pixel(ctx: Context[Any, Any]) -> CallToolResult:
    _log("pixel", {}, ctx, "pixel")
    data = base64.b64encode(PIXEL).decode()
    return CallToolResult(
        content=[
            TextContent(text="One pixel:"),
            ImageContent(data=data, mime_type="image/png"),
        ]
    )


@server.tool(
    description="Today's weather in a city, as structured content.",
    structured_output=True,
)
def weather(city: str, ctx: Context[Any, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = _log(
        "weather", {"city": city}, ctx, {"city": city, "celsius": 21}
    )
    return answer


@server.tool(description="Always fails, saying why.")
def fail(why: str, ctx: Context[Any, Any]) -> CallToolResult:
    _log("fail", {"why": why}, ctx, why)
    return CallToolResult(
        content=[TextContent(text=f"It failed: {why}")], is_error=True
    )


@server.tool(description="Answers after some seconds.", structured_output=False)
def slow(seconds: float, ctx: Context[Any, Any]) -> str:
    time.sleep(seconds)
    return str(_log("slow", {"seconds": seconds}, ctx, f"slept {seconds}"))


@server.tool(description="A text of `size` characters.", structured_output=False)
def big(size: int, ctx: Context[Any, Any]) -> str:
    _log("big", {"size": size}, ctx, "big")
    return "x" * size


@server.tool(
    description="The server process exits in the middle of the call.",
    structured_output=False,
)
def die(ctx: Context[Any, Any]) -> str:
    _log("die", {}, ctx, "died")
    os._exit(3)


@server.tool(
    description="Remove a file (pretend).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
    structured_output=False,
)
def remove(path: str, ctx: Context[Any, Any]) -> str:
    return str(_log("remove", {"path": path}, ctx, f"removed {path}"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="A counting MCP server (examples/mcp_counter.py)."
    )
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=3011)
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
        return
    token = os.environ.get("MCP_COUNTER_TOKEN")
    if token:
        serve_with_token(args.port, token)
        return
    server.run("streamable-http", host="127.0.0.1", port=args.port)


def serve_with_token(port: int, token: str) -> None:
    """Streamable HTTP on 127.0.0.1:`port`, refusing a request without the bearer token (401)."""
    import uvicorn
    from starlette.responses import PlainTextResponse

    app = server.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await PlainTextResponse(
                    "missing or wrong bearer token", status_code=401
                )(scope, receive, send)
                return
        await app(scope, receive, send)

    uvicorn.run(
        guarded, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
