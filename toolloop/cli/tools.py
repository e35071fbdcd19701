"""`toolloop tools NAME`: the tools of a registered toolset, as a worker would serve them: its Python
tools (imported) and each MCP server's (listed over a connection of its own, then closed)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from toolloop.cli.errors import CliError
from workers.config import toolsets
from workers.config.mcp import McpServer
from workers.config.settings import Settings

if TYPE_CHECKING:
    import mcp_types


def add_command(sub: Any) -> None:
    tools = sub.add_parser(
        "tools", help="list the tools of a registered toolset (MCP servers included)"
    )
    tools.add_argument(
        "name", metavar="NAME", help="a toolset registered in TOOLLOOP_TOOLSETS(_FILE)"
    )
    tools.set_defaults(handler=cmd_tools)


def cmd_tools(args: argparse.Namespace) -> int:
    # the MCP SDK: ~0.6 s of imports, for this command only
    from workers.process.mcpservers import (
        probe,
    )
    from workers.step.mcptools import tool_record

    settings = Settings.from_env()
    try:
        registry = toolsets.Registry(settings.toolsets, settings.toolsets_file)
        toolset = registry.toolset(args.name)
    except ValueError as error:  # ToolsetError: two lines already
        raise CliError(str(error)) from None
    if (
        os.getcwd() not in sys.path
    ):  # as a worker started here imports (its PYTHONPATH has the cwd)
        sys.path.insert(0, os.getcwd())
    failed = 0
    for path in toolset.python:
        try:
            loaded = toolsets.load(path, args.name)
        except ValueError as error:
            print(f"error {path}: {str(error).splitlines()[0]}")
            failed += 1
            continue
        for spec in loaded:
            print(f"{spec.name:<28} {path:<32} {_first_line(spec.description)}")
    listed = asyncio.run(probe(list(toolset.servers)))
    for server, tools in zip(toolset.servers, listed, strict=True):
        if isinstance(tools, Exception):
            print(f"error MCP server {server.label!r}: {str(tools).splitlines()[0]}")
            failed += 1
            continue
        for tool in tools:
            approval = " (needs approval)" if _held(server, tool) else ""
            task = (
                " (task)" if tool_record(tool).get("task_support") == "required" else ""
            )
            about = _first_line(tool.description or "")
            print(f"{tool.name:<28} mcp:{server.label:<28} {about}{task}{approval}")
    return 1 if failed else 0


def _held(server: McpServer, tool: mcp_types.Tool) -> bool:
    # as probe above (it imports the MCP SDK's types)
    from workers.step.mcptools import (
        tool_record,
    )

    record = tool_record(tool)
    destructive = not record["read_only"] and record["destructive"]
    return tool.name in server.needs_approval or (
        server.approve_destructive and destructive
    )


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 80 else line[:77] + "..."
