"""Child runs (SPEC 6.2, docs/children.md): a run's `spawn` starts child runs, waits for them with no
worker held, and rolls their spend up exactly; a cancel reaches the whole tree; a child's question is
answered through its root. Real parts: a private Redis, a real worker process, the provider simulator
over HTTP playing examples/children/policy.py, the toolset of examples/children/tools.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.children.policy import tree_policy
from tests.integration.conftest import Worker, own_redis, sim_env, start_worker
from tests.integration.runs_kit import celery_events, eventually
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import AsyncClient, Client
from workers.protocol import keys
from workers.protocol.errors import RunStateError
from workers.protocol.records import FINAL, RunNode
from workers.protocol.scripts.children import RUN_KEY

TOOLSETS = "tree=examples.children.tools:TOOLS"


@pytest.fixture(scope="module")
def tree_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "tree-redis")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(tree_policy) as server:
        yield server


@pytest.fixture(scope="module")
def tree_worker(
    tree_redis: EmbeddedServer, sim: SimServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    directory = tmp_path_factory.mktemp("tree-worker")
    extra = {
        "TOOLLOOP_TOOLSETS": TOOLSETS,
        "TOOLLOOP_TRACES_FILE": str(directory / "traces.jsonl"),
        "TOOLLOOP_METRICS_PORT": str(free_port()),
    }
    process = start_worker(tree_redis.url, directory, sim_env(sim, None, **extra))
    process.traces = directory / "traces.jsonl"  # type: ignore[attr-defined]
    process.metrics_port = int(extra["TOOLLOOP_METRICS_PORT"])  # type: ignore[attr-defined]
    yield process
    process.stop()


@pytest.fixture
def client(tree_redis: EmbeddedServer, tree_worker: Worker) -> Iterator[Client]:
    made = Client(tree_redis.url, toolsets=["tree"])
    yield made
    made.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spec(prompt: str, **fields: object) -> dict[str, object]:
    return {
        "model": "claude-sonnet-5-5",
        "provider": "anthropic",
        "toolset": "tree",
        "messages": [{"role": "user", "content": prompt}],
        **fields,
    }


def own_cost(client: Client, run_id: str) -> float:
    """What the run's own model calls cost (its `model` events)."""
    return sum(
        float(e.data["cost_usd"]) for e in client.events(run_id) if e.kind == "model"
    )


def ended_tree(client: Client, run_id: str) -> list[RunNode] | None:
    """The run's tree once every run of it has ended, else None."""
    nodes = client.tree(run_id)
    return nodes if all(node.status in FINAL for node in nodes) else None


def children_of(nodes: list[RunNode], run_id: str) -> list[RunNode]:
    return [node for node in nodes if node.parent == run_id]


def test_a_parent_spawns_children_that_finish_and_its_spend_is_theirs_and_its_own(
    client: Client,
) -> None:
    root = client.enqueue(spec("fan=3,2 Review the cut."))
    status = client.wait(root, timeout=60)
    assert status.status == "done", status
    assert status.final_text == "Collected: 3 child runs finished:"
    nodes = client.tree(root)
    assert len(nodes) == 1 + 3 + 6 and all(node.status == "done" for node in nodes)
    for node in (
        nodes
    ):  # each run's spend: its own calls and its children's, to the micro-dollar
        below = sum(child.spent_usd for child in children_of(nodes, node.run_id))
        assert node.spent_usd == pytest.approx(
            own_cost(client, node.run_id) + below, abs=1e-6
        )
        assert round(node.spent_usd, 2) == round(
            own_cost(client, node.run_id) + below, 2
        )
    first = children_of(nodes, root)[0]
    # a slice of the root's $1
    assert first.run_id.startswith(f"{root}.") and first.budget_usd is not None
    assert (
        client.status(first.run_id).parent == root
        and client.status(first.run_id).depth == 1
    )
    kinds = [e.kind for e in client.events(root)]
    assert kinds == [
        "queued",
        "model",
        *["child_started"] * 3,
        "waiting",
        *["child_finished"] * 3,
        "woken",
        "tool",
        "model",
        "finished",
    ]
    started = [e for e in client.events(root) if e.kind == "child_started"]
    assert [e.data["child"] for e in started] == [
        n.run_id for n in children_of(nodes, root)
    ]
    spawn_result = next(m for m in client.history(root) if m.role == "tool")
    assert "3 child runs finished" in str(spawn_result.content)
    # AsyncClient reads the same
    assert asyncio.run(async_tree(client.settings.redis_url, root)) == nodes


async def async_tree(url: str, run_id: str) -> list[RunNode]:
    made = AsyncClient(url, toolsets=["tree"])
    try:
        return await made.tree(run_id)
    finally:
        await made.aclose()


def test_a_waiting_parent_holds_no_worker_and_no_lease(client: Client) -> None:
    root = client.enqueue(spec("fan=2 slow=1.5 Review."))
    eventually(lambda: client.status(root).status == "waiting", timeout=20)
    assert client.redis.exists(keys.lease(root)) == 0
    # no step of it queued: only its last child wakes it
    assert client.redis.zcard(keys.outbox(root)) == 0
    assert client.wait(root, timeout=30).status == "done"
    assert [e.kind for e in client.events(root)].count(
        "woken"
    ) == 1  # woken once, by the last child


def test_cancel_of_the_root_reaches_every_descendant(client: Client) -> None:
    root = client.enqueue(spec("fan=2,2 slow=5 Review."))
    eventually(
        lambda: (
            len(client.tree(root)) == 7
            and all(
                n.status == "running"
                for n in client.tree(root)
                if n.run_id.count(".") == 2
            )
        ),
        timeout=30,
    )
    asked = time.monotonic()
    client.cancel(root)
    nodes = eventually(lambda: ended_tree(client, root), timeout=10)
    took = time.monotonic() - asked
    assert [n.status for n in nodes] == ["cancel"] * 7, nodes
    print(f"cancel reached the 7 runs of the tree in {took:.3f} s")
    # the bench (bench/children.py) measures it: under 1 s on a quiet machine
    assert took < 3.0, took
    with pytest.raises(Exception, match="has ended"):
        client.cancel(children_of(nodes, root)[0].run_id)


def test_a_childs_question_is_answered_through_the_root(client: Client) -> None:
    root = client.enqueue(spec("fan=2 ask Review."))
    eventually(
        lambda: sum(n.asked is not None for n in client.tree(root)) == 2, timeout=30
    )
    asked = [e for e in client.events(root) if e.kind == "child_asked"]
    assert len(asked) == 2 and asked[0].data["asked"]["question"].startswith(
        "Which take"
    )
    # in spawn order, whichever asked first
    first, second = children_of(client.tree(root), root)
    # the root waits on its children: it shows the question
    status = client.wait(root, timeout=10)
    assert status.status == "waiting" and status.asking == first.run_id
    assert status.asked == first.asked and {e.data["child"] for e in asked} == {
        first.run_id,
        second.run_id,
    }
    client.answer(root, "Take 2")  # to the first child that asks
    # then the other one asks
    assert client.wait(root, timeout=20).asking == second.run_id
    client.answer(root, "Take 3")
    assert client.wait(root, timeout=30).status == "done"
    finals = [n.final_text for n in children_of(client.tree(root), root)]
    assert finals == ["You said: Take 2", "You said: Take 3"]


def test_a_child_cannot_overspend_its_slice(client: Client) -> None:
    root = client.enqueue(spec("fan=3 spin Review.", budget_usd=0.04))
    status = client.wait(root, timeout=60)
    nodes = client.tree(root)
    leaves = children_of(nodes, root)
    assert [leaf.status for leaf in leaves] == ["budget"] * 3
    total_over = 0.0
    for (
        leaf
    ) in leaves:  # a leaf stops at its slice; it may pass it by the one call in flight
        calls = [
            float(e.data["cost_usd"])
            for e in client.events(leaf.run_id)
            if e.kind == "model"
        ]
        assert (
            leaf.budget_usd is not None
            and leaf.spent_usd <= leaf.budget_usd + max(calls) + 1e-9
        )
        total_over += max(0.0, leaf.spent_usd - leaf.budget_usd)
    assert sum(leaf.budget_usd or 0 for leaf in leaves) <= 0.04
    below = sum(n.spent_usd for n in leaves)
    assert status.spent_usd == pytest.approx(own_cost(client, root) + below, abs=1e-6)
    calls = [
        float(e.data["cost_usd"])
        for n in leaves
        for e in client.events(n.run_id)
        if e.kind == "model"
    ]
    # the tree's overshoot
    assert max(0.0, status.spent_usd - 0.04) <= len(leaves) * max(calls) + 1e-9


def test_children_asking_for_more_than_is_left_are_refused(client: Client) -> None:
    # 2 x $0.60 from a $1 budget
    root = client.enqueue(spec("fan=2 budget=0.6 Review."))
    status = client.wait(root, timeout=30)
    assert status.status == "done" and status.children == 0
    assert status.final_text is not None and "Your budget has $0.9" in status.final_text
    assert len(client.tree(root)) == 1


def test_the_lua_key_of_a_tree_run_is_the_key_of_keys(
    tree_redis: EmbeddedServer,
) -> None:
    plain = redis.Redis.from_url(tree_redis.url, decode_responses=True)
    try:
        for run_id in ("abc", "s2-abc", "abc.12ef-0", "s1-abc.12ef-0.99aa-3"):
            script = RUN_KEY + "\nreturn run_key(ARGV[1], ARGV[2], 'state')"
            assert plain.eval(script, 0, keys.PREFIX, run_id) == keys.state(run_id)
        assert keys.state("abc.12ef-0").startswith("tl:{abc}.")  # the root's slot
    finally:
        plain.close()


def test_a_child_whose_question_expires_still_wakes_its_parent(client: Client) -> None:
    # children inherit the deadline
    root = client.enqueue(spec("fan=1 ask Review.", ask_timeout_s=1))
    # the child asks; nobody answers
    assert client.wait(root, timeout=30).asking is not None
    status = eventually(
        lambda: (found := client.status(root)).finished and found, timeout=30
    )
    assert status.status == "done", status
    (child,) = children_of(client.tree(root), root)
    assert child.status == "expired"
    assert [e.kind for e in client.events(root)].count("woken") == 1


def run_spans(traces: Path, run_ids: list[str]) -> dict[str, dict[str, Any]] | None:
    """The `toolloop.run` spans of the worker's traces file, by run id, once each of `run_ids` has one."""
    spans = (
        [json.loads(line) for line in traces.read_text().splitlines()]
        if traces.exists()
        else []
    )
    found = {
        s["attributes"]["toolloop.run_id"]: s
        for s in spans
        if s["name"] == "toolloop.run"
    }
    return found if all(run_id in found for run_id in run_ids) else None


def test_traces_and_metrics_name_the_children(
    client: Client, tree_worker: Worker
) -> None:
    root = client.enqueue(spec("fan=2 Review."))
    assert client.wait(root, timeout=30).status == "done"
    nodes = client.tree(root)
    traces: Path = tree_worker.traces  # type: ignore[attr-defined]
    runs = eventually(lambda: run_spans(traces, [n.run_id for n in nodes]))
    parent = runs[root]
    for child in children_of(
        nodes, root
    ):  # a child's run span: in its parent's trace, under its span
        span = runs[child.run_id]
        assert span["attributes"]["toolloop.parent_run_id"] == root
        assert (
            span["trace_id"] == parent["trace_id"]
            and span["parent_id"] == parent["span_id"]
        )
    port = tree_worker.metrics_port  # type: ignore[attr-defined]
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        .read()
        .decode()
    )
    started = [
        line
        for line in text.splitlines()
        if line.startswith("toolloop_children_started_total")
    ]
    assert started and float(started[0].split()[-1]) >= 2
    assert 'toolloop_children_ended_total{status="done"}' in text


def test_flower_sees_each_childs_steps_from_the_moment_they_are_sent(
    client: Client,
) -> None:
    with celery_events(client, "task-sent") as sent:
        root = client.enqueue(spec("fan=2 Review."))
        assert client.wait(root, timeout=30).status == "done"
        nodes = client.tree(root)
        eventually(lambda: len(sent) >= 5, timeout=10)
    by_id = {event["uuid"]: event for event in sent}
    for child in children_of(
        nodes, root
    ):  # each child's first step, named by its id and label
        event = by_id[f"{child.run_id}:1"]
        assert event["name"] == "toolloop.advance" and event["queue"] == "llm"
        assert child.run_id in event["args"] and "model 1" in event["kwargs"]
    # 2 started them; 3 reads how they ended
    woken = [e for e in sent if e["uuid"] == f"{root}:3"]
    # sent once, by the last child's end
    assert len(woken) == 1 and "tool spawn" in woken[0]["kwargs"]


def test_children_need_room_in_the_parents_account(client: Client) -> None:
    client.set_account_limit("tree-team", 1.0, period="total")
    # $1.20 > the account's $1
    asks = spec("fan=2 budget=0.6 Review.", account="tree-team", budget_usd=5.0)
    refused = client.enqueue(asks)
    status = client.wait(refused, timeout=30)
    assert status.status == "done" and status.children == 0, status
    assert (
        status.final_text is not None
        and "The account 'tree-team' has $0.99" in status.final_text
    )
    fits = client.enqueue(
        spec("fan=2 budget=0.01 Review.", account="tree-team", budget_usd=5.0)
    )
    assert client.wait(fits, timeout=30).status == "done"
    (account,) = [a for a in client.accounts() if a.name == "tree-team"]
    # the hold freed once they were stored
    assert account.reserved_usd == pytest.approx(0, abs=1e-9)
    total = client.status(refused).spent_usd + client.status(fits).spent_usd
    # every call of both trees charged once
    assert account.spent_usd == pytest.approx(total, abs=1e-6)


def test_an_interrupt_leaves_a_waiting_parent_to_its_children_and_a_cancel_reaches_them(
    client: Client,
) -> None:
    """A parent parked on its children holds no model call to stop: an interrupt is refused (it
    stays `waiting`, the children go on), and a cancel after it still reaches every child."""
    root = client.enqueue(spec("fan=2 slow=5 Review."))
    eventually(lambda: client.status(root).status == "waiting", timeout=20)
    with pytest.raises(RunStateError, match="is waiting; only a queued or running run"):
        client.interrupt(root)
    nodes = client.tree(root)
    assert [n.status for n in nodes] == ["waiting", "running", "running"], nodes
    client.cancel(root)
    nodes = eventually(lambda: ended_tree(client, root), timeout=10)
    assert [n.status for n in nodes] == ["cancel"] * 3, nodes


def test_a_steer_to_a_parent_waiting_on_its_children_is_read_when_it_resumes(
    client: Client,
) -> None:
    root = client.enqueue(spec("fan=2 slow=3 Review."))
    eventually(lambda: client.status(root).status == "waiting", timeout=20)
    steer_id = client.steer(root, "Also check the sound.")
    assert client.status(root).status == "waiting"  # it holds no worker for it
    assert client.wait(root, timeout=60).status == "done"
    history = client.history(root)
    # once, after the spawn call's result (never between a tool use and its result)
    said = [i for i, m in enumerate(history) if m.content == "Also check the sound."]
    assert len(said) == 1 and type(history[said[0] - 1]).__name__ == "ToolMessage"
    assert [type(m).__name__ for m in history[:4]] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "UserMessage",
    ]
    kinds = [e.kind for e in client.events(root)]
    assert kinds[:12] == [
        "queued",
        "model",
        "child_started",
        "child_started",
        "waiting",
        "steer_sent",
        "child_finished",
        "child_finished",
        "woken",
        "tool",
        "steer",
        "model",
    ]
    assert f"steer:{steer_id}" in client.redis.hkeys(f"tl:{{{root}}}:journal:s0")


def test_a_follow_up_to_an_ended_child_is_refused_and_the_tree_spend_stays_exact(
    client: Client,
) -> None:
    """A child's spend rolls up to its parent once, when it ends: a follow-up of its own would spend
    past what its parent counted, so it is refused with what to do; the tree's spend stays exact."""
    root = client.enqueue(spec("fan=2 Review."))
    assert client.wait(root, timeout=60).status == "done"
    child = children_of(client.tree(root), root)[0]
    with pytest.raises(RunStateError, match="child run") as refused:
        client.send(child.run_id, "Once more, shorter.")
    assert "root run" in str(refused.value)
    assert client.status(child.run_id).status == "done"
    assert client.status(child.run_id).spent_usd == child.spent_usd
    nodes = client.tree(root)
    below = sum(node.spent_usd for node in children_of(nodes, root))
    assert client.status(root).spent_usd == pytest.approx(
        own_cost(client, root) + below, abs=1e-6
    )
