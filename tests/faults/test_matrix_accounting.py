"""The crash matrix's kill accounting (faults/matrix.py `allowed_reruns`): which re-run a kill allows.

A control task takes no step slot, so a kill inside one (`answer:after`) also kills the step running
beside it: that step's unit may run again. A step that had ended before the kill may not: its
second run is a duplicate finished step, and the matrix must still report it. The worker logs and
effect lines are written here as a killed worker leaves them (the first case is the one the matrix
met: model p1r0s7#3 in flight beside an answer, then killed once more at model:request).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from faults.matrix import allowed_reruns, steps_in_flight

RUN = "d27dd455b41c4cba80a2f06732e3d66f"
RECEIVED = datetime(2026, 12, 1, 16, 51, 3, 109000).timestamp()  # as the worker logs it: local time
TAGS = {RUN: "p1r0s7"}


def _kill(point: str) -> dict[str, object]:
    return {"index": 0, "point": point, "pid": 7294, "at": RECEIVED + 0.04}


def _effects() -> list[dict[str, object]]:
    """Another run's model call before the step, then the step's own (the last line of the pid)."""
    return [
        {"kind": "model", "tag": "p9r0s7#0", "pid": 7294, "at": RECEIVED - 1.0},
        {"kind": "model", "tag": "p1r0s7#3", "pid": 7294, "at": RECEIVED + 0.002},
    ]


def _log(tmp_path: Path, *, ended: bool) -> dict[int, Path]:
    """The killed worker's log: step 13 of RUN received (and succeeded when `ended`), then an answer."""
    lines = [f"16:51:03,109: INFO/MainProcess] Task toolloop.advance[{RUN}:13] received"]
    if ended:
        lines.append(
            f"16:51:03,120: INFO/MainProcess] Task toolloop.advance[{RUN}:13] succeeded in 0.01s: 'next'"
        )
    lines.append("16:51:03,140: INFO/MainProcess] Task toolloop.answer[r2:answer:a1] received")
    path = tmp_path / "worker.log"
    path.write_text("".join(f"[2026-12-01 {line}\n" for line in lines))
    return {7294: path}


def test_a_kill_in_a_control_task_allows_a_rerun_of_the_step_beside_it(tmp_path: Path) -> None:
    logs = _log(tmp_path, ended=False)
    assert steps_in_flight(logs[7294]) == {RUN: RECEIVED - 0.001}
    assert allowed_reruns([_kill("answer:after")], _effects(), logs, TAGS) == {("model", "p1r0s7#3"): 1}


def test_a_step_that_ended_before_the_kill_gets_no_rerun(tmp_path: Path) -> None:
    logs = _log(tmp_path, ended=True)
    assert steps_in_flight(logs[7294]) == {}
    assert not allowed_reruns([_kill("answer:after")], _effects(), logs, TAGS)


def test_an_effect_from_before_the_step_was_received_is_not_its_unit(tmp_path: Path) -> None:
    effects = [{"kind": "model", "tag": "p1r0s7#2", "pid": 7294, "at": RECEIVED - 0.5}]
    assert not allowed_reruns([_kill("answer:after")], effects, _log(tmp_path, ended=False), TAGS)


def test_a_kill_after_a_commit_allows_nothing_and_a_pre_commit_kill_its_last_effect(tmp_path: Path) -> None:
    logs = _log(tmp_path, ended=False)
    assert not allowed_reruns([_kill("commit:after")], _effects(), logs, TAGS)
    assert allowed_reruns([_kill("model:request")], _effects(), logs, TAGS) == {("model", "p1r0s7#3"): 1}
