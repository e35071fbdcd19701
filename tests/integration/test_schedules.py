"""Schedules on a real Redis, fired by the workers' own `Scheduler` (workers/runs/scheduler.py) in this
process or in sweeper processes of their own: the fence between racing sweepers, restarts, the
catch-up policy, bad input, the CLI. (tests/integration/test_schedules_runs.py runs them on workers.)"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from tests.integration.conftest import ROOT, own_redis
from tests.integration.runs_kit import spec
from toolloop.embedded import EmbeddedServer, start_server
from workers.client import Client
from workers.observe.metrics import Metrics
from workers.protocol import keys
from workers.protocol.errors import (
    LimitError,
    RunNotFoundError,
    ScheduleError,
    ScheduleNotFoundError,
    ToolsetError,
)
from workers.runs.scheduler import Scheduler


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Redis of the module's own, with no worker: nothing runs the runs a fire makes."""
    yield from own_redis(tmp_path_factory, "schedules-redis")


@pytest.fixture
def client(server: EmbeddedServer) -> Iterator[Client]:
    """A client on `server`, emptied first."""
    made = Client(server.url)
    made.redis.flushall()
    yield made
    made.close()


def scheduler_on(client: Client, metrics: Any = None) -> Scheduler:
    return Scheduler(client.redis, client.settings, metrics)


def queued_data(client: Client, run_id: str) -> dict[str, Any]:
    first = next(iter(client.events(run_id)))
    assert first.kind == "queued"
    return dict(first.data)


def fired_runs(client: Client) -> dict[str, list[dict[str, Any]]]:
    """The `queued` data of every stored run a fire made, by schedule id."""
    found: dict[str, list[dict[str, Any]]] = {}
    for run_id in client.redis.zrange(keys.ALL_RUNS, 0, -1):
        data = queued_data(client, str(run_id))
        if "schedule" in data:
            found.setdefault(data["schedule"], []).append({**data, "run_id": run_id})
    return found


def runs_of(client: Client, schedule_id: str) -> list[dict[str, Any]]:
    """The `queued` data of every stored run a fire of `schedule_id` made."""
    return fired_runs(client).get(schedule_id, [])


RACER = """
import json, sys, time
import redis
from workers.runs.scheduler import Scheduler
from workers.config.settings import Settings
client = redis.Redis.from_url(sys.argv[1], decode_responses=True)
sizes = {"batch": int(sys.argv[3]), "per_script": int(sys.argv[4])} if len(sys.argv) > 3 else {}
scheduler = Scheduler(client, Settings.from_env(), **sizes)
done = {}
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for outcome, count in scheduler.fire_due().items():
        done[outcome] = done.get(outcome, 0) + count
print(json.dumps(done))
"""


def test_two_sweepers_racing_never_fire_a_tick_twice(
    client: Client, server: EmbeddedServer
) -> None:
    """Two sweeper processes fire as fast as they can for 4.5 s: 200 one-time schedules due over
    2.5 s, and 100 one-second schedules (if_busy="skip": no worker runs their runs, so each fires
    once and skips after). Every tick is claimed by exactly one of them (the other finds it
    `taken`): each one-time schedule made one run, each interval schedule settled each of its ticks
    once, and the fires the sweepers report are the runs stored."""
    start = time.time() + 1.0
    once = [
        client.schedule(spec("You race once."), at=start + i * 0.0125)
        for i in range(200)
    ]
    every = [
        client.schedule(spec("You race."), every_s=1, start=start) for _ in range(100)
    ]
    # past `start` on a slow machine
    first = {sid: client.get_schedule(sid).next_at or 0 for sid in every}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, server.url, "4.5"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    reports = [json.loads(racer.communicate(timeout=60)[0]) for racer in racers]
    fired = sum(report.get("fired", 0) for report in reports)
    # every fire made its own run
    assert fired == client.redis.zcard(keys.ALL_RUNS) == 300, reports
    # they did race for ticks
    assert sum(report.get("taken", 0) for report in reports) > 0, reports
    assert all(
        report.get("fired", 0) + report.get("skipped", 0) > 0 for report in reports
    ), reports
    made = fired_runs(client)
    for sid in once:
        info = client.get_schedule(sid)
        assert (info.fired, info.status) == (1, "done")
        assert [run["tick"] for run in made[sid]] == [info.last_tick]
    for sid in every:
        info = client.get_schedule(sid)
        ticks = round((info.last_tick or 0) - first[sid]) + 1
        assert ticks >= 3 and info.fired == 1
        # each tick settled once
        assert info.fired + info.skipped + info.missed == ticks, info


def test_racing_sweepers_of_a_big_tick_take_disjoint_rounds(
    client: Client, server: EmbeddedServer
) -> None:
    """400 one-time schedules due at the same moment, two sweeper processes firing them in rounds of
    40 (FIRE_MANY calls of 10): each round a sweeper takes is hidden from the other (DUE_TAKE), so
    every tick fires once and at most the last few (10 or fewer, read by both) are found `taken`;
    with both reading the same due ids, a sweeper found whole rounds `taken`."""
    start = time.time() + 1.5
    for _ in range(400):
        client.schedule(spec("You race in rounds."), at=start)
    assert time.time() < start, "adding 400 schedules took past their tick"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, server.url, "4", "40", "10"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    reports = [json.loads(racer.communicate(timeout=60)[0]) for racer in racers]
    assert sum(report.get("fired", 0) for report in reports) == 400, reports
    assert client.redis.zcard(keys.ALL_RUNS) == 400
    assert all(report.get("fired", 0) >= 40 for report in reports), reports
    assert sum(report.get("taken", 0) for report in reports) <= 10, reports


def test_a_schedule_survives_a_redis_restart(tmp_path: Path) -> None:
    """A schedule lives in Redis (AOF): after the server restarts it is listed as it was and fires
    at its next tick; a sweeper that starts anew (a worker restart) needs nothing but Redis."""
    directory = tmp_path / "redis"
    server = start_server(directory)
    try:
        with Client(server.url) as client:
            sid = client.schedule(spec("You persist."), every_s=1, name="kept")
            before = client.get_schedule(sid)
        server.stop()
        server = start_server(directory, port=server.port)
        with Client(server.url) as client:
            after = client.get_schedule(sid)
            assert (after.name, after.trigger, after.next_at) == (
                "kept",
                "every 1 s",
                before.next_at,
            )
            time.sleep(max(0.0, (after.next_at or 0) - time.time()) + 0.05)
            assert scheduler_on(client).fire_due() == {"fired": 1}
            assert client.get_schedule(sid).fired == 1
    finally:
        server.stop()


def test_missed_ticks_fire_once_for_the_latest_or_are_skipped(client: Client) -> None:
    """No sweeper runs for 3.3 s. catch_up="latest": the next sweep fires one run, for the latest
    due tick, and counts the ticks before it missed; catch_up="skip" with a 0.5 s grace: a tick
    that late is not fired at all (missed too). Both go on from the next tick to come."""
    start = time.time() + 0.2
    latest = client.schedule(
        spec("You catch up."), every_s=1, start=start, catch_up="latest"
    )
    skip = client.schedule(
        spec("You skip."), every_s=1, start=start + 0.5, catch_up="skip", grace_s=0.5
    )
    once = client.schedule(
        spec("You were due once."), at=start, catch_up="skip", grace_s=0.5
    )
    time.sleep(3.3)
    now = time.time()
    done = scheduler_on(client).fire_due()
    assert done == {"fired": 1, "missed": 2}
    caught = client.get_schedule(latest)
    assert (caught.fired, caught.missed, caught.last_outcome) == (1, 3, "fired")
    assert (
        caught.last_tick == pytest.approx(start + 3)
        and now < (caught.next_at or 0) <= now + 1
    )
    (run,) = runs_of(client, latest)
    assert run["tick"] == caught.last_tick
    skipped = client.get_schedule(skip)
    assert (skipped.fired, skipped.missed, skipped.last_outcome) == (0, 3, "missed")
    assert runs_of(client, skip) == [] and (skipped.next_at or 0) > now
    gone = client.get_schedule(once)
    assert (gone.status, gone.fired, gone.missed, gone.next_at) == ("done", 0, 1, None)


def test_a_one_time_schedule_fires_once(client: Client) -> None:
    sid = client.schedule(spec("You run once."), at=time.time() + 0.3)
    scheduler = scheduler_on(client)
    assert scheduler.fire_due() == {}  # not due yet
    time.sleep(0.4)
    assert scheduler.fire_due() == {"fired": 1}
    time.sleep(1.1)
    assert scheduler.fire_due() == {} and scheduler_on(client).fire_due() == {}
    info = client.get_schedule(sid)
    assert (info.status, info.fired, info.next_at) == ("done", 1, None)
    assert [run["run_id"] for run in runs_of(client, sid)] == [info.last_run]
    assert client.redis.zscore(keys.SCHEDULES_DUE, sid) is None


def test_a_fire_names_its_schedule_in_the_event_flower_and_metrics(
    client: Client,
) -> None:
    """The run a fire makes says which schedule and tick made it: its `queued` event, its first
    step's label (what Flower shows as the task's kwargs), the worker's fires counter."""
    sid = client.schedule(spec("You are named."), at=time.time() + 0.2)
    time.sleep(0.3)
    metrics = Metrics()
    assert scheduler_on(client, metrics).fire_due() == {"fired": 1}
    info = client.get_schedule(sid)
    data = queued_data(client, info.last_run)
    assert (data["schedule"], data["tick"]) == (sid, info.last_tick)
    (raw,) = client.redis.lrange("llm", 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["kwargsrepr"] == repr({"step": f"model 1 (schedule {sid})"})
    assert headers["argsrepr"] == repr([info.last_run, 1])
    assert (
        metrics.registry.get_sample_value(
            "toolloop_schedule_fires_total", {"outcome": "fired"}
        )
        == 1
    )


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"cron": "61 * * * *"}, ScheduleError, "Bad minute"),
    ({"cron": "* * *"}, ScheduleError, "Wrong number of fields"),
    ({"cron": "* * */20 * 1L"}, ScheduleError, "never fires"),
    ({"cron": "* " * 200}, ScheduleError, "longer than 120"),
    ({"cron": "$(rm -rf /) * * * *"}, ScheduleError, "not valid"),
    (
        {"cron": "0 9 * * *", "timezone": "../../../etc/passwd"},
        ScheduleError,
        "not an IANA zone",
    ),
    ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, ScheduleError, "not known"),
    ({"every_s": 0.2}, ScheduleError, "out of range"),
    ({"every_s": float("nan")}, ScheduleError, "not a finite number"),
    ({"every_s": "10"}, ScheduleError, "not a number"),
    ({"at": 1.0}, ScheduleError, "in the past"),
    ({"at": 1e300}, ScheduleError, "100 years"),
    ({}, ScheduleError, "exactly one trigger"),
    ({"cron": "* * * * *", "every_s": 5}, ScheduleError, "exactly one trigger"),
    ({"every_s": 5, "if_busy": "steer"}, ScheduleError, "needs a follow-up target"),
    ({"every_s": 5, "if_busy": "sometimes"}, ScheduleError, "not a policy"),
    ({"every_s": 5, "catch_up": "all"}, ScheduleError, "not a policy"),
    ({"every_s": 5, "name": "bell\x07"}, ScheduleError, "printable"),
    ({"every_s": 5, "idempotency_key": ""}, ScheduleError, "1 to 256"),
]


@pytest.mark.parametrize(
    ("fields", "error", "says"), BAD, ids=[str(i) for i in range(len(BAD))]
)
def test_a_bad_schedule_is_refused_and_nothing_is_stored(
    client: Client, fields: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says) as caught:
        client.schedule(spec("You are refused."), **fields)
    assert "\n  " in str(caught.value)  # two lines: what happened, what to do
    assert client.list_schedules() == [] and client.redis.dbsize() == 0


def test_a_schedules_spec_is_checked_as_an_enqueue_checks_it(client: Client) -> None:
    with pytest.raises(pydantic.ValidationError):
        client.schedule({"model": "m", "toolset": "agents", "messages": []}, every_s=5)
    with pytest.raises(ToolsetError, match="not registered"):
        client.schedule(spec("x", toolset="nope"), every_s=5)
    many = [{"role": "user", "content": "x"}] * (client.settings.max_messages + 1)
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_MESSAGES"):
        client.schedule(
            {"model": "m", "toolset": "agents", "messages": many}, every_s=5
        )
    with pytest.raises(ScheduleError, match="64,000"):
        client.schedule(spec("x" * 70_000), every_s=5)
    with pytest.raises(ScheduleNotFoundError):
        client.get_schedule("tl:runs:all")
    with pytest.raises(RunNotFoundError):
        client.schedule(send_to="0" * 32, content="Wake up.", every_s=5)
    with pytest.raises(ScheduleError, match="needs content"):
        client.schedule(send_to="0" * 32, content="  ", every_s=5)
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_ANSWER_BYTES"):
        client.schedule(send_to="0" * 32, content="x" * 200_000, every_s=5)
    assert client.redis.dbsize() == 0


def test_adding_with_an_idempotency_key_adds_once(client: Client) -> None:
    first = client.schedule(
        spec("You are kept."), every_s=60, idempotency_key="nightly"
    )
    again = client.schedule(spec("Another spec."), every_s=5, idempotency_key="nightly")
    assert first == again and [s.id for s in client.list_schedules()] == [first]
    # the first definition wins
    assert client.get_schedule(first).trigger == "every 60 s"


def test_a_definition_no_worker_wrote_is_skipped_and_the_others_fire(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    good = client.schedule(spec("You are fine."), at=time.time() + 0.2)
    bad = client.schedule(spec("You are tampered with."), at=time.time() + 0.2)
    client.redis.set(
        keys.schedule_def(bad), '{"id": "x", "trigger": {"kind": "os.system"}}'
    )
    time.sleep(0.3)
    with caplog.at_level(logging.WARNING, logger="toolloop.workers"):
        assert scheduler_on(client).fire_due() == {"fired": 1}
    assert client.get_schedule(good).fired == 1
    assert (
        f"schedule {bad!r} skipped" in caplog.text
        and "toolloop schedule remove" in caplog.text
    )
    assert (
        client.redis.zscore(keys.SCHEDULES_DUE, bad) or 0
    ) > time.time() + 30  # not every second


def test_a_removed_schedule_fires_no_more(client: Client) -> None:
    sid = client.schedule(spec("You are removed."), at=time.time() + 0.2)
    client.remove_schedule(sid)
    time.sleep(0.3)
    assert scheduler_on(client).fire_due() == {}
    assert client.redis.dbsize() == 0
    with pytest.raises(ScheduleNotFoundError):
        client.remove_schedule(sid)


def toolloop(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "REDIS_URL": url, **env}
    command = [str(Path(sys.executable).parent / "toolloop"), *args]
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


def shell_block(path: Path) -> list[str]:
    """The commands of the page's ```shell block (the schedule commands)."""
    found = re.search(r"```shell\n(.*?)```", path.read_text(), re.DOTALL)
    assert found is not None, f"no ```shell block in {path}"
    return [line for line in found.group(1).splitlines() if line.strip()]


def test_the_schedule_commands(client: Client, server: EmbeddedServer) -> None:
    """`toolloop schedule add | list | show | remove`, exactly as the README and docs/schedules.md
    show them (the same block in both), run in order with RUN_ID a run and SCHEDULE_ID the id the
    first `add` printed; then a bad one."""
    lines = shell_block(ROOT / "README.md")
    assert lines == shell_block(ROOT / "docs" / "schedules.md")
    run_id = client.enqueue(spec("You are woken."))
    env = {
        "TOOLLOOP_TOOLSETS": "review=examples.storyboard.tools:REVIEW_TOOLS",
        "RUN_ID": run_id,
    }
    said: list[subprocess.CompletedProcess[str]] = []
    for line in lines:
        done = subprocess.run(
            [
                "bash",
                "-c",
                line.replace(
                    "toolloop ", f"{Path(sys.executable).parent / 'toolloop'} ", 1
                ),
            ],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": server.url, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (line, done.stderr)
        said.append(done)
        env.setdefault("SCHEDULE_ID", done.stdout.strip())
    daily, nudge, listed, shown, removed = said
    sid = daily.stdout.strip()
    assert "cron '0 18 * * 1-5' (Europe/Paris): first fires at" in daily.stderr
    assert "daily summary" in listed.stdout and "every 86400 s" in listed.stdout
    assert "target      enqueue model claude-sonnet-5-5, toolset review" in shown.stdout
    assert "fired 0, skipped 0, missed 0, failed 0" in shown.stdout
    assert removed.stdout.startswith(f"Removed {sid}")
    (left,) = client.list_schedules()
    assert (left.id, left.target, left.if_busy) == (
        nudge.stdout.strip(),
        f"send to run {run_id}",
        "steer",
    )
    bad = toolloop(
        server.url,
        "schedule",
        "add",
        "x",
        "--toolset",
        "agents",
        "--model",
        "m",
        "--cron",
        "99 * * * *",
    )
    assert (
        bad.returncode == 1
        and bad.stderr.count("\n") == 2
        and "Bad minute" in bad.stderr
    )
