"""MCP kill points, crash-matrix style: a worker SIGKILLed after `tools/call` returned and before the
step's commit (`mcp:called`, workers/testing/killpoints.py), in two steps of one run.

Real supervised workers (faults.workerpool), the provider simulator over HTTP, and the counting MCP
server of examples/mcp_counter.py over stdio, deduping by toolloop's `_meta` idempotency key
(MCP_COUNTER_DEDUPE=1) as a server that honours it does. The killed step runs again and sends its call
again: with the SAME key (so the server answers what it answered first and does nothing twice), and
the run finishes `done` with each call answered once in its history: 0 duplicate finished calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from faults.workerpool import WorkerPool
from tests.support.mcp import COUNTER, Scripts, calls, tool_results
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.faults

SYSTEM = "mcp-kills"
TURNS = [
    {
        "text": "Two calls.",
        "tool_calls": [
            {"name": "add", "input": {"a": 40, "b": 2}},
            {"name": "shout", "input": {"text": "hi"}},
        ],
    },
    {
        "text": "A third.",
        "tool_calls": [{"name": "remove", "input": {"path": "/tmp/x"}}],
    },
    {"text": "Done."},
]


@pytest.fixture(scope="module")
def policy() -> Scripts:
    return Scripts({SYSTEM: TURNS})


@pytest.fixture(scope="module")
def sim(policy: Scripts) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


def _pool(
    redis_server: EmbeddedServer,
    sim: SimServer,
    work_dir: Path,
    plan: list[dict[str, Any]],
) -> WorkerPool:
    log = work_dir / "counted.jsonl"
    toolsets = {
        "counter": {
            "mcp": {
                "command": [*COUNTER, "stdio"],
                "env": {"MCP_COUNTER_LOG": str(log), "MCP_COUNTER_DEDUPE": "1"},
            }
        }
    }
    (work_dir / "toolsets.yaml").write_text(yaml.safe_dump(toolsets))
    (work_dir / "plan.json").write_text(json.dumps(plan))
    env = {
        "ANTHROPIC_BASE_URL": sim.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-FAKE-mcp",
        "TOOLLOOP_PROMPT_GEN": "",
        "TOOLLOOP_TOOLSETS": "",
        "TOOLLOOP_TOOLSETS_FILE": str(work_dir / "toolsets.yaml"),
        "TOOLLOOP_KILL_PLAN": str(work_dir / "plan.json"),
    }
    return WorkerPool(redis_server.url, work_dir, env, size=1)


def test_a_kill_after_tools_call_returned_resends_the_same_key_and_finishes_each_call_once(
    redis_server: EmbeddedServer, sim: SimServer, work_dir: Path, policy: Scripts
) -> None:
    plan = [
        {
            "point": "mcp:called",
            "tool": "add",
        },  # tools/call returned, the step not committed
        {"point": "mcp:called", "tool": "remove"},
    ]
    client = Client(redis_server.url, toolsets=["counter"])
    try:
        with _pool(redis_server, sim, work_dir, plan) as pool:
            spec = {
                "model": "claude-sonnet-5-5",
                "provider": "anthropic",
                "system": SYSTEM,
                "toolset": "counter",
                "messages": [{"role": "user", "content": "Go."}],
            }
            run_id = client.enqueue(spec)
            status = client.wait(run_id, timeout=90)
            deaths = list(pool.deaths)
        assert status.status == "done", status
        fired = [
            json.loads(line)
            for line in (work_dir / "plan.json.log").read_text().splitlines()
        ]
        assert [entry["point"] for entry in fired] == [
            "mcp:called",
            "mcp:called",
        ] and len(deaths) == 2
        made = [
            call
            for call in calls(work_dir / "counted.jsonl")
            if call["key"].startswith(f"{run_id}/")
        ]
        done = [call for call in made if not call["replayed"]]
        # each effect once
        assert sorted(call["tool"] for call in done) == [
            "add",
            "remove",
            "shout",
        ]
        assert len({call["key"] for call in done}) == 3  # 0 duplicate finished calls
        again = [call for call in made if call["replayed"]]
        # the killed calls, resent
        assert sorted(call["tool"] for call in again) == [
            "add",
            "remove",
        ]
        # with the same key
        assert {call["key"] for call in again} <= {call["key"] for call in done}
        tools = [m for m in client.history(run_id) if m.role == "tool"]
        assert len(tools) == 3 and len({m.tool_call_id for m in tools}) == 3
        second = next(
            body
            for body in reversed(policy.bodies(SYSTEM))
            if len(tool_results(body)) == 2
        )
        assert [
            "".join(p["text"] for p in r["content"]) for r in tool_results(second)
        ] == ["42", "HI"]
    finally:
        client.close()
