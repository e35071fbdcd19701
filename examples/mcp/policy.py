"""The simulated model of the MCP example: a policy for `toolloop.sim` that calls an MCP server's
tools and reports what they answered (docs/mcp.md).

Over the counting server (examples/mcp_counter.py): `add` 20 and 22, then `shout` the sum and get
`weather` in Oslo in one turn, then a final text quoting each answer. Over the reference server
(`@modelcontextprotocol/server-everything`): `echo` and `get-sum`, then the final text. It answers
from the request alone (the history), as the simulator requires: a replayed request gets the same turn.
"""

from __future__ import annotations

from examples.storyboard.policy import call, results_by_tool
from toolloop.sim.script import SimRequest, SimTurn


def mcp_policy(request: SimRequest) -> SimTurn:
    done = results_by_tool(request)
    tools = set(request.tool_names)
    if {"add", "shout"} <= tools:
        if "add" not in done:
            return SimTurn(text="Adding first.", tool_calls=[call("add", a=20, b=22)])
        if "shout" not in done:
            total = done["add"][0].strip()
            return SimTurn(
                text=f"The sum is {total}.",
                tool_calls=[
                    call("shout", text=f"the sum is {total}"),
                    call("weather", city="Oslo"),
                ],
            )
        return SimTurn(text=f"{done['shout'][0]}; Oslo: {done['weather'][0]}")
    if {"echo", "get-sum"} <= tools:
        if "echo" not in done:
            return SimTurn(
                text="Asking the reference server.",
                tool_calls=[call("echo", message="hi"), call("get-sum", a=20, b=22)],
            )
        return SimTurn(text=f"{done['echo'][0]}; {done['get-sum'][0]}")
    return SimTurn(text="No MCP tools I know here: " + ", ".join(sorted(tools)))
