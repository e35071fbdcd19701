"""MCP Tasks as two-phase tools against the real reference server, with workers SIGKILLed.

The reference server `@modelcontextprotocol/server-everything` (2026.8.31, its MCP TypeScript SDK
1.32's 2025-11-25 Tasks) over streamable HTTP, a process of its own that outlives the workers; its
`simulate-research-query` tool is listed `taskSupport: "required"` and runs about 4 s through four
stages. The server keeps each HTTP session's tasks apart (one task store per session), so a task is
found again only on the session that started it: the worker journals that session id with the task.

Real supervised workers (faults.workerpool) and the provider simulator over HTTP. Counted at the
server (`tasks/list` on the journaled session, tests/support/mcp.py `session_tasks`):
- a worker killed after the task-augmented `tools/call` returned (its task journaled, the start step
  not committed: `mcp:task`), and again while polling it (`mcp:polled`): the session holds ONE task,
  completed; the report reaches the model's next request; the record says `completed`.
- a run cancelled as soon as its task is journaled (its start or its wait running): the session's
  one task is `cancelled` (`tasks/cancel` sent by the wait, or by the cancel stop when the wait never
  ran), and the record says so: 0 orphaned tasks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from faults.conftest import FULL
from faults.workerpool import WorkerPool
from tests.support.mcp import (
    Scripts,
    everything_command,
    everything_http,
    session_tasks,
    tool_results,
)
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys

pytestmark = pytest.mark.faults

RESEARCH = {"name": "simulate-research-query", "input": {"topic": "durable agents"}}
SECOND = {"name": "simulate-research-query", "input": {"topic": "journals"}}
SCRIPTS = {
    "tasks-killed": [
        {"text": "Researching.", "tool_calls": [RESEARCH, SECOND]},
        {"text": "Done."},
    ],
    "tasks-cancelled": [
        {"text": "Researching.", "tool_calls": [RESEARCH]},
        {"text": "Done."},
    ],
    "tasks-stdio": [
        {"text": "Researching.", "tool_calls": [RESEARCH]},
        {"text": "Done."},
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
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with everything_http(tmp_path_factory.mktemp("everything") / "server.log") as url:
        yield url


def _pool(
    redis_server: EmbeddedServer,
    sim: SimServer,
    work_dir: Path,
    url: str,
    plan: list[dict[str, Any]],
) -> WorkerPool:
    servers = {
        "everything": {"mcp": {"url": url}},
        "stdio": {"mcp": {"command": everything_command()}},
    }
    (work_dir / "toolsets.yaml").write_text(yaml.safe_dump(servers))
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


def _spec(system: str, toolset: str = "everything") -> dict[str, Any]:
    return {
        "model": "claude-sonnet-5-5",
        "provider": "anthropic",
        "system": system,
        "toolset": toolset,
        "messages": [{"role": "user", "content": "Research durable agents."}],
    }


def _records(redis_url: str, run_id: str) -> list[dict[str, Any]]:
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return [
            json.loads(value)
            for value in store.hgetall(keys.mcp_tasks(run_id)).values()
        ]
    finally:
        store.close()


def _resumed_in(log: Path, run_id: str, task_id: str) -> float | None:
    """Seconds from this worker log's last receipt of a step of `run_id` to its first tasks/get of
    `task_id` (None: it never polled it after a receipt)."""
    received: float | None = None
    for line in log.read_text(errors="replace").splitlines():
        at = line[1:24]  # "[2026-12-02 04:43:57,734: ..."
        if f"toolloop.advance[{run_id}:" in line and line.endswith("received"):
            received = datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        elif (
            f"task {task_id!r}" in line
            and "the first tasks/get of this wait" in line
            and received is not None
        ):
            return datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f").timestamp() - received
    return None


def test_a_task_outlives_killed_workers_and_is_started_once_and_its_result_reaches_the_model(
    redis_server: EmbeddedServer,
    sim: SimServer,
    tmp_path: Path,
    policy: Scripts,
    everything: str,
) -> None:
    # The calls run in order. The first start is killed once its task is journaled (the redelivered
    # start finds it; by then the 4 s task may be over); a first poll that sees a task `working` (the
    # second's, or the first's if the redelivery beat it) is killed, and the poll runs again on the
    # journaled session from a new worker process.
    plan = [
        {"point": "mcp:task", "tool": "simulate-research-query"},
        {"point": "mcp:polled", "status": "working"},
    ]
    client = Client(redis_server.url, toolsets=["everything"])
    try:
        with _pool(redis_server, sim, tmp_path, everything, plan) as pool:
            run_id = client.enqueue(_spec("tasks-killed"))
            status = client.wait(run_id, timeout=120)
            deaths = list(pool.deaths)
        assert status.status == "done", status
        fired = [
            json.loads(line)
            for line in (tmp_path / "plan.json.log").read_text().splitlines()
        ]
        assert [entry["point"] for entry in fired] == [
            "mcp:task",
            "mcp:polled",
        ] and len(deaths) == 2
        records = _records(redis_server.url, run_id)
        assert len(records) == 2 and {record["ended"] for record in records} == {
            "completed"
        }
        # the killed poll's task
        assert fired[1]["task"] in {record["task"] for record in records}
        # the second: a new worker's
        sessions = {json.dumps(record["where"]) for record in records}
        tasks = [
            task
            for where in sessions
            for task in session_tasks(everything, json.loads(where))
        ]
        started = sorted((task["taskId"], task["status"]) for task in tasks)
        # each task once, none orphaned:
        assert started == sorted((record["task"], "completed") for record in records)
        last = policy.bodies("tasks-killed")[-1]
        texts = [
            "".join(part["text"] for part in result["content"])
            for result in tool_results(last)
        ]
        assert [text.splitlines()[0] for text in texts] == [
            "# Research Report: durable agents",
            "# Research Report: journals",
        ]
        assert not any(result.get("is_error") for result in tool_results(last))
        assert len([m for m in client.history(run_id) if m.role == "tool"]) == 2
        # the worker started after the poll's kill (the last log that polls the task; the killed
        # worker's log is before it) polls that task within a second of receiving the redelivered step
        gaps = [
            gap
            for log in pool.logs
            if (gap := _resumed_in(log, run_id, fired[1]["task"])) is not None
        ]
        assert len(gaps) == 2 and gaps[-1] < 1.0, gaps
        print(
            f"polling resumed {gaps[-1] * 1000:.0f} ms after the redelivered step was received"
        )
    finally:
        client.close()


def test_a_cancelled_run_cancels_its_task_at_the_server(
    redis_server: EmbeddedServer, sim: SimServer, tmp_path: Path, everything: str
) -> None:
    # Two runs: one cancelled as soon as its task is journaled (the cancel stop sends tasks/cancel:
    # its wait never polls), one a second later (its wait is polling: the wait sends it).
    client = Client(redis_server.url, toolsets=["everything"])
    try:
        with _pool(redis_server, sim, tmp_path, everything, []):
            runs = []
            for delay in (0.0, 1.0):
                run_id = client.enqueue(_spec("tasks-cancelled"))
                deadline = time.monotonic() + 60
                while (
                    not _records(redis_server.url, run_id)
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.005)
                time.sleep(delay)
                client.cancel(run_id)
                runs.append((run_id, client.wait(run_id, timeout=60)))
        for run_id, status in runs:
            assert status.status == "cancel", status
            [record] = _records(redis_server.url, run_id)
            assert record["ended"] == "cancelled"
            tasks = session_tasks(everything, record["where"])
            assert (record["task"], "cancelled") in [
                (task["taskId"], task["status"]) for task in tasks
            ]
            # none left working
            assert {task["status"] for task in tasks} <= {
                "cancelled",
                "completed",
            }
    finally:
        client.close()


@pytest.mark.skipif(
    not FULL, reason="about 25 s: with TOOLLOOP_FAULTS=full (make faults-full)"
)
def test_a_stdio_task_dies_with_its_worker_and_is_not_started_again(
    redis_server: EmbeddedServer,
    sim: SimServer,
    tmp_path: Path,
    policy: Scripts,
    everything: str,
) -> None:
    # A stdio server is a child of the worker: the SIGKILL of the worker's process group ends it and
    # its tasks. The redelivered wait asks the new server for the journaled task id, which it does
    # not know (-32602): the model reads that the task is gone, and nothing is started again.
    client = Client(redis_server.url, toolsets=["stdio"])
    try:
        plan = [{"point": "mcp:polled", "status": "working"}]
        with _pool(redis_server, sim, tmp_path, everything, plan) as pool:
            run_id = client.enqueue(_spec("tasks-stdio", "stdio"))
            status = client.wait(run_id, timeout=90)
            deaths = list(pool.deaths)
        assert status.status == "done", status
        assert len(deaths) == 1
        [record] = _records(redis_server.url, run_id)
        assert record["ended"] == "gone" and record["where"] is None
        [result] = tool_results(policy.bodies("tasks-stdio")[-1])
        text = "".join(part["text"] for part in result["content"])
        assert result.get("is_error") is True
        assert (
            f"task {record['task']!r} of 'stdio' is gone" in text
            and "not started again" in text
        )
        assert len([m for m in client.history(run_id) if m.role == "tool"]) == 1
    finally:
        client.close()
