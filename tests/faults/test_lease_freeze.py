"""Frozen past the lease: no paid work after the lease is lost, and `start` keyed for idempotency.

A worker is frozen (it SIGSTOPs itself at a stop point, workers/testing/killpoints.py) for longer than its
lease, at three places: just before a model call is sent (`model:send`), inside a one-phase tool
before its effect (`tool:inside`), inside a two-phase `start` before its effect (`start:inside`).
Another worker takes the step over (the frozen one's message comes back after the visibility
timeout, its lease has lapsed); once that worker has made the call or the effect, the test sends
SIGCONT to the frozen one and lets the run end. Then, counted from the simulator's request log
(arrival time of each model call) and the tools' effect log (worker pid and time of each effect):

- 0 model calls arrive after the frozen worker resumed, and the frozen call was paid once;
- 0 runs or starts of the frozen step by the frozen worker after it froze (a later step of the run
  may run on it once it resumed), and each effect happened once;
- every attempt of a `start` (the frozen one's, which stopped before its effect, and the new
  holder's) had the same `toolloop.idempotency_key()`;
- every run ends `done`.

Both step paths: the step consumer (the default) and every step a Celery task (`--step-queues
none`). Bounded: 2 trials per point and path; `TOOLLOOP_FAULTS=full` (make faults-full): 20.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from faults.conftest import FULL
from faults.policy import FaultPolicy, LoggedPolicy
from faults.runs import spec_for, wait_for
from faults.shapes import Call, Shape
from faults.table import format_table
from faults.toolset import ATTEMPTS, read_effects
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer, start_server
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.faults

TRIALS = int(os.environ.get("TOOLLOOP_FAULTS_LEASE_TRIALS", "20" if FULL else "2"))
POINTS = ("model:send", "tool:inside", "start:inside")
PATHS = ("consumer", "celery")
LEASE_MS = 1500
ENV = {
    "TOOLLOOP_LEASE_MS": str(LEASE_MS),  # the shortened lease the freeze outlasts
    "TOOLLOOP_VISIBILITY_TIMEOUT": "3",
    "TOOLLOOP_RESTORE_INTERVAL": "1",
}


def _shape(tag: str) -> Shape:
    """Turn 0 calls `note`, turn 1 calls `render` (two-phase), turn 2 ends."""
    note = Call("note", {"tag": f"{tag}.0.0", "text": "shot 2 looks fine"})
    render = Call("render", {"tag": f"{tag}.1.0", "frames": 12})
    return Shape(tag=tag, turns=((note,), (render,)), final=f"Reviewed {tag}.")


def _target(point: str, tag: str) -> str:
    """The tag the stop point of `point` is called with in run `tag`."""
    return {
        "model:send": f"{tag}#1",
        "tool:inside": f"{tag}.0.0",
        "start:inside": f"{tag}.1.0",
    }[point]


def _stops(plan: Path) -> dict[int, dict[str, Any]]:
    log = Path(f"{plan}.log")
    if not log.exists():
        return {}
    return {
        entry["index"]: entry for entry in map(json.loads, log.read_text().splitlines())
    }


@pytest.mark.timeout(3600 if FULL else 600)
@pytest.mark.slow
def test_a_worker_frozen_past_its_lease_does_no_paid_work_after_it(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    work = work_dir / "lease"
    work.mkdir()
    policy = LoggedPolicy(work)
    trials = [
        (path, point, f"lf{i}{path[:2]}{point[:2]}")
        for path in PATHS
        for point in POINTS
        for i in range(TRIALS)
    ]
    for _, _, tag in trials:
        policy.add(_shape(tag))
    plan = work / "plan.json"
    plan.write_text(
        json.dumps(
            [
                {"point": point, "action": "stop", "tag": _target(point, tag)}
                for _, point, tag in trials
            ]
        )
    )
    rows: list[list[object]] = []
    problems: list[str] = []
    with SimServer(policy) as sim:
        env = {
            **base_env(sim.base_url),
            **ENV,
            "TOOLLOOP_FAULTS_DIR": str(work),
            "TOOLLOOP_KILL_PLAN": str(plan),
        }
        client = Client(redis_server.url)
        for path in PATHS:
            pool = WorkerPool(
                redis_server.url,
                work,
                env,
                size=2,
                concurrency=2,
                step_queues="none" if path == "celery" else None,
            )
            with pool:
                for point in POINTS:
                    tags = [tag for p, q, tag in trials if p == path and q == point]
                    late_calls = late_effects = twice = keys_differ = not_done = 0
                    for tag in tags:
                        index = next(
                            i for i, (_, _, t) in enumerate(trials) if t == tag
                        )
                        found = _trial(
                            client, pool, policy, work, plan, index, point, tag
                        )
                        late_calls += found["late_calls"]
                        late_effects += found["late_effects"]
                        twice += found["twice"]
                        keys_differ += found["keys_differ"]
                        not_done += found["status"] != "done"
                        problems += [
                            f"{path} {point} {tag}: {p}" for p in found["problems"]
                        ]
                    rows.append(
                        [
                            path,
                            point,
                            len(tags),
                            late_calls,
                            late_effects,
                            twice,
                            keys_differ,
                            not_done,
                        ]
                    )
    table = format_table(
        [
            "path",
            "frozen at",
            "trials",
            "late model calls",
            "late tools/starts",
            "paid/run twice",
            "start keys differ",
            "not done",
        ],
        rows,
        title=f"Workers frozen past a {LEASE_MS} ms lease (SIGSTOP, another takes over, SIGCONT)",
    )
    print("\n" + table)
    assert not problems, table + "\n" + "\n".join(problems)
    assert all(row[3:] == [0, 0, 0, 0, 0] for row in rows), table


def _trial(
    client: Client,
    pool: WorkerPool,
    policy: LoggedPolicy,
    work: Path,
    plan: Path,
    index: int,
    point: str,
    tag: str,
) -> dict[str, Any]:
    run_id = client.enqueue(spec_for(_shape(tag)))
    target = _target(point, tag)
    stop = wait_for(
        f"the stop at {point} in {tag}", lambda: _stops(plan).get(index), 60
    )
    frozen, frozen_at = int(stop["pid"]), float(stop["at"])
    try:
        # another worker takes the step over and makes the call or the effect the frozen one was about to
        if point == "model:send":
            wait_for(
                f"the new holder's call {target}", lambda: policy.arrived(target), 60
            )
        else:
            kind = "run" if point == "tool:inside" else "start"
            wait_for(
                f"the new holder's {kind} of {target}",
                lambda: [
                    e
                    for e in read_effects(work)
                    if e["tag"] == target and e["kind"] == kind and e["pid"] != frozen
                ],
                60,
            )
        time.sleep(0.3)
    finally:
        resumed_at = time.time()
        os.kill(frozen, signal.SIGCONT)
    status = client.wait(run_id, timeout=60).status
    # room for whatever the resumed worker would still do
    time.sleep(LEASE_MS / 1000 + 1.0)
    found: dict[str, Any] = {"status": status, "problems": []}
    calls = policy.arrived(target) if point == "model:send" else []
    found["late_calls"] = sum(1 for at in policy.arrived(target) if at > resumed_at)
    effects = [e for e in read_effects(work) if e["tag"].startswith(f"{tag}.")]
    # the frozen step's own effect (its `run` or `start`): a later step of the run, a `wait` of the
    # same call included, may run on the resumed worker under a lease of its own (the Celery path)
    found["late_effects"] = sum(
        1
        for e in effects
        if e["pid"] == frozen
        and e["at"] > frozen_at
        and e["tag"] == target
        and e["kind"] in ("run", "start")
    )
    counts: dict[tuple[str, str], int] = {}
    for effect in effects:
        counts[(effect["kind"], effect["tag"])] = (
            counts.get((effect["kind"], effect["tag"]), 0) + 1
        )
    twice = [key for key, count in counts.items() if count > 1]
    twice += [("model", target)] * (len(calls) > 1)
    found["twice"] = len(twice)
    attempts = [a for a in read_effects(work, ATTEMPTS) if a["tag"] == f"{tag}.1.0"]
    keys = {a["key"] for a in attempts}
    found["keys_differ"] = int(len(keys) != 1 or None in keys)
    if point == "start:inside" and len(attempts) < 2:
        found["problems"].append(
            f"expected the frozen and the new holder's start attempts, saw {attempts}"
        )
    if status != "done":
        found["problems"].append(f"the run ended {status!r}")
    if twice:
        found["problems"].append(f"ran or paid twice: {twice}")
    if found["late_calls"] or found["late_effects"]:
        found["problems"].append(
            f"late work: calls {found['late_calls']}, effects {found['late_effects']}"
        )
    return found


@pytest.mark.timeout(180)
def test_a_redis_stall_longer_than_the_lease_under_a_long_tool_stops_the_old_holder(
    tmp_path: Path,
) -> None:
    """Redis stalls (its process SIGSTOPped for 3 s) under a 6 s tool, with a 1.5 s lease: the lease
    expires in Redis meanwhile, and the step's message comes back (visibility timeout 3 s) to the same
    worker, which runs the step again. The old holder's renewals could not be confirmed before the
    lease's local deadline, so its signal aborted during the stall and the tool stopped: the two
    attempts never overlap, the tool's effect happens once, and the run ends done."""
    server = start_server(tmp_path / "redis")
    work = tmp_path / "stall"
    work.mkdir()
    policy = FaultPolicy(work)
    tag = "stall0"
    shape = Shape(
        tag=tag,
        turns=((Call("vigil", {"tag": f"{tag}.0.0", "seconds": 6.0}),),),
        final="Done.",
    )
    policy.add(shape)
    try:
        with SimServer(policy) as sim:
            env = {**base_env(sim.base_url), **ENV, "TOOLLOOP_FAULTS_DIR": str(work)}
            with WorkerPool(server.url, work, env, size=1, concurrency=4) as pool:
                client = Client(server.url)
                run_id = client.enqueue(spec_for(shape))
                wait_for(
                    "the tool's first attempt", lambda: read_effects(work, ATTEMPTS), 30
                )
                time.sleep(0.5)
                stalled_at = time.time()
                os.kill(server.process.pid, signal.SIGSTOP)
                try:
                    time.sleep(3.0)
                finally:
                    os.kill(server.process.pid, signal.SIGCONT)
                status = client.wait(run_id, timeout=60).status
                logs = "".join(path.read_text(errors="replace") for path in pool.logs)
    finally:
        server.stop()
    attempts = read_effects(work, ATTEMPTS)
    begins = [a for a in attempts if a["kind"] == "vigil-begin"]
    aborts = [a for a in attempts if a["kind"] == "vigil-abort"]
    runs = [e for e in read_effects(work) if e["tag"] == f"{tag}.0.0"]
    assert status == "done"
    assert len(begins) == 2 and len(aborts) == 1, attempts
    # never both at once
    assert begins[0]["at"] < stalled_at < aborts[0]["at"] < begins[1]["at"], attempts
    assert aborts[0]["at"] < stalled_at + 3.0, "the old holder ran on through the stall"
    assert "lease" in aborts[0]["reason"], aborts[0]
    assert len(runs) == 1 and runs[0]["at"] > begins[1]["at"], runs
    assert begins[0]["key"] == begins[1]["key"]
    assert (
        "Not committed: no finished work; the step runs again under a live lease"
        in logs
    )
