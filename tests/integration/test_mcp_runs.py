"""MCP servers as toolsets, end to end: a real worker (TOOLLOOP_TOOLSETS_FILE), the provider simulator
over real HTTP as the model, and real MCP servers: the reference `@modelcontextprotocol/server-everything`
(node, over stdio and over streamable HTTP) and the counting server of examples/mcp_counter.py (the
mcp SDK), which logs every call it runs, so each call is counted at the server."""

from __future__ import annotations

import json
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.integration.conftest import Worker, sim_env, start_worker
from tests.support.flower import running_flower
from tests.support.mcp import (
    COUNTER,
    Scripts,
    calls,
    counter_http,
    everything_command,
    everything_http,
    tool_results,
)
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.errors import ToolsetError

GARBLED = Path(__file__).resolve().parents[1] / "support" / "mcp_garbled.py"
ASKING = Path(__file__).resolve().parents[1] / "support" / "mcp_asking.py"
TOKEN = f"mcp-token-{uuid.uuid4().hex}"
AUTH = ("operator", f"pw-{uuid.uuid4().hex[:8]}")
MODEL = "claude-sonnet-5-5"

EVERYTHING_TURNS = [
    {
        "text": "Using the reference server.",
        "tool_calls": [
            {"name": "echo", "input": {"message": "hello mcp"}},
            {"name": "get-tiny-image", "input": {}},
            {"name": "get-structured-content", "input": {"location": "New York"}},
            {"name": "get-resource-links", "input": {"count": 2}},
            {"name": "get-sum", "input": {"a": "one", "b": 2}},
            {"name": "get-env", "input": {}},
        ],
    },
    {"text": "All six answered."},
]
SCRIPTS = {
    "everything-stdio": EVERYTHING_TURNS,
    "everything-http": EVERYTHING_TURNS,
    "counted": [
        {
            "text": "Counting.",
            "tool_calls": [
                {"name": "add", "input": {"a": 20, "b": 22}},
                {"name": "shout", "input": {"text": "once"}},
                {"name": "pixel", "input": {}},
                {"name": "fail", "input": {"why": "no disk"}},
            ],
        },
        {"text": "Again.", "tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}]},
        {"text": "Done counting."},
    ],
    "token": [
        {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 2, "b": 3}}]},
        {"text": "It is 5."},
    ],
    "faults": [
        {
            "text": "Breaking things.",
            "tool_calls": [
                {"name": "die", "input": {}},
                {"name": "slow", "input": {"seconds": 4}},
                {"name": "big", "input": {"size": 50_000}},
                {"name": "add", "input": {"a": 1, "b": 1}},
            ],
        },
        {"text": "Survived."},
    ],
    "research": [
        {
            "text": "Researching.",
            "tool_calls": [
                {"name": "simulate-research-query", "input": {"topic": "tasks"}}
            ],
        },
        {"text": "Researched."},
    ],
    "asking": [
        {
            "text": "Two tasks.",
            "tool_calls": [
                {"name": "confirm", "input": {}},
                {"name": "doomed", "input": {}},
                {"name": "ignorant", "input": {}},
            ],
        },
        {"text": "All three failed."},
    ],
    "approved": [
        {
            "text": "Removing.",
            "tool_calls": [{"name": "remove", "input": {"path": "/tmp/old"}}],
        },
        {"text": "Removed."},
    ],
    "garbled": [
        {
            "text": "Malformed answers.",
            "tool_calls": [
                {"name": "garble", "input": {}},
                {"name": "invalid", "input": {}},
                {"name": "fine", "input": {}},
            ],
        },
        {"text": "Still here."},
    ],
}


@pytest.fixture(scope="module")
def policy() -> Scripts:
    return Scripts(SCRIPTS)


@pytest.fixture(scope="module")
def sim(policy: Scripts) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


@pytest.fixture(scope="module")
def mcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp")


@pytest.fixture(scope="module")
def everything_url(mcp_dir: Path) -> Iterator[str]:
    with everything_http(mcp_dir / "everything-http.log") as url:
        yield url


@pytest.fixture(scope="module")
def guarded_url(mcp_dir: Path) -> Iterator[str]:
    env = {
        "MCP_COUNTER_TOKEN": TOKEN,
        "MCP_COUNTER_LOG": str(mcp_dir / "guarded.jsonl"),
    }
    with counter_http(mcp_dir / "guarded.log", env) as url:
        yield url


@pytest.fixture(scope="module")
def mcp_worker(
    sim_redis: EmbeddedServer,
    sim: SimServer,
    mcp_dir: Path,
    everything_url: str,
    guarded_url: str,
) -> Iterator[Worker]:
    toolsets = {
        "everything": {"mcp": {"command": everything_command()}},
        "everything-http": {"mcp": {"url": everything_url}},
        "counter": {
            "mcp": {
                "command": [*COUNTER, "stdio"],
                "env": {"MCP_COUNTER_LOG": str(mcp_dir / "counted.jsonl")},
            }
        },
        "guarded": {
            "mcp": {
                "url": guarded_url,
                "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"},
            }
        },
        "garbled": {"mcp": {"command": [sys.executable, str(GARBLED)], "timeout_s": 2}},
        "asking": {
            "mcp": {
                "command": [sys.executable, str(ASKING)],
                "env": {"MCP_ASKING_LOG": str(mcp_dir / "asking.jsonl")},
            }
        },
        "approving": {
            "mcp": {
                "command": [*COUNTER, "stdio"],
                "env": {"MCP_COUNTER_LOG": str(mcp_dir / "approving.jsonl")},
                "needs_approval": ["remove"],
            }
        },
        "fragile": {
            "mcp": {
                "command": [*COUNTER, "stdio"],
                "env": {"MCP_COUNTER_LOG": str(mcp_dir / "fragile.jsonl")},
                "timeout_s": 2,
            }
        },
    }
    file = mcp_dir / "toolsets.yaml"
    file.write_text(yaml.safe_dump(toolsets))
    env = sim_env(
        sim,
        TOOLLOOP_TOOLSETS_FILE=str(file),
        TOOLLOOP_TOOLSETS="",
        MCP_TEST_TOKEN=TOKEN,
        TOOLLOOP_MAX_TOOL_RESULT_BYTES="20000",
        TOOLLOOP_IMAGE_DIR=str(mcp_dir / "images"),
    )
    worker = start_worker(sim_redis.url, mcp_dir, env)
    yield worker
    worker.stop()


def _run(sim_redis: EmbeddedServer, system: str, toolset: str) -> tuple[Client, str]:
    client = Client(sim_redis.url, toolsets=[toolset])
    spec = {
        "model": MODEL,
        "provider": "anthropic",
        "system": system,
        "toolset": toolset,
        "messages": [{"role": "user", "content": "Go."}],
    }
    return client, client.enqueue(spec)


def _text(block: dict[str, Any]) -> str:
    return "\n".join(
        part.get("text", "")
        for part in block.get("content", [])
        if part["type"] == "text"
    )


@pytest.mark.parametrize("toolset", ["everything", "everything-http"])
def test_a_run_calls_the_reference_server_and_every_result_reaches_the_model(
    sim_redis: EmbeddedServer, mcp_worker: Worker, policy: Scripts, toolset: str
) -> None:
    system = "everything-stdio" if toolset == "everything" else "everything-http"
    client, run_id = _run(sim_redis, system, toolset)
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        assert status.final_text == "All six answered."
        first, second = policy.bodies(system)[-2:]
        names = {tool["name"] for tool in first["tools"]}
        assert {"echo", "get-tiny-image", "get-sum", "get-structured-content"} <= names
        echo_schema = next(tool for tool in first["tools"] if tool["name"] == "echo")[
            "input_schema"
        ]
        # the server's schema, as listed
        assert echo_schema["properties"]["message"]["type"] == "string"
        echo, image, structured, links, bad_sum, server_env = tool_results(second)
        assert _text(echo) == "Echo: hello mcp" and "is_error" not in echo
        assert [part["type"] for part in image["content"]][:2] == ["text", "image"]
        assert image["content"][1]["source"]["media_type"] == "image/png"
        assert json.loads(_text(structured).splitlines()[-1]) == json.loads(
            _text(structured).splitlines()[-1]
        )
        assert "temperature" in _text(structured)
        assert "[resource link]" in _text(links) and "demo://resource/" in _text(links)
        # refused by the listed schema, before the server
        assert bad_sum["is_error"] is True
        assert _text(bad_sum).startswith(
            "Invalid input for get-sum: ✖ "
        ) and "→ at a" in _text(bad_sum)
        assert "sim-key" not in _text(server_env) and "ANTHROPIC_API_KEY" not in _text(
            server_env
        )
        stored = redis.Redis.from_url(sim_redis.url, decode_responses=True).hget(
            keys.mcp_tools(run_id), toolset
        )
        # the list, journaled with the run
        assert stored is not None and "echo" in stored
    finally:
        client.close()


def test_each_call_is_made_once_with_its_step_idempotency_key(
    sim_redis: EmbeddedServer, mcp_worker: Worker, mcp_dir: Path, policy: Scripts
) -> None:
    client, run_id = _run(sim_redis, "counted", "counter")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        made = [
            call
            for call in calls(mcp_dir / "counted.jsonl")
            if call["key"].startswith(f"{run_id}/")
        ]
        # once each
        assert [call["tool"] for call in made] == [
            "add",
            "shout",
            "pixel",
            "fail",
            "add",
        ]
        assert len({call["key"] for call in made}) == 5
        assert all(call["key"].startswith(f"{run_id}/s0/tool:") for call in made)
        history = [m for m in client.history(run_id) if m.role == "tool"]
        assert [m.tool_call_id for m in history] == [
            call["key"].rsplit("tool:", 1)[1] for call in made
        ]
        results = tool_results(policy.bodies("counted")[1])
        assert _text(results[0]) == "42" and _text(results[1]) == "ONCE"
        assert results[2]["content"][1]["type"] == "image"
        assert (
            results[3]["is_error"] is True and _text(results[3]) == "It failed: no disk"
        )
        assert all("is_error" not in result for result in results[:3])
    finally:
        client.close()


def _redis_dump(client: redis.Redis) -> str:
    parts: list[str] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        parts.append(str(key))
        if kind == "string":
            parts.append(str(client.get(key)))
        elif kind == "hash":
            parts.append(json.dumps(client.hgetall(key)))
        elif kind == "list":
            parts.append(json.dumps(client.lrange(key, 0, -1)))
        elif kind == "zset":
            parts.append(json.dumps(client.zrange(key, 0, -1, withscores=True)))
        elif kind == "set":
            parts.append(json.dumps(sorted(client.smembers(key))))  # type: ignore[arg-type]
        elif kind == "stream":
            parts.append(json.dumps(client.xrange(key)))
    return "\n".join(parts)


def test_a_bearer_token_from_the_worker_environment_reaches_the_server_and_nothing_else(
    sim_redis: EmbeddedServer, mcp_worker: Worker, mcp_dir: Path, sim: SimServer
) -> None:
    env = {**sim_env(sim), "REDIS_URL": sim_redis.url}
    with running_flower(env, mcp_dir / "flower.log", AUTH) as flower:
        client, run_id = _run(sim_redis, "token", "guarded")
        try:
            status = client.wait(run_id, timeout=60)
            assert status.status == "done", status
            assert status.final_text == "It is 5."
            (made,) = [
                c
                for c in calls(mcp_dir / "guarded.jsonl")
                if c["key"].startswith(f"{run_id}/")
            ]
            # the server refuses any request without it
            assert made["auth"] == f"Bearer {TOKEN}"
            events = json.dumps(
                [event.model_dump(mode="json") for event in client.events(run_id)]
            )
            tasks = httpx.get(
                f"{flower}/api/tasks", params={"limit": 1000}, auth=AUTH, timeout=10
            ).text
            assert run_id in tasks  # Flower saw the run's steps
            infos = [
                httpx.get(
                    f"{flower}/api/task/info/{task_id}", auth=AUTH, timeout=10
                ).text
                for task_id in json.loads(tasks)
            ]
        finally:
            client.close()
    places = {
        "redis": _redis_dump(
            redis.Redis.from_url(sim_redis.url, decode_responses=True)
        ),
        "events": events,
        "worker log": mcp_worker.log.read_text(errors="replace"),
        "flower tasks": tasks,
        "flower task info": "\n".join(infos),
        "flower log": (mcp_dir / "flower.log").read_text(errors="replace"),
    }
    assert run_id in places["redis"] and '"kind": "finished"' in places["events"]
    assert [
        place for place, text in places.items() if TOKEN in text or TOKEN[-16:] in text
    ] == []


def test_a_server_killed_hung_or_oversized_fails_only_that_call(
    sim_redis: EmbeddedServer, mcp_worker: Worker, mcp_dir: Path, policy: Scripts
) -> None:
    client, run_id = _run(sim_redis, "faults", "fragile")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        assert status.final_text == "Survived."
        died, hung, oversized, added = tool_results(policy.bodies("faults")[-1])
        assert died[
            "is_error"
        ] is True and "closed the connection during tools/call 'die'" in _text(died)
        assert hung[
            "is_error"
        ] is True and "did not answer tools/call 'slow' in 2 s" in _text(hung)
        assert oversized["is_error"] is True and "the limit is 20,000" in _text(
            oversized
        )
        # the server was started again
        assert _text(added) == "2" and "is_error" not in added
        assert mcp_worker.process.poll() is None  # the worker never stopped
        made = [
            c
            for c in calls(mcp_dir / "fragile.jsonl")
            if c["key"].startswith(f"{run_id}/")
        ]
        assert len({c["pid"] for c in made if c["tool"] in ("die", "add")}) == 2
    finally:
        client.close()


def test_a_server_answering_malformed_json_rpc_fails_only_those_calls(
    sim_redis: EmbeddedServer, mcp_worker: Worker, policy: Scripts
) -> None:
    client, run_id = _run(sim_redis, "garbled", "garbled")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        garbled, invalid, fine = tool_results(policy.bodies("garbled")[-1])
        assert garbled["is_error"] is True
        assert (
            "did not answer tools/call 'garble' in 2 s (timeout_s) with a valid JSON-RPC"
            in _text(garbled)
        )
        assert invalid["is_error"] is True and "not a valid MCP result" in _text(
            invalid
        )
        assert _text(fine) == "fine" and "is_error" not in fine
        assert mcp_worker.process.poll() is None
    finally:
        client.close()


def test_an_mcp_tool_that_needs_approval_waits_and_an_edit_is_checked_against_its_listed_schema(
    sim_redis: EmbeddedServer, mcp_worker: Worker, mcp_dir: Path, policy: Scripts
) -> None:
    client, run_id = _run(sim_redis, "approved", "approving")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "asked" and status.approvals, status
        (held,) = status.approvals
        assert (held["name"], held["input"]) == ("remove", {"path": "/tmp/old"})
        assert calls(mcp_dir / "approving.jsonl") == []  # nothing ran while it waits
        with pytest.raises(ValueError, match="Invalid input for remove"):
            # the server's schema: a string
            client.edit(run_id, held["call_id"], {"path": 7})
        assert client.edit(run_id, held["call_id"], {"path": "/tmp/older"}) == "resumed"
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        (made,) = calls(mcp_dir / "approving.jsonl")
        assert (made["tool"], made["arguments"]) == ("remove", {"path": "/tmp/older"})
        assert "removed /tmp/older" in _text(
            tool_results(policy.bodies("approved")[-1])[0]
        )
    finally:
        client.close()


def test_an_mcp_url_a_run_names_is_refused_at_enqueue_without_a_connection(
    sim_redis: EmbeddedServer,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
        client = Client(sim_redis.url, toolsets=["counter"])
        try:
            for toolset in (f"mcp:{url}", url):
                spec = {
                    "model": MODEL,
                    "system": "x",
                    "toolset": toolset,
                    "messages": [{"role": "user", "content": "Go."}],
                }
                with pytest.raises(ToolsetError) as refused:
                    client.enqueue(spec)
                assert "is not registered" in str(refused.value) and "'counter'" in str(
                    refused.value
                )
        finally:
            client.close()
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected


def test_a_task_tool_over_stdio_is_two_phase_and_its_result_reaches_the_model(
    sim_redis: EmbeddedServer, mcp_worker: Worker, policy: Scripts
) -> None:
    # server-everything's simulate-research-query is listed taskSupport "required": its call is a
    # task (start: the task-augmented tools/call; wait: tasks/get until completed, then tasks/result)
    client, run_id = _run(sim_redis, "research", "everything")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        store = redis.Redis.from_url(sim_redis.url, decode_responses=True)
        records = [
            json.loads(value)
            for value in store.hgetall(keys.mcp_tasks(run_id)).values()
        ]
        store.close()
        assert [(r["tool"], r["ended"], r["where"]) for r in records] == [
            ("simulate-research-query", "completed", None)
        ]
        [result] = tool_results(policy.bodies("research")[-1])
        assert _text(result).startswith("# Research Report: tasks") and not result.get(
            "is_error"
        )
    finally:
        client.close()


def test_a_task_that_asks_for_input_is_cancelled_and_a_failed_task_is_an_error_result(
    sim_redis: EmbeddedServer, mcp_worker: Worker, policy: Scripts, mcp_dir: Path
) -> None:
    # toolloop gives MCP tasks no input (it advertises no elicitation): a task `input_required` is
    # cancelled at the server and the model reads what it wanted; a `failed` task's result is an error
    client, run_id = _run(sim_redis, "asking", "asking")
    try:
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", status
        asked, failed, ignorant = tool_results(policy.bodies("asking")[-1])
        assert asked.get("is_error") is True and failed.get("is_error") is True
        assert "asked for input (Which account should be charged?)" in _text(asked)
        assert "so it was cancelled" in _text(asked)
        assert _text(failed) == "The disk is full."
        assert ignorant.get("is_error") is True and "not a CreateTaskResult" in _text(
            ignorant
        )
        seen = [
            json.loads(line)
            for line in (mcp_dir / "asking.jsonl").read_text().splitlines()
        ]
        assert [
            entry
            for entry in seen
            if entry["method"] in ("tasks/cancel", "tasks/result")
        ] == [
            {"method": "tasks/cancel", "task": "task-1"},
            {"method": "tasks/result", "task": "task-2"},
        ]
        methods = [entry["method"] for entry in seen]
        # one connection throughout
        assert methods.count("tools/call") == 3 and methods.count("initialize") == 1
        store = redis.Redis.from_url(sim_redis.url, decode_responses=True)
        ended = sorted(
            json.loads(v)["ended"]
            for v in store.hgetall(keys.mcp_tasks(run_id)).values()
        )
        store.close()
        assert ended == ["failed", "input_required"]
    finally:
        client.close()
