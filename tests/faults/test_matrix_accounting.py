"""The crash matrix's kill accounting (faults/matrix.py `allowed_reruns`): which re-run a kill allows.

A control task takes no step slot, so a kill inside one (`answer:after`) also kills the step running
beside it: that step's unit may run again. A step whose commit landed before the kill may not: its
second run is a duplicate finished step, and the matrix must still report it. Which steps were in
flight is what the worker's `KillPlan` hooks write into the kill's log line (`in_flight`); the first
tests drive a real `KillPlan` to its kill point in a child process and read the line it wrote (the
first case is the one the matrix met: model p1r0s7#3 in flight beside an answer, then killed once
more at `model:request`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from faults.matrix import allowed_reruns
from workers.killpoints import PLAN_ENV, KillPlan

RUN = "d27dd455b41c4cba80a2f06732e3d66f"
PID = 7294
TAGS = {RUN: "p1r0s7"}


def _child(plan: str, committed: bool) -> None:
    os.environ[PLAN_ENV] = plan
    os.setpgid(0, 0)  # its own group: the kill takes this child, never the test runner
    hooks = KillPlan(plan)
    hooks.point("advance:begin", run=RUN, n=13)
    if committed:
        hooks.point("commit:before", run=RUN, key="s0/model:3")
        hooks.point("commit:after", run=RUN, key="s0/model:3")
    hooks.point("answer:after", run="another-run")  # the plan's entry: SIGKILL here


def _kill_line(tmp_path: Path, *, committed: bool) -> dict[str, object]:
    """The log line of a real KillPlan killed at `answer:after`, its step of RUN begun (and its commit
    landed when `committed`)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"point": "answer:after", "run": "another-run"}]))
    child = multiprocessing.get_context("fork").Process(target=_child, args=(str(plan), committed))
    child.start()
    child.join(30)
    assert child.exitcode == -9, "the plan's kill did not fire"
    (line,) = Path(f"{plan}.log").read_text().splitlines()
    kill: dict[str, object] = json.loads(line)
    return {**kill, "pid": PID}


def _effects(since: float) -> list[dict[str, object]]:
    """Another run's model call before the step, then the step's own (the last line of the pid)."""
    return [
        {"kind": "model", "tag": "p9r0s7#0", "pid": PID, "at": since - 1.0},
        {"kind": "model", "tag": "p1r0s7#3", "pid": PID, "at": since + 0.002},
    ]


def test_a_kill_in_a_control_task_allows_a_rerun_of_the_step_beside_it(tmp_path: Path) -> None:
    before = time.time()
    kill = _kill_line(tmp_path, committed=False)
    in_flight = kill["in_flight"]
    assert isinstance(in_flight, dict) and list(in_flight) == [RUN] and in_flight[RUN] >= before
    kill["at"] = in_flight[RUN] + 0.04
    assert allowed_reruns([kill], _effects(in_flight[RUN]), TAGS) == {("model", "p1r0s7#3"): 1}


def test_a_step_whose_commit_landed_before_the_kill_gets_no_rerun(tmp_path: Path) -> None:
    before = time.time()
    kill = _kill_line(tmp_path, committed=True)
    assert kill["in_flight"] == {}
    kill["at"] = before + 0.04
    assert not allowed_reruns([kill], _effects(before), TAGS)


def test_an_effect_from_before_the_step_began_is_not_its_unit() -> None:
    since = time.time()
    kill = {"index": 0, "point": "answer:after", "pid": PID, "at": since + 0.04, "in_flight": {RUN: since}}
    effects = [{"kind": "model", "tag": "p1r0s7#2", "pid": PID, "at": since - 0.5}]
    assert not allowed_reruns([kill], effects, TAGS)


def test_a_kill_after_a_commit_allows_nothing_and_a_pre_commit_kill_its_last_effect() -> None:
    since = time.time()
    in_flight = {RUN: since}
    after = {"index": 0, "point": "commit:after", "pid": PID, "at": since + 0.04, "in_flight": in_flight}
    assert not allowed_reruns([after], _effects(since), TAGS)
    request = {"index": 0, "point": "model:request", "pid": PID, "at": since + 0.04}
    assert allowed_reruns([request], _effects(since), TAGS) == {("model", "p1r0s7#3"): 1}
