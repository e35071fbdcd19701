"""The crash matrix's kill accounting (faults/matrix.py `allowed_reruns`): which re-runs a kill allows.

A kill ends every step in flight in the process it kills: its own, the others in the worker's step
slots, the one beside a control task (`answer:after`). Each of those may run again once; a step
whose commit landed before the kill may not: its second run is a duplicate finished step, and the
matrix must still report it. Which steps were in flight is what the worker's `KillPlan` writes into
the kill's log line (`in_flight`, and `landed` for those whose commit Redis already held); these
tests drive a real `KillPlan` to its kill in a child process, against a real Redis, and read the
line it wrote (the first case is the one the one-slot matrix met: model p1r0s7#3 in flight beside an
answer, then killed once more at `model:request`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import redis

from faults.matrix import allowed_reruns
from toolloop.embedded import EmbeddedServer
from workers.protocol import keys
from workers.testing.killpoints import PLAN_ENV, KillPlan, kill_point

RUN = "d27dd455b41c4cba80a2f06732e3d66f"
OTHER = "5b0e61c2d8f34c9e8a7b2f1e0c4d6a93"
PID = 7294
TAGS = {RUN: "p1r0s7", OTHER: "p2r0s7"}
Step = tuple[str, dict[str, Any]]


def _child(
    plan: str, redis_url: str, steps: list[Step], kill: Step, thread: bool
) -> None:
    os.environ[PLAN_ENV] = plan
    os.setpgid(0, 0)  # its own group: the kill takes this child, never the test runner
    hooks = KillPlan(plan, redis_url)
    for name, fields in steps:
        if name == "sleep":
            time.sleep(fields["s"])
        else:
            hooks.point(name, **fields)
    if thread:  # a kill point in a tool's thread (faults/toolset.py): it reads the record from disk
        worker = threading.Thread(target=kill_point, args=(kill[0],), kwargs=kill[1])
        worker.start()
        worker.join()
    else:
        hooks.point(kill[0], **kill[1])


def _kill_line(
    tmp_path: Path,
    steps: list[Step],
    kill: Step,
    *,
    redis_url: str = "",
    thread: bool = False,
) -> dict[str, Any]:
    """The log line of a real KillPlan killed at `kill` after the hook points `steps`."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"point": kill[0], **kill[1]}]))
    child = multiprocessing.get_context("fork").Process(
        target=_child, args=(str(plan), redis_url, steps, kill, thread)
    )
    child.start()
    child.join(30)
    assert child.exitcode == -9, "the plan's kill did not fire"
    (line,) = Path(f"{plan}.log").read_text().splitlines()
    record: dict[str, Any] = json.loads(line)
    return {**record, "pid": PID}


def _effects(since: float) -> list[dict[str, object]]:
    """Another run's model call before the step, then the step's own (the last line of the pid)."""
    return [
        {"kind": "model", "tag": "p9r0s7#0", "pid": PID, "at": since - 1.0},
        {"kind": "model", "tag": "p1r0s7#3", "pid": PID, "at": since + 0.002},
    ]


def _begin(run: str, n: int) -> Step:
    return ("advance:begin", {"run": run, "n": n})


def _committed(run: str, key: str) -> list[Step]:
    return [
        ("commit:before", {"run": run, "key": key}),
        ("commit:after", {"run": run, "key": key}),
    ]


def test_a_kill_in_a_control_task_allows_a_rerun_of_the_step_beside_it(
    tmp_path: Path,
) -> None:
    before = time.time()
    kill = _kill_line(
        tmp_path, [_begin(RUN, 13)], ("answer:after", {"run": "another-run"})
    )
    in_flight = kill["in_flight"]
    assert (
        isinstance(in_flight, dict)
        and list(in_flight) == [RUN]
        and in_flight[RUN] >= before
    )
    kill["at"] = in_flight[RUN] + 0.04
    assert allowed_reruns([kill], _effects(in_flight[RUN]), TAGS) == {
        ("model", "p1r0s7#3"): 1
    }


def test_a_step_whose_commit_landed_before_the_kill_gets_no_rerun(
    tmp_path: Path,
) -> None:
    before = time.time()
    steps = [_begin(RUN, 13), *_committed(RUN, "s0/model:3")]
    kill = _kill_line(tmp_path, steps, ("answer:after", {"run": "another-run"}))
    assert kill["in_flight"] == {}
    kill["at"] = before + 0.04
    assert not allowed_reruns([kill], _effects(before), TAGS)


def test_an_effect_from_before_the_step_began_is_not_its_unit() -> None:
    since = time.time()
    kill = {
        "index": 0,
        "point": "answer:after",
        "pid": PID,
        "at": since + 0.04,
        "in_flight": {RUN: since},
    }
    effects = [{"kind": "model", "tag": "p1r0s7#2", "pid": PID, "at": since - 0.5}]
    assert not allowed_reruns([kill], effects, TAGS)


def test_a_kill_in_a_tool_thread_allows_its_own_step_and_each_step_beside_it(
    tmp_path: Path,
) -> None:
    """Many slots: the kill at `tool:after` of OTHER's note also ends RUN's model call; a third run,
    committed before the kill, gets nothing."""
    third = "0c0ffee0c0ffee0c0ffee0c0ffee0c0f"
    steps = [
        _begin(third, 2),
        _begin(RUN, 4),
        _begin(OTHER, 7),
        *_committed(third, "s0/model:2"),
    ]
    kill = _kill_line(
        tmp_path, steps, ("tool:after", {"tag": "p2r0s7.1.0"}), thread=True
    )
    assert set(kill["in_flight"]) == {RUN, OTHER}
    since = max(kill["in_flight"].values())
    effects = [
        {
            "kind": "model",
            "tag": "p3r0s7#1",
            "pid": PID,
            "at": since + 0.001,
        },  # the committed run's
        {"kind": "model", "tag": "p1r0s7#3", "pid": PID, "at": since + 0.002},
        {"kind": "run", "tag": "p2r0s7.1.0", "pid": PID, "at": since + 0.003},
    ]
    kill["at"] = since + 0.04
    tags = {**TAGS, third: "p3r0s7"}
    assert allowed_reruns([kill], effects, tags) == {
        ("model", "p1r0s7#3"): 1,
        ("run", "p2r0s7.1.0"): 1,
    }


def test_a_commit_redis_holds_before_commit_after_is_landed_not_in_flight(
    tmp_path: Path, redis_server: EmbeddedServer
) -> None:
    """RUN's commit 4 ran (Redis holds n = 4) but its process had not reached `commit:after` when a
    kill from another thread ended it: the step is listed `landed`, and its effect is no re-run."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(keys.state(RUN), mapping={"n": 4, "status": "running"})
    client.hset(keys.state(OTHER), mapping={"n": 6, "status": "running"})
    try:
        steps = [
            _begin(RUN, 4),
            ("commit:before", {"run": RUN, "key": "s0/model:3"}),
            _begin(OTHER, 7),
        ]
        kill = _kill_line(
            tmp_path,
            steps,
            ("tool:after", {"tag": "p2r0s7.1.0"}),
            redis_url=redis_server.url,
            thread=True,
        )
    finally:
        client.delete(keys.state(RUN), keys.state(OTHER))
        client.close()
    assert kill["landed"] == {RUN: [4]} and list(kill["in_flight"]) == [OTHER]
    since = kill["in_flight"][OTHER]
    effects = [
        {"kind": "model", "tag": "p1r0s7#3", "pid": PID, "at": since + 0.001},
        {"kind": "run", "tag": "p2r0s7.1.0", "pid": PID, "at": since + 0.002},
    ]
    kill["at"] = since + 0.04
    assert allowed_reruns([kill], effects, TAGS) == {("run", "p2r0s7.1.0"): 1}


def test_a_stale_copy_of_a_committed_task_does_not_hide_the_task_beside_it(
    tmp_path: Path, redis_server: EmbeddedServer
) -> None:
    """Task 3 of RUN runs; a redelivered copy of its task 2 (committed: Redis holds n = 2) begins
    beside it and leaves `stale`. The kill still lists task 3, from when it began; a second copy of
    task 3 keeps the first one's time."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(keys.state(RUN), mapping={"n": 2, "status": "running"})
    before = time.time()
    try:
        steps = [_begin(RUN, 3), ("sleep", {"s": 0.3}), _begin(RUN, 2), _begin(RUN, 3)]
        kill = _kill_line(
            tmp_path,
            steps,
            ("wait:inside", {"tag": "p1r0s7.0.0"}),
            redis_url=redis_server.url,
        )
    finally:
        client.delete(keys.state(RUN))
        client.close()
    assert kill["landed"] == {RUN: [2]} and list(kill["in_flight"]) == [RUN]
    since = kill["in_flight"][RUN]
    # the first copy's begin, before the sleep
    assert before <= since < kill["at"] - 0.25
    effects = [{"kind": "wait", "tag": "p1r0s7.0.0", "pid": PID, "at": since + 0.003}]
    kill["at"] = since + 0.04
    assert allowed_reruns([kill], effects, TAGS) == {("wait", "p1r0s7.0.0"): 1}
