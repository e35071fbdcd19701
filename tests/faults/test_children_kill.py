"""Child runs under kills (docs/children.md): a worker SIGKILLed during a fan-out, after `spawn`'s
start stored and queued its children and before that step's commit (`spawn:after`,
workers/testing/killpoints.py). The killed step runs again on the restarted worker and
finds its children stored: 0 duplicate children, every run of the tree done once, the spend rolled up
to the micro-dollar. Real supervised workers (faults.workerpool), the simulator over HTTP. (Once in
the bounded suite; a second kill anywhere in the tree with TOOLLOOP_FAULTS=full; bench/children.py
kills during a 100-child fan-out.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.children.policy import tree_policy
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.client.enqueue import run_id_for
from workers.protocol import keys

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(tree_policy) as server:
        yield server


def test_a_kill_during_the_fan_out_starts_no_second_child(
    redis_server: EmbeddedServer, sim: SimServer, work_dir: Path, faults_full: bool
) -> None:
    key = f"tree-{work_dir.name}"
    root = run_id_for(key)
    # the root's fan-out
    plan: list[dict[str, str]] = [{"point": "spawn:after", "run": root}]
    if faults_full:  # and a second one, wherever it lands (TOOLLOOP_FAULTS=full)
        plan.append({"point": "spawn:after"})
    (work_dir / "plan.json").write_text(json.dumps(plan))
    env = {
        "ANTHROPIC_BASE_URL": sim.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-FAKE-tree",
        "TOOLLOOP_PROMPT_GEN": "",
        "TOOLLOOP_TOOLSETS": "tree=examples.children.tools:TOOLS",
        "TOOLLOOP_KILL_PLAN": str(work_dir / "plan.json"),
    }
    client = Client(redis_server.url, toolsets=["tree"])
    try:
        with WorkerPool(redis_server.url, work_dir, env, size=2, concurrency=4) as pool:
            spec = {
                "model": "claude-sonnet-5-5",
                "provider": "anthropic",
                "toolset": "tree",
                "messages": [{"role": "user", "content": "fan=3,3 Review the cut."}],
            }
            assert client.enqueue(spec, idempotency_key=key) == root
            status = client.wait(root, timeout=90)
            deaths = list(pool.deaths)
        assert status.status == "done", status
        fired = [
            json.loads(line)
            for line in (work_dir / "plan.json.log").read_text().splitlines()
        ]
        assert [entry["point"] for entry in fired] == ["spawn:after"] * len(
            plan
        ) and len(deaths) == len(plan)
        nodes = client.tree(root)
        assert len(nodes) == 1 + 3 + 9 and all(
            node.status == "done" for node in nodes
        ), nodes
        # no run but the tree's: 0 duplicate children
        assert client.redis.zcard(keys.ALL_RUNS) == 13
        for node in nodes:
            below = [n for n in nodes if n.parent == node.run_id]
            started = [
                e for e in client.events(node.run_id) if e.kind == "child_started"
            ]
            # each child started once, whatever was killed
            assert len(started) == len(below)
            calls = [
                f
                for f in client.redis.hkeys(keys.children(node.run_id))
                if f.startswith("call:")
            ]
            # one spawn call, its children stored once
            assert len(calls) == (1 if below else 0)
            own = sum(
                float(e.data["cost_usd"])
                for e in client.events(node.run_id)
                if e.kind == "model"
            )
            assert node.spent_usd == pytest.approx(
                own + sum(n.spent_usd for n in below), abs=1e-6
            )
    finally:
        client.close()
