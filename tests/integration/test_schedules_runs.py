"""Schedules fired by real worker processes (their sweeper threads), whose runs call the simulator
over real HTTP: an interval schedule's runs, the busy policies, two workers sweeping the same
Redis with traces and metrics on."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Worker, sim_env, start_worker
from tests.integration.runs_kit import eventually, spec
from tests.integration.test_observe import free_port, scrape, total
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client
from workers.protocol import keys
from workers.protocol.records import RunStatus

pytestmark = pytest.mark.integration

SLOW = "You take your time."


class Model:
    """Answers at once, or after 2.5 s for the SLOW system text; counts requests per system text."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}

    def __call__(self, request: SimRequest) -> SimTurn:
        with self.lock:
            self.seen[request.system or ""] = self.seen.get(request.system or "", 0) + 1
        return SimTurn(text="Done.", latency_s=2.5 if request.system == SLOW else 0.0)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


@pytest.fixture(scope="module")
def sim(model: Model) -> Iterator[SimServer]:
    with SimServer(model) as server:
        yield server


@pytest.fixture
def client(sim_redis: EmbeddedServer) -> Iterator[Client]:
    made = Client(sim_redis.url)
    yield made
    made.close()


def sim_spec(system: str) -> dict[str, Any]:
    return spec(system, model="claude-sonnet-5-5", provider="anthropic")


def runs_made(
    client: Client, schedule_id: str
) -> list[tuple[dict[str, Any], RunStatus]]:
    """(queued data, status) of each run a fire of `schedule_id` made, oldest first."""
    found = []
    for run_id in client.redis.zrange(keys.ALL_RUNS, 0, -1):
        data = dict(next(iter(client.events(str(run_id)))).data)
        if data.get("schedule") == schedule_id:
            found.append((data, client.status(str(run_id))))
    return sorted(found, key=lambda made: made[0]["tick"])


def test_an_interval_schedule_enqueues_runs_the_workers_run(
    client: Client, sim_worker: Worker, model: Model
) -> None:
    system = "You run every second."
    sid = client.schedule(sim_spec(system), every_s=1, name="every second")
    eventually(lambda: client.get_schedule(sid).fired >= 3, timeout=20)
    client.remove_schedule(sid)
    made = runs_made(client, sid)
    assert len(made) >= 3
    statuses = [client.wait(status.run_id, timeout=30) for _, status in made]
    assert {status.status for status in statuses} == {"done"}
    ticks = [data["tick"] for data, _ in made]
    assert [round(b - a, 6) for a, b in itertools.pairwise(ticks)] == [1.0] * (
        len(ticks) - 1
    )
    assert model.seen[system] == len(made)  # each fire: one run, one model call


def test_a_busy_target_skips_ticks(client: Client, sim_worker: Worker) -> None:
    """if_busy="skip": while the last fire's run (2.5 s at the model) has not ended, ticks are
    dropped; no two of its runs overlap."""
    sid = client.schedule(sim_spec(SLOW), every_s=1, if_busy="skip")
    eventually(lambda: client.get_schedule(sid).fired >= 2, timeout=30)
    client.remove_schedule(sid)
    made = [
        client.wait(status.run_id, timeout=30) for _, status in runs_made(client, sid)
    ]
    assert len(made) >= 2
    for before, after in itertools.pairwise(made):
        # the next started after the last ended
        assert (after.created_at or 0) >= (before.updated_at or 0)


def test_a_busy_target_queues_the_tick_until_it_ends(
    client: Client, sim_worker: Worker
) -> None:
    """if_busy="queue": a tick that comes while the run is busy waits (`held`) and fires within
    about a second of the run's end; a later tick replaces it (counted skipped)."""
    sid = client.schedule(sim_spec(SLOW), every_s=1, if_busy="queue")
    eventually(lambda: client.get_schedule(sid).held is not None, timeout=20)
    eventually(lambda: client.get_schedule(sid).fired >= 2, timeout=30)
    info = client.get_schedule(sid)
    client.remove_schedule(sid)
    # 2.5 s busy, a tick a second: one held, the one before it replaced
    assert info.skipped >= 1
    (first, one), (second, two) = runs_made(client, sid)[:2]
    ended = client.wait(one.run_id, timeout=30)
    # the held tick fired promptly
    assert 0 <= (two.created_at or 0) - (ended.updated_at or 0) < 2.0
    assert second["tick"] > first["tick"]


def test_two_workers_sweeping_fire_each_tick_once_with_traces_and_metrics(
    client: Client,
    sim_redis: EmbeddedServer,
    sim: SimServer,
    sim_worker: Worker,
    tmp_path: Path,
) -> None:
    """A second worker sweeps the same Redis (two sweepers, each once a second): each of 20
    one-second schedules settles each tick once and makes one run per fire; the second worker's
    fires are spans (`toolloop.schedule.fire`) whose trace is their run's, and its metrics count
    them (the fires it settled, whatever their outcome, are its spans)."""
    traces, port = tmp_path / "spans.jsonl", free_port()
    env = sim_env(
        sim, TOOLLOOP_TRACES_FILE=str(traces), TOOLLOOP_METRICS_PORT=str(port)
    )
    second = start_worker(sim_redis.url, tmp_path, env)
    try:
        start = time.time() + 1.0
        # ticks spread over the second, so each worker's sweep (once a second, each at its own
        # phase) finds some of them due first
        ids = [
            client.schedule(sim_spec(f"You race {i}."), every_s=1, start=start + i / 20)
            for i in range(20)
        ]
        # past `start` when slow
        first = {sid: client.get_schedule(sid).next_at or 0 for sid in ids}
        eventually(
            lambda: all(
                (client.get_schedule(sid).last_tick or 0) >= first[sid] + 2
                for sid in ids
            ),
            30,
        )
        infos = [client.get_schedule(sid) for sid in ids]
        for sid in ids:
            client.remove_schedule(sid)
        samples = scrape(port)
    finally:
        second.stop()
    for info in infos:
        made = runs_made(client, info.id)
        # not one fired
        ticks = [
            data["tick"] for data, _ in made if data["tick"] <= (info.last_tick or 0)
        ]
        # between reading `info` and removing the schedule
        assert len(ticks) == len(set(ticks)) == info.fired >= 1
        settled = round((info.last_tick or 0) - first[info.id]) + 1
        assert info.fired + info.skipped + info.missed == settled >= 3, info
    spans = [json.loads(line) for line in traces.read_text().splitlines()]
    fires = [s for s in spans if s["name"] == "toolloop.schedule.fire"]
    fired = [
        s for s in fires if s["attributes"].get("toolloop.schedule.outcome") == "fired"
    ]
    assert fired, "the second worker fired some ticks"
    assert total(samples, "toolloop_schedule_fires_total", outcome="fired") == len(
        fired
    )
    assert total(samples, "toolloop_schedule_fires_total") == len(fires)
    runs = {
        s["attributes"]["toolloop.run_id"]: s
        for s in spans
        if s["name"] == "toolloop.run"
    }
    for fire in fired:
        run = runs.get(fire["attributes"]["toolloop.run_id"])
        if run is not None:  # exported by this worker: the run's trace is the fire's
            assert run["trace_id"] == fire["trace_id"]


def user_texts(client: Client, run_id: str) -> list[str]:
    return [
        m.content
        for m in client.history(run_id)
        if m.role == "user" and isinstance(m.content, str)
    ]


def test_a_follow_up_schedule_wakes_a_run_that_ended_done(
    client: Client, sim_worker: Worker, model: Model
) -> None:
    """send_to=: each tick is a follow-up (Client.send keyed by the schedule and the tick): the run
    goes on as its next segment with its whole conversation, once per fire."""
    system = "You are woken each second."
    run_id = client.enqueue(sim_spec(system))
    assert client.wait(run_id, timeout=30).status == "done"
    sid = client.schedule(
        send_to=run_id,
        content="Wake up.",
        every_s=1,
        add_max_steps=1,
        add_budget_usd=0.1,
    )
    eventually(lambda: client.get_schedule(sid).fired >= 3, timeout=30)
    client.remove_schedule(sid)
    fired = eventually(
        lambda: (s := client.wait(run_id, timeout=30)) and s.status == "done" and s,
        timeout=30,
    )
    texts = user_texts(client, run_id)
    assert texts[0] == "Go." and set(texts[1:]) == {"Wake up."}
    # one segment, one model call per fire
    assert fired.segment == len(texts) - 1 == model.seen[system] - 1


def test_a_follow_up_schedule_steers_a_running_run(
    client: Client, sim_worker: Worker
) -> None:
    """if_busy="steer": a tick that finds its run running reaches it as a steer, read once."""
    run_id = client.enqueue(sim_spec(SLOW))
    eventually(lambda: client.status(run_id).status == "running", timeout=20)
    sid = client.schedule(
        send_to=run_id,
        content="Mind the budget.",
        at=time.time() + 0.5,
        if_busy="steer",
    )
    eventually(lambda: client.get_schedule(sid).status == "done", timeout=20)
    info = client.get_schedule(sid)
    assert (info.fired, info.last_outcome) == (1, "steer")
    assert client.wait(run_id, timeout=30).status == "done"
    assert user_texts(client, run_id).count("Mind the budget.") == 1


def test_a_follow_up_to_a_run_that_cannot_take_one_is_recorded_failed(
    client: Client, sim_worker: Worker
) -> None:
    run_id = client.enqueue(sim_spec(SLOW))
    eventually(lambda: client.status(run_id).status == "running", timeout=20)
    client.cancel(run_id)
    assert client.wait(run_id, timeout=30).status == "cancel"
    sid = client.schedule(
        send_to=run_id, content="Are you there?", at=time.time() + 0.3
    )
    eventually(lambda: client.get_schedule(sid).status == "done", timeout=20)
    info = client.get_schedule(sid)
    assert (info.fired, info.failed, info.last_outcome) == (0, 1, "failed")
    assert "cancelled" in info.last_error
