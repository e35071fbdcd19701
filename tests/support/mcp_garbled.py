"""A hand-written stdio MCP server (no SDK) that answers its handshake and `tools/list` properly and
then breaks the protocol: `garble` is answered with a line that is not JSON, `invalid` with a
JSON-RPC response whose result is not a CallToolResult, `fine` properly. For
tests/integration/test_mcp_runs.py: a server that answers malformed JSON-RPC fails that call only."""

from __future__ import annotations

import json
import sys
from typing import Any

TOOLS = [
    {
        "name": name,
        "description": f"The {name} tool.",
        "inputSchema": {"type": "object", "properties": {}},
    }
    for name in ("garble", "invalid", "fine")
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict[str, Any]) -> None:
    method, ident = request.get("method"), request.get("id")
    if ident is None:
        return  # a notification
    if method == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "garbled", "version": "1"},
        }
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call" and request["params"]["name"] == "garble":
        sys.stdout.write("{this is not json-rpc\n")
        sys.stdout.flush()
    elif method == "tools/call" and request["params"]["name"] == "invalid":
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "result": {"content": "not a list of blocks"},
            }
        )
    elif method == "tools/call":
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "result": {"content": [{"type": "text", "text": "fine"}]},
            }
        )
    else:
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "error": {"code": -32601, "message": f"no {method}"},
            }
        )


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            answer(json.loads(line))


if __name__ == "__main__":
    main()
