"""The worker CPU an MCP tool call costs over a plain Python tool (docs/mcp.md, README "Figures").

A tool step's work, as a worker runs it on its loop (uvloop): the input checked against the tool's
schema, the tool run, its output bounded and dumped to the journal's JSON. The plain side is an async
Python `add` tool; the MCP side is `add` of the counting server examples/mcp_counter.py, a local
child process over stdio and a local streamable-HTTP server on 127.0.0.1, through the worker's own
connection pool (workers/process/mcpservers.py) and tool wrapper (workers/step/mcptools.py). CPU is this
process's
(the worker's): the server's own CPU is not counted. Blocks of each side alternate; the medians of
the blocks are printed, per call.

    .venv/bin/python bench/mcp_call.py            # --calls 200 --blocks 5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvloop
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from toolloop.abort import NEVER_ABORTED  # noqa: E402
from toolloop.embedded import free_port  # noqa: E402
from toolloop.loop.tools import as_output, bounded, validate_input  # noqa: E402
from toolloop.loop.types import ToolOutput, ToolSpec  # noqa: E402
from workers.config.mcp import McpServer  # noqa: E402
from workers.config.settings import Settings  # noqa: E402
from workers.observe.hooks import NO_HOOKS  # noqa: E402
from workers.process.mcpservers import McpServers  # noqa: E402
from workers.step.mcptools import specs_for, tool_record  # noqa: E402

COUNTER = [sys.executable, "-m", "examples.mcp_counter"]


class Add(BaseModel):
    a: int
    b: int


async def add(checked: Add, signal: Any) -> ToolOutput:
    total = str(checked.a + checked.b)
    return ToolOutput.model_validate(
        {"value": total, "content": [{"type": "text", "text": total}]}
    )


@dataclasses.dataclass
class _Process:
    """What an MCP tool reads of its worker process (workers/process/worker_process.py WorkerProcess)."""

    mcp: McpServers
    settings: Settings
    hooks: Any = NO_HOOKS


async def step_work(spec: ToolSpec, raw: dict[str, Any]) -> dict[str, Any]:
    """A one-phase tool step's work, as toolloop/loop/calls.py runs it."""
    checked = validate_input(spec, raw)
    assert not isinstance(checked, str), checked
    assert spec.run is not None
    output = bounded(
        as_output(await spec.run(checked, NEVER_ABORTED), spec.name),
        spec.name,
        1_000_000,
        None,
    )
    dumped: dict[str, Any] = output.model_dump(mode="json")
    return dumped


async def block(spec: ToolSpec, calls: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        dumped = await step_work(spec, {"a": i, "b": 1})
        assert dumped["content"][0]["text"] == str(i + 1), dumped
    return (time.process_time() - cpu) / calls * 1e6, (
        time.perf_counter() - wall
    ) / calls * 1e6


async def mcp_spec(process: _Process, server: McpServer) -> ToolSpec:
    records = [tool_record(tool) for tool in await process.mcp.list_tools(server)]
    return next(
        spec for spec in specs_for(process, server, records) if spec.name == "add"
    )  # type: ignore[arg-type]


async def main(calls: int, blocks: int) -> dict[str, Any]:
    port = free_port()
    http = subprocess.Popen(
        [*COUNTER, "http", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    process = _Process(mcp=McpServers(), settings=Settings.from_env())
    try:
        stdio = await mcp_spec(
            process, McpServer(label="stdio", command=(*COUNTER, "stdio"))
        )
        for _ in range(100):
            try:
                over_http = await mcp_spec(
                    process, McpServer(label="http", url=f"http://127.0.0.1:{port}/mcp")
                )
                break
            except Exception:
                await asyncio.sleep(0.2)
        plain = ToolSpec(name="add", description="Add.", schema=Add, run=add)
        sides = {"python": plain, "mcp-stdio": stdio, "mcp-http": over_http}
        for spec in sides.values():
            await block(spec, 20)  # warm up: connections made, code paths hot
        seen: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for _ in range(blocks):
            for name, spec in sides.items():
                seen[name].append(await block(spec, calls))
        result = {
            name: {
                "cpu_us_per_call": statistics.median(c for c, _ in runs),
                "wall_us_per_call": statistics.median(w for _, w in runs),
            }
            for name, runs in seen.items()
        }
        base = result["python"]["cpu_us_per_call"]
        for name in ("mcp-stdio", "mcp-http"):
            result[name]["extra_cpu_us_per_call"] = (
                result[name]["cpu_us_per_call"] - base
            )
        return result
    finally:
        await process.mcp.aclose()
        http.terminate()
        http.wait(timeout=10)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--calls", type=int, default=200, help="calls per block (default 200)"
    )
    parser.add_argument(
        "--blocks", type=int, default=5, help="blocks per side, alternated (default 5)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    result = uvloop.run(main(args.calls, args.blocks))
    for name, figures in result.items():
        extra = figures.get("extra_cpu_us_per_call")
        more = (
            f"  (+{extra:,.0f} µs CPU over the Python tool)"
            if extra is not None
            else ""
        )
        cpu, wall = figures["cpu_us_per_call"], figures["wall_us_per_call"]
        print(f"{name:<10} {cpu:>8,.0f} µs CPU/call {wall:>8,.0f} µs wall/call{more}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    cli()
