"""Child runs (docs/children.md, issue #29): a tree of 100 children in 3 levels (4 + 16 + 80), run by
real workers against the provider simulator over HTTP, printed beside the target.

    .venv/bin/python bench/children.py        # about 1-2 minutes on 2 cores

1. Fan-out under a kill: the root's worker is SIGKILLed right after `spawn` stored and queued the
   root's 4 children and before that step's commit (kill point `spawn:after`), and once more during
   a level-1 fan-out; a supervisor restarts it. Counted: duplicate children (runs beyond the tree's
   101, and `child_started` events beyond one per child), and for every run of the tree its spend
   against the sum of its own model calls and its children's spend, to the cent.
2. Cancel: the same tree with leaves that answer slowly (5 s); once all 80 leaves are running, the
   root is cancelled: the time until every one of the 101 runs has ended `cancel`.
3. Budget: the root ($0.50) fans out to 100 children whose leaves call a tool turn after turn until
   their slices stop them: the tree's spend past the root's budget, against one in-flight model
   call per leaf (the most a leaf's last call cost).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "tests"),
]

from faults.workerpool import WorkerPool  # noqa: E402

from examples.children.policy import tree_policy  # noqa: E402
from toolloop.embedded import start_server  # noqa: E402
from toolloop.sim import SimServer  # noqa: E402
from workers.client import Client  # noqa: E402
from workers.client.enqueue import run_id_for  # noqa: E402
from workers.protocol import keys  # noqa: E402
from workers.protocol.records import FINAL, RunNode  # noqa: E402

FAN = "fan=4,4,5"  # 4 + 16 + 80 = 100 children in 3 levels


def spec(prompt: str, budget_usd: float = 20.0) -> dict[str, object]:
    return {
        "model": "claude-sonnet-5-5",
        "provider": "anthropic",
        "toolset": "tree",
        "budget_usd": budget_usd,
        "messages": [{"role": "user", "content": prompt}],
    }


def own_cost(client: Client, run_id: str) -> float:
    return sum(
        float(e.data["cost_usd"]) for e in client.events(run_id) if e.kind == "model"
    )


def wait_tree(client: Client, root: str, timeout: float) -> list[RunNode]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = client.tree(root)
        if len(nodes) > 1 and all(n.status in FINAL for n in nodes):
            return nodes
        time.sleep(0.05)
    raise TimeoutError(f"The tree of {root} did not end within {timeout:.0f} s.")


def fan_out_under_kill(
    client: Client, url: str, work: Path, env: dict[str, str]
) -> None:
    key = f"bench-tree-{time.time()}"
    root = run_id_for(key)
    plan = [{"point": "spawn:after", "run": root}, {"point": "spawn:after"}]
    (work / "plan.json").write_text(json.dumps(plan))
    began = time.monotonic()
    with WorkerPool(
        url,
        work,
        {**env, "TOOLLOOP_KILL_PLAN": str(work / "plan.json")},
        size=2,
        concurrency=32,
    ):
        client.enqueue(spec(f"{FAN} Review the cut."), idempotency_key=key)
        status = client.wait(root, timeout=300)
    took = time.monotonic() - began
    nodes = client.tree(root, most=500)
    kills = len((work / "plan.json.log").read_text().splitlines())
    runs = client.redis.zcard(keys.ALL_RUNS)
    started = sum(
        1 for n in nodes for e in client.events(n.run_id) if e.kind == "child_started"
    )
    duplicates = max(0, runs - len(nodes)) + max(0, started - (len(nodes) - 1))
    worst_cents = 0.0
    for node in nodes:
        below = sum(n.spent_usd for n in nodes if n.parent == node.run_id)
        worst_cents = max(
            worst_cents,
            abs(
                round(node.spent_usd * 100)
                - round((own_cost(client, node.run_id) + below) * 100)
            ),
        )
    root_node = nodes[0]
    print(
        f"fan-out  {len(nodes) - 1} children in 3 levels, {kills} SIGKILLs of a fanning-out worker, "
        f"root {status.status} in {took:.1f} s"
    )
    print(f"         duplicate children      ours {duplicates:>8}        target 0")
    print(
        f"         spend off by (cents)    ours {worst_cents:>8.0f}        target 0   "
        f"(root ${root_node.spent_usd:.4f} = own + children's, every run checked)"
    )


def cancel_tree(client: Client, url: str, work: Path, env: dict[str, str]) -> None:
    with WorkerPool(url, work, env, size=2, concurrency=64):
        root = client.enqueue(spec(f"{FAN} slow=5 Review the cut."))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            nodes = client.tree(root, most=500)
            leaves = [n for n in nodes if n.run_id.count(keys.CHILD_SEP) == 3]
            if len(leaves) == 80 and all(n.status == "running" for n in leaves):
                break
            time.sleep(0.05)
        asked = time.monotonic()
        client.cancel(root)
        nodes = wait_tree(client, root, 60)
        took = time.monotonic() - asked
    cancelled = sum(n.status == "cancel" for n in nodes)
    print(
        f"cancel   {cancelled} of {len(nodes)} runs ended cancel, the last {took:.3f} s after the cancel"
    )
    print(f"         cancel reaches all (s)  ours {took:>8.3f}        target <= 1")


def budget_tree(client: Client, url: str, work: Path, env: dict[str, str]) -> None:
    budget = 0.50
    with WorkerPool(url, work, env, size=2, concurrency=32):
        root = client.enqueue(spec(f"{FAN} spin Review the cut.", budget))
        nodes = wait_tree(client, root, 300)
    leaves = [n for n in nodes if n.run_id.count(keys.CHILD_SEP) == 3]
    per_call = max(
        float(e.data["cost_usd"])
        for n in leaves
        for e in client.events(n.run_id)
        if e.kind == "model"
    )
    over = max(0.0, nodes[0].spent_usd - budget)
    leaf_over = sum(max(0.0, n.spent_usd - (n.budget_usd or 0)) for n in leaves)
    allowed = len(leaves) * per_call
    print(
        f"budget   root ${budget:.2f}: tree spent ${nodes[0].spent_usd:.4f}, "
        f"{sum(n.status == 'budget' for n in leaves)} of {len(leaves)} leaves stopped by their slice"
    )
    print(
        f"         overshoot (USD)         ours {over:>8.4f}        target <= {allowed:.4f} "
        f"(one in-flight call per leaf: {len(leaves)} x ${per_call:.4f})"
    )
    print(
        f"         leaves past their slice ours {leaf_over:>8.4f}        target <= {allowed:.4f} (summed)"
    )


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-children-") as tmp,
        SimServer(tree_policy) as sim,
    ):
        work = Path(tmp)
        server = start_server(work / "redis")
        env = {
            "ANTHROPIC_BASE_URL": sim.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-FAKE-bench",
            "TOOLLOOP_PROMPT_GEN": "",
            "TOOLLOOP_TOOLSETS": "tree=examples.children.tools:TOOLS",
        }
        client = Client(server.url, toolsets=["tree"])
        try:
            for name, part in (
                ("kill", fan_out_under_kill),
                ("cancel", cancel_tree),
                ("budget", budget_tree),
            ):
                (work / name).mkdir()
                part(client, server.url, work / name, env)
        finally:
            client.close()
            server.stop()


if __name__ == "__main__":
    main()
