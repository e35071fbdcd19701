"""A hand-written stdio MCP server (no SDK) with 2025-11-25 Tasks, for the task states the reference
server does not reach with toolloop: `confirm` (taskSupport "required") makes a task that is at once
`input_required` (it wants a person's choice), `doomed` one that is `failed`, its `tasks/result` an
`isError` result; `ignorant` is listed as a task tool but answers a plain CallToolResult. Every
request's method (and task id) is logged as a JSON line to MCP_ASKING_LOG, so
tests/integration/test_mcp_runs.py counts what reached the server."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SCHEMA = {"type": "object", "properties": {}}
TOOLS = [
    {
        "name": name,
        "description": f"The {name} task.",
        "inputSchema": SCHEMA,
        "execution": {"taskSupport": "required"},
    }
    for name in ("confirm", "doomed", "ignorant")
]
NOW = "2026-01-01T00:00:00Z"
tasks: dict[str, dict[str, Any]] = {}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def logged(request: dict[str, Any]) -> None:
    path = os.environ.get("MCP_ASKING_LOG")
    if path:
        params = request.get("params") or {}
        with open(path, "a", encoding="utf-8") as file:
            file.write(
                json.dumps(
                    {"method": request.get("method"), "task": params.get("taskId")}
                )
                + "\n"
            )


def task(ident: str, status: str, message: str) -> dict[str, Any]:
    return {
        "taskId": ident,
        "status": status,
        "statusMessage": message,
        "createdAt": NOW,
        "lastUpdatedAt": NOW,
        "ttl": 60000,
        "pollInterval": 200,
    }


def answer(request: dict[str, Any]) -> Any:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {
                "tools": {},
                "tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}},
            },
            "serverInfo": {"name": "asking", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call" and params.get("name") == "ignorant":
        return {"content": [{"type": "text", "text": "no task here"}]}
    if method == "tools/call" and "task" in params:
        ident = f"task-{len(tasks) + 1}"
        if params["name"] == "confirm":
            tasks[ident] = task(
                ident, "input_required", "Which account should be charged?"
            )
        else:
            tasks[ident] = task(ident, "failed", "The disk is full.")
        return {"task": tasks[ident]}
    found = tasks.get(params.get("taskId", ""))
    if method in ("tasks/get", "tasks/result", "tasks/cancel") and found is None:
        return {"error": {"code": -32602, "message": "Task not found"}}
    if method == "tasks/get":
        return found
    if method == "tasks/cancel":
        found["status"] = "cancelled"
        return found
    if method == "tasks/result":
        return {
            "content": [{"type": "text", "text": found["statusMessage"]}],
            "isError": True,
        }
    return {"error": {"code": -32601, "message": f"no {method}"}}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("id") is None:
            continue  # a notification
        logged(request)
        result = answer(request)
        if isinstance(result, dict) and set(result) == {"error"}:
            send({"jsonrpc": "2.0", "id": request["id"], "error": result["error"]})
        else:
            send({"jsonrpc": "2.0", "id": request["id"], "result": result})


if __name__ == "__main__":
    main()
