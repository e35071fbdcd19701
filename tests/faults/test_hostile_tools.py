"""Tool code cannot stop a worker, and a tool that kills its worker fails only its own run.

- `SystemExit(2)` (argparse on a bad argument the model chose) and `KeyboardInterrupt` from tools,
  on a fleet of two workers: each call is answered with a tool error the model reads, its run goes
  on to `done`, the healthy runs in flight finish, no worker dies, both keep taking steps, and the
  worker's log names the run and the call (toolloop/loop/tools.py `call_tool`).
- `os.abort()` in a registered tool, beside healthy runs in flight on the same worker: each crash
  redelivers them all, but the redelivered steps run one at a time per process and only the one
  running when the process died is charged a delivery (workers/process/suspects.py): the crashing run fails
  with DeliveryLimitError and the runs beside it finish (before: each crash charged every step in
  flight, and they failed with it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from faults.toolset import read_effects
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from workers.client import Client

pytestmark = pytest.mark.faults

TOOLSETS = [
    *(entry.split("=")[0] for entry in os.environ["TOOLLOOP_TOOLSETS"].split(",")),
    "hostile",
]


def _env(directory: Path, **extra: str) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "TOOLLOOP_PROMPT_GEN": "faults.hostile:make_generate",
        "TOOLLOOP_TOOLSETS": os.environ["TOOLLOOP_TOOLSETS"]
        + ",hostile=faults.hostile:TOOLS",
        "TOOLLOOP_FAULTS_DIR": str(directory),
        **extra,
    }


def _run(client: Client, text: str) -> str:
    return client.enqueue(
        {
            "model": "m",
            "system": "hostile",
            "messages": [{"role": "user", "content": text}],
            "toolset": "hostile",
            "budget_usd": 1.0,
            "max_steps": 10,
        }
    )


@pytest.mark.timeout(180)
def test_a_tool_that_exits_fails_its_call_and_both_workers_go_on(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    directory = work_dir / "exits"
    client = Client(redis_server.url, toolsets=TOOLSETS)
    try:
        with WorkerPool(
            redis_server.url, directory, _env(directory), size=2, concurrency=4
        ) as pool:
            pids = set(pool.pids())
            healthy = [_run(client, f"work h{i} 1.0 2") for i in range(4)]
            exits = [_run(client, "call parse --count many") for _ in range(2)]
            interrupts = [_run(client, "call interrupt now") for _ in range(2)]
            for run_id in exits + interrupts:
                status = client.wait(run_id, timeout=60)
                assert status.status == "done", status
                raised = "SystemExit(2)" if run_id in exits else "KeyboardInterrupt()"
                tool = "parse" if run_id in exits else "interrupt"
                assert (status.final_text or "").startswith(
                    f"Read: Tool {tool!r} failed: it raised {raised}"
                )
            for run_id in healthy:
                assert client.wait(run_id, timeout=60).status == "done"
            after = time.time()
            later = [_run(client, f"work p{i} 1.0 1") for i in range(12)]
            for run_id in later:
                assert client.wait(run_id, timeout=60).status == "done"
            assert pool.deaths == [] and set(pool.pids()) == pids, "a worker died"
            effects = read_effects(directory)
            worked = {
                e["pid"]
                for e in effects
                if e["tag"].startswith("p") and e["at"] > after
            }
            assert worked == pids, (
                f"steps after the exits ran only in {worked} of {pids}"
            )
            logs = "".join(path.read_text(errors="replace") for path in pool.logs)
        for run_id in exits:
            assert (
                f"step {run_id}/s0/tool:toolu_" in logs
                and "raised SystemExit(2)" in logs
            )
    finally:
        client.close()


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_tool_that_aborts_fails_only_its_own_run(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    directory = work_dir / "aborts"
    client = Client(redis_server.url, toolsets=TOOLSETS)
    env = _env(directory, TOOLLOOP_MAX_DELIVERIES="3")
    try:
        with WorkerPool(
            redis_server.url, directory, env, size=1, concurrency=4
        ) as pool:
            beside = [_run(client, f"work b{i} 2.0 2") for i in range(3)]
            time.sleep(0.5)  # their first tool steps are in flight when the crash comes
            crashing = _run(client, "call crash now")
            status = client.wait(crashing, timeout=120)
            assert (
                status.status == "failed" and status.error_class == "DeliveryLimitError"
            ), status
            assert "3 of them count" not in (status.error_message or "")
            assert "4 of them count" in (status.error_message or ""), (
                status.error_message
            )
            for run_id in beside:
                finished = client.wait(run_id, timeout=60)
                assert finished.status == "done" and finished.final_text == "Worked.", (
                    finished
                )
            crashes = [e for e in read_effects(directory) if e["kind"] == "crash"]
            assert len(crashes) == 3 and len(pool.deaths) >= 3, (crashes, pool.deaths)
    finally:
        client.close()
