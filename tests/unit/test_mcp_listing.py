"""An MCP toolset's tool list is journaled when the run first needs it: a replayed or redelivered step
reads it from the run's keys and never lists the server again, even when the server's tools changed.

The steps run in a real `WorkerProcess` on a private Redis (tests/support/harness.py) against the
counting MCP server of examples/mcp_counter.py over stdio (a child process, started by the worker's
connection pool); `McpServers.list_tools` is counted where it is called."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp_types
import yaml

from tests.support.harness import StepHarness
from toolloop.testing import ScriptedModel, call, reply
from workers.client import Client
from workers.config.mcp import McpServer
from workers.config.toolsets import Registry
from workers.process.mcpservers import McpServers
from workers.protocol import keys


class CountedServers(McpServers):
    def __init__(self) -> None:
        super().__init__()
        self.lists = 0

    async def list_tools(self, server: McpServer) -> list[mcp_types.Tool]:
        self.lists += 1
        return await super().list_tools(server)


def _register(h: StepHarness, tmp_path: Path) -> Path:
    log = tmp_path / "calls.jsonl"
    file = tmp_path / "toolsets.yaml"
    server = {
        "command": [sys.executable, "-m", "examples.mcp_counter", "stdio"],
        "env": {"MCP_COUNTER_LOG": str(log)},
    }
    file.write_text(yaml.safe_dump({"counter": {"mcp": server}}))
    h.process.toolsets = Registry({}, str(file))
    return log


async def test_a_redelivered_step_reads_the_journaled_list_and_never_lists_again(
    step_harness: StepHarness, tmp_path: Path
) -> None:
    h = step_harness
    log = _register(h, tmp_path)
    first = h.process.mcp = CountedServers()
    h.model = ScriptedModel(
        [reply(tool_calls=[call("add", {"a": 2, "b": 3}, "c1")]), reply("It is 5.")]
    )
    client = Client(h.process.settings.redis_url, toolsets=["counter"])
    spec: dict[str, Any] = {
        "model": "scripted",
        "system": "s",
        "toolset": "counter",
        "messages": [{"role": "user", "content": "Go."}],
    }
    run_id = client.enqueue(spec)
    try:
        assert str(await h.step(run_id)) == "next"  # model:1, its tools listed once
        assert first.lists == 1
        listed = json.loads(h.redis.hget(keys.mcp_tools(run_id), "counter") or "[]")
        assert "add" in [tool["name"] for tool in listed]
        # Another worker process takes the run's next step: no kept loop, no connection yet; and the
        # server's tools "changed" since (the journaled list is what the run keeps).
        h.process.kept.clear()
        again = h.process.mcp = CountedServers()
        changed = [dict(tool, description="changed") for tool in listed]
        h.redis.hset(keys.mcp_tools(run_id), "counter", json.dumps(changed))
        said = await h.run_to_end(run_id)
        assert said[-1] == "stop: done"
        # the replayed model step and the tool step read the journal
        assert again.lists == 0
        assert [
            c["tool"]
            for c in json.loads("[" + ",".join(log.read_text().splitlines()) + "]")
        ] == ["add"]
        # what the run journaled
        assert h.model.requests[-1].tools[0].description == "changed"
        await again.aclose()
        await first.aclose()
    finally:
        client.close()
