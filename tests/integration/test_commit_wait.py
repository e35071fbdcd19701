"""A commit that Redis took but whose WAIT was not confirmed (TOOLLOOP_COMMIT_WAIT: the replica was
frozen) is retried; when its first attempt had already begun the successor in the same script
(`go_on`: the successor runs in the committing process), the retry gets that begin back and the run
goes on at once. It used to find the fence moved by its own begin, take itself for a stale copy and
leave the run to the visibility timeout (3600 s by default) or the sweeper's re-drive (300 s): seen
in the Sentinel drill with the production timers, where a failover cut a commit's WAIT short.

Real parts: a primary and a replica (redis-server processes; the replica frozen with SIGSTOP while the
first model answer is committed), a worker process with the default delivery timers, the provider
simulator over HTTP."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis

from tests.integration.conftest import sim_env, start_worker
from tests.integration.runs_kit import eventually, kinds, logged, spec
from tests.support.sentinel import SentinelSet
from tests.support.timers import PRODUCTION_TIMERS
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client
from workers.process.redisio import Batch
from workers.protocol.lua import Lua

pytestmark = pytest.mark.integration

ANSWER_S = 1.0


class Model:
    """Turn 0 takes ANSWER_S and calls `slow` briefly; turn 1 answers. Counts the requests per turn."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turns: Counter[int] = Counter()

    def __call__(self, request: SimRequest) -> SimTurn:
        with self.lock:
            self.turns[request.assistant_turns] += 1
        if request.assistant_turns == 0:
            return SimTurn(
                text="Waiting.",
                tool_calls=[{"name": "slow", "input": {"seconds": 0.1}}],  # type: ignore[list-item]
                latency_s=ANSWER_S,
            )
        return SimTurn(text="Done waiting.")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[SentinelSet]:
    nodes = SentinelSet(tmp_path / "redis", replicas=1).start()
    try:
        yield nodes
    finally:
        nodes.stop()


def test_a_commit_whose_wait_failed_after_it_landed_goes_on_at_once(
    deployment: SentinelSet, tmp_path: Path
) -> None:
    model = Model()
    primary, replica = deployment.nodes
    url = f"redis://127.0.0.1:{primary.port}/0"
    tool_log = tmp_path / "tools.jsonl"
    with SimServer(model) as sim:
        env = sim_env(
            sim,
            tool_log,
            TOOLLOOP_COMMIT_WAIT="1",
            TOOLLOOP_COMMIT_WAIT_MS="300",
            **PRODUCTION_TIMERS,
        )
        worker = start_worker(url, tmp_path, env)
        client = Client(url)
        try:
            run_id = client.enqueue(
                spec("commit-wait", model="claude-sonnet-5-5", provider="anthropic")
            )
            eventually(lambda: model.turns[0] >= 1)
            replica.process.send_signal(signal.SIGSTOP)
            try:
                # the answer comes at ANSWER_S; its commit's WAIT times out (300 ms) and is retried
                eventually(
                    lambda: "Redis did not take the commit" in worker.log.read_text(),
                    timeout=10,
                )
                time.sleep(0.5)  # a few retries, each not confirmed either
            finally:
                replica.process.send_signal(signal.SIGCONT)
            status = client.wait(run_id, timeout=20)
            log = worker.log.read_text()
            assert status.status == "done", (status, log[-3000:])
            assert status.final_text == "Done waiting."
            assert "fenced" not in log, log[-3000:]
            # the paid answer was committed, not asked again; the tool ran once
            assert model.turns == Counter({0: 1, 1: 1})
            assert [e["event"] for e in logged(tool_log)] == ["start", "finished"]
            assert kinds(client, run_id) == [
                "queued",
                "model",
                "tool",
                "model",
                "finished",
            ]
        finally:
            client.close()
            worker.stop()


INCR = Lua("return redis.call('INCR', KEYS[1])")


async def test_a_durable_script_sent_again_after_noscript_is_confirmed_by_a_wait_of_its_own(
    deployment: SentinelSet, caplog: pytest.LogCaptureFixture
) -> None:
    """A new primary after a failover has no scripts (they are not replicated): the batch's first
    commit there replies NOSCRIPT and is sent again after the turn's WAIT had run. Its confirmation
    is the WAIT that ends the pipeline sent again, so the commit is not reported unconfirmed (it
    used to be: `NotReplicatedError` with -1 replicas, an ERROR logged, a retried commit)."""
    primary, replica_node = deployment.nodes
    client = aredis.Redis(port=primary.port)
    replica = redis.Redis(port=replica_node.port)
    try:
        batch = Batch(client, wait=(1, 2000))
        assert await batch.script(INCR, ["counted"], [], durable=True) == 1
        await client.script_flush()  # as on a replica promoted in a failover
        assert await batch.script(INCR, ["counted"], [], durable=True) == 2
        assert "ran ahead" not in caplog.text
        assert "replicas TOOLLOOP_COMMIT_WAIT asks for" not in caplog.text
        assert replica.get("counted") == b"2"  # WAIT 1 confirmed it there
    finally:
        replica.close()
        await client.aclose()
