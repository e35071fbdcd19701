"""A compacting durable run (SPEC.md 5.2, docs/context.md) survives a SIGKILL of its worker at its
step boundaries: after each committed step of its fault-free twin's journal the plan names
(`commit:after`; every step with `TOOLLOOP_FAULTS=full`, below) the worker's process group is
killed once, a supervisor restarts it, and the run goes on. It must make no extra compaction call
(each summary request is the same request in both twins: the simulator counts it by its history
hash) and end with the twin's transcript and events, byte for byte.

The run: TURNS `note` turns whose inputs carry ~300 tokens each, compacting past 3,000 input tokens
and keeping 2 turns, so it compacts several times; `TOOLLOOP_FAULTS=full` runs 60 turns and kills
after every step. The bounded suite kills after every compaction and every model step (`kill_keys`:
20 of the 35 boundaries), each of which a restarted worker must follow with a request rebuilt from
the compacted journal; it leaves out the `note` tool steps, whose commit:after kill repeats one
path the crash matrix kills at every point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults.conftest import FULL
from faults.policy import FaultPolicy
from faults.shapes import Call, Shape
from faults.twins import run_twins
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer

pytestmark = pytest.mark.faults

TURNS = 60 if FULL else 16
CONTEXT = {"compact_at_tokens": 3000, "keep_turns": 2}


def compacting_shape(tag: str) -> Shape:
    text = (
        "the framing holds, the key light stays left, the eyeline matches the reverse; "
        * 16
    )
    turns = tuple(
        (Call("note", {"tag": f"{tag}.{i}.0", "text": f"shot {i}: {text}"}),)
        for i in range(TURNS - 1)
    )
    return Shape(
        tag=tag, turns=turns, final=f"All {TURNS - 1} shots of {tag} reviewed."
    )


def kill_keys(journal: list[str]) -> list[str]:
    """The step boundaries to kill at: every one (full), or every compaction and model step."""
    return [key for key in journal if FULL or "/compact:" in key or "/model:" in key]


@pytest.mark.timeout(2400 if FULL else 600)
@pytest.mark.slow
def test_a_kill_at_every_step_boundary_makes_no_extra_compaction(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    work = work_dir / "compaction"
    work.mkdir(parents=True, exist_ok=True)
    policy = FaultPolicy(work)
    shape = compacting_shape("cmp1")
    plan = work / "plan.json"
    plan.write_text("[]")
    # 1-hour cache marks: the killed twin reaches its late turns minutes after the fault-free one, and
    # a 5-minute entry gone by then would make its usage (and so its events) differ for no fault of ours
    spec = {
        "context": CONTEXT,
        "max_steps": TURNS + 2,
        "budget_usd": 50.0,
        "cache_ttl": "1h",
    }
    with SimServer(policy) as sim:
        # the fault-free twin first, alone: its journal names every step boundary of the run
        ref = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work / "probe",
            [shape],
            spec=spec,
            timeout=240,
        )
        journal = ref.refs[shape.tag].journal
        compact_keys = [key for key in journal if "/compact:" in key]
        assert len(compact_keys) >= 2, journal
        kills = kill_keys(journal)
        plan.write_text(
            json.dumps([{"point": "commit:after", "key": key} for key in kills])
        )
        before = dict(sim.stats()["compactions"])
        policy.counts.clear()  # the model calls of the twins below are counted afresh
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work / "kills",
            [shape],
            spec=spec,
            fault_env={"TOOLLOOP_KILL_PLAN": str(plan)},
            pool={"size": 2, "concurrency": 1},
            timeout=2000 if FULL else 540,
        )
        compactions = sim.stats()["compactions"]
    fired = (
        Path(f"{plan}.log").read_text().splitlines()
        if Path(f"{plan}.log").exists()
        else []
    )
    print(
        f"\ncompacting run: {len(journal)} step boundaries, {len(fired)} kills, "
        f"{len(compact_keys)} compactions"
    )
    assert len(fired) == len(kills), f"{len(fired)} of {len(kills)} kills fired"
    # every summary request was made once by each of the two twins: no extra call
    made = {
        digest: count - before.get(digest, 0) for digest, count in compactions.items()
    }
    assert sorted(made.values()) == [2] * len(compact_keys), made
    assert twins.results[shape.tag].journal == journal
    assert (
        twins.results[shape.tag].history
        == twins.refs[shape.tag].history
        == ref.refs[shape.tag].history
    )
    problems = twins.compare(what="compaction kills: ")
    assert not problems, "\n".join(problems)
