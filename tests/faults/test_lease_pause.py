"""Paused past the lease while a model call is in flight: the paid answer is kept when nobody took
the step over, and thrown away when somebody did.

A worker pauses (it SIGSTOPs itself at `model:inflight`, workers/testing/killpoints.py: the simulator has
the call and holds its answer) for 3 times its lease, then the test sends SIGCONT. The lease lapsed
in Redis meanwhile; on resuming, the worker's lease renewal (LEASE_KEEP, workers/protocol/scripts/lease.py)
finds out whether another copy began the step since:

- nobody did (one worker, a visibility timeout far longer than the pause, as in production): the
  lease is taken again, the answer that comes back is committed, and the simulator was called once
  for that step (every other step once too);
- a second worker took the step over (its copy came back after a 3 s visibility timeout) and still
  runs it when the first resumes: the first stops, commits nothing, and begins no model call after
  it resumed; the run ends done on the second;
- the second worker took the step over, committed it and the rest of the run, and let the lease go
  before the first resumed: the lease is free, but the first does not take it again (the run moved
  on): it stops the same way.

Both step paths: the step consumer and every step a Celery task (`--step-queues none`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from faults.model import arrived_path
from faults.policy import LoggedPolicy
from faults.runs import spec_for, wait_for
from faults.shapes import Call, Shape, first_text, run_tag
from faults.toolset import read_effects
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from toolloop.sim.script import SimRequest
from workers.client import Client

pytestmark = pytest.mark.faults

PATHS = ("consumer", "celery")
LEASE_MS = 1500
PAUSE_S = 3 * LEASE_MS / 1000


class PausePolicy(LoggedPolicy):
    """The fault suite's policy; the call `target` is held: its k-th arrival is answered after
    `holds[k]` seconds (the first writes `arrived/<target>`, which the worker's stop point waits for)."""

    def __init__(self, directory: Path, target: str, holds: tuple[float, ...]) -> None:
        super().__init__(directory)
        self.target = target
        self.holds = holds

    def __call__(self, request: SimRequest) -> dict[str, Any]:
        answer = super().__call__(request)
        if (
            f"{run_tag(first_text(request.messages))}#{request.assistant_turns}"
            == self.target
        ):
            seen = len(self.arrived(self.target))
            if seen == 1:
                Path(arrived_path(str(self.directory), self.target)).touch()
            answer["latency_s"] = (
                answer.get("latency_s", 0.0)
                + self.holds[min(seen, len(self.holds)) - 1]
            )
        return answer


def _shape(tag: str) -> Shape:
    """Turn 0 calls `note`, turn 1 (the paused call) calls `render`, turn 2 ends."""
    note = Call("note", {"tag": f"{tag}.0.0", "text": "shot 2 looks fine"})
    render = Call("render", {"tag": f"{tag}.1.0", "frames": 12})
    return Shape(tag=tag, turns=((note,), (render,)), final=f"Reviewed {tag}.")


def _stopped(plan: Path) -> dict[str, Any] | None:
    log = Path(f"{plan}.log")
    if not log.exists():
        return None
    lines = log.read_text().splitlines()
    return json.loads(lines[0]) if lines else None


def _log_of(pool: WorkerPool, pid: int) -> str:
    return "".join(
        w.log.read_text(errors="replace") for w in pool.workers if w.process.pid == pid
    )


def _paused(
    redis_server: EmbeddedServer,
    work: Path,
    path: str,
    tag: str,
    holds: tuple[float, ...],
    size: int,
    env: dict[str, str],
    until: str,
) -> dict[str, Any]:
    """One run of `_shape(tag)` whose turn-1 call pauses its worker; SIGCONT once `until` holds
    ("paused": after PAUSE_S; "taken": the second worker's call arrived; "done": the run ended on
    the second worker). What the test reads: the target's arrivals, the paused pid's calls of the
    paused step begun after it paused, its log, the run's status."""
    target = f"{tag}#1"
    work.mkdir()
    policy = PausePolicy(work, target, holds)
    policy.add(_shape(tag))
    plan = work / "plan.json"
    plan.write_text(
        json.dumps([{"point": "model:inflight", "action": "stop", "tag": target}])
    )
    with SimServer(policy) as sim:
        env = {
            **base_env(sim.base_url),
            **env,
            "TOOLLOOP_FAULTS_DIR": str(work),
            "TOOLLOOP_KILL_PLAN": str(plan),
        }
        pool = WorkerPool(
            redis_server.url,
            work,
            env,
            size=size,
            concurrency=2,
            step_queues="none" if path == "celery" else None,
        )
        with pool:
            client = Client(redis_server.url)
            run_id = client.enqueue(spec_for(_shape(tag)))
            stop = wait_for(f"the pause at {target}", lambda: _stopped(plan), 60)
            paused, paused_at = int(stop["pid"]), float(stop["at"])
            try:
                time.sleep(max(0.0, paused_at + PAUSE_S - time.time()))
                if until == "taken":
                    wait_for(
                        "the second worker's call",
                        lambda: len(policy.arrived(target)) >= 2,
                        60,
                    )
                    time.sleep(0.5)  # its call is held: it holds the lease now
                elif until == "done":
                    wait_for(
                        "the run to end on the second worker",
                        lambda: client.status(run_id).status == "done",
                        60,
                    )
            finally:
                resumed_at = time.time()
                os.kill(paused, signal.SIGCONT)
            status = client.wait(run_id, timeout=60).status
            # room for whatever the resumed worker would still do
            time.sleep(LEASE_MS / 1000 + 1.0)
            log = _log_of(pool, paused)
    # the paused step's model calls begun by the paused worker (the run's later steps may run on it)
    models = [
        e
        for e in read_effects(work)
        if e["kind"] == "model" and e["pid"] == paused and e["tag"] == target
    ]
    return {
        "status": status,
        "calls": {turn: len(policy.arrived(f"{tag}#{turn}")) for turn in range(3)},
        "late_calls": [at for at in policy.arrived(target) if at > resumed_at],
        "begun_after": [e for e in models if e["at"] > paused_at],
        "effects": [e for e in read_effects(work) if e["tag"].startswith(f"{tag}.")],
        "log": log,
        "run_id": run_id,
    }


def _env(visibility_s: int, redrive_s: int) -> dict[str, str]:
    return {
        "TOOLLOOP_LEASE_MS": str(LEASE_MS),
        "TOOLLOOP_VISIBILITY_TIMEOUT": str(visibility_s),
        "TOOLLOOP_RESTORE_INTERVAL": "1",
        "TOOLLOOP_REDRIVE_AGE": str(redrive_s),
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", PATHS)
def test_a_worker_paused_past_its_lease_with_nobody_to_take_over_keeps_its_paid_answer(
    redis_server: EmbeddedServer, work_dir: Path, path: str
) -> None:
    tag = f"lp1{path[:2]}"
    found = _paused(
        redis_server,
        work_dir / f"alone-{path}",
        path,
        tag,
        holds=(PAUSE_S + 1.0,),
        size=1,
        env=_env(visibility_s=120, redrive_s=120),
        until="paused",
    )
    assert found["status"] == "done"
    # the paused call paid once, and kept
    assert found["calls"] == {0: 1, 1: 1, 2: 1}, found["calls"]
    kinds = sorted((e["kind"], e["tag"]) for e in found["effects"])
    assert kinds == [
        ("run", f"{tag}.0.0"),
        ("start", f"{tag}.1.0"),
        ("wait", f"{tag}.1.0"),
    ], kinds
    assert "taken again; the step's work goes on" in found["log"], found["log"][-3000:]
    assert "Not committed" not in found["log"], found["log"][-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", PATHS)
def test_a_worker_paused_past_its_lease_whose_step_another_took_over_stops(
    redis_server: EmbeddedServer, work_dir: Path, path: str
) -> None:
    tag = f"lp2{path[:2]}"
    found = _paused(
        redis_server,
        work_dir / f"taken-{path}",
        path,
        tag,
        holds=(20.0, 4.0),
        size=2,
        env=_env(visibility_s=3, redrive_s=6),
        until="taken",
    )
    assert found["status"] == "done"
    # the paused one's (thrown away) and the new holder's
    assert found["calls"][1] == 2, found["calls"]
    assert found["late_calls"] == [] and found["begun_after"] == [], found
    assert "another copy of the step holds it" in found["log"], found["log"][-3000:]
    assert f"run {found['run_id']}: step" in found["log"], found["log"][-3000:]
    assert "Not committed" in found["log"], found["log"][-3000:]
    assert "taken again" not in found["log"], found["log"][-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", PATHS)
def test_a_worker_paused_while_another_took_over_committed_and_let_go_does_not_take_the_lease_again(
    redis_server: EmbeddedServer, work_dir: Path, path: str
) -> None:
    tag = f"lp3{path[:2]}"
    found = _paused(
        redis_server,
        work_dir / f"moved-{path}",
        path,
        tag,
        holds=(20.0, 0.0),
        size=2,
        env=_env(visibility_s=3, redrive_s=6),
        until="done",
    )
    assert found["status"] == "done"
    assert found["calls"] == {0: 1, 1: 2, 2: 1}, found["calls"]
    assert found["late_calls"] == [] and found["begun_after"] == [], found
    assert "another copy began the step since" in found["log"], found["log"][-3000:]
    assert "Not committed" in found["log"], found["log"][-3000:]
    assert "taken again" not in found["log"], found["log"][-3000:]
