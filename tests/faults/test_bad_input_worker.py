"""Hostile tool calls from the model never crash the worker: a batch of durable runs whose model
calls unknown tools, sends wrong types, missing fields, 100 KB strings, NUL bytes, deep nesting,
non-object inputs (a bare string is arguments text: see test_provider_faults), two asks in one
turn, and arguments whose JSON holds a lone surrogate escape. Every run must end `done` (asks
answered), every call answered, and no worker process may die.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from faults.policy import FaultPolicy
from faults.runs import drive, spec_for
from faults.shapes import Call, Shape
from faults.twins import base_env
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client

pytestmark = pytest.mark.faults


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = {f"level{level}": [value]}
    return value


HOSTILE: list[tuple[str, Any]] = [
    ("note", {}),
    ("note", {"tag": 5, "text": None}),
    ("note", {"tag": "big", "text": "x" * 100_000}),
    ("note", {"tag": "nul\x00byte", "text": "line\u2028sep \U0001f4a5"}),
    ("note", {"tag": "deep", "text": "ok", "extra": _nested(60)}),
    ("note", [1, 2, 3]),
    ("note", 42),
    ("note", None),
    ("render", {"tag": "r", "frames": "many"}),
    ("render", {"tag": "r-huge", "frames": 10**30}),
    ("render", {"frames": -1}),
    ("zoom", {"shot": 3}),
    ("", {}),
    ("ask", {"question": 3}),
    ("ask", {"question": ["a", "b"]}),
]


def _hostile_shape(tag: str, rng: random.Random) -> Shape:
    turns: list[tuple[Call, ...]] = []
    for index in range(rng.randint(2, 3)):
        picks = rng.sample(HOSTILE, rng.randint(1, 4))
        turns.append(tuple(Call(name, value) for name, value in picks))  # type: ignore[arg-type]
        if (
            index == 0 and rng.random() < 0.5
        ):  # two valid asks in one turn: one waits, one is refused
            turns[-1] += (
                Call("ask", {"question": "first?"}),
                Call("ask", {"question": "second?"}),
            )
    shape = Shape(tag=tag, turns=tuple(turns), final=f"Survived {tag}.")
    # The first call of the last turn: valid JSON whose string holds an unpaired surrogate escape.
    last = len(turns) - 1
    return Shape(
        **{
            **shape.__dict__,
            "extra": {"raw": {last: '{"tag": "sur\\ud800", "text": "x\\udfff"}'}},
        }
    )


@pytest.mark.timeout(300)
def test_hostile_tool_calls_never_crash_the_worker(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    rng = random.Random(61)
    shapes = [_hostile_shape(f"hostile{i}", rng) for i in range(6)]
    policy = FaultPolicy(work_dir / "hostile")
    policy.phase = "fault"
    for shape in shapes:
        policy.add(shape)
    client = Client(redis_server.url)
    with SimServer(policy) as sim:
        env = {
            **base_env(sim.base_url),
            "TOOLLOOP_FAULTS_DIR": str(work_dir / "hostile"),
        }
        with WorkerPool(redis_server.url, work_dir, env, size=1, concurrency=4) as pool:
            runs = {client.enqueue(spec_for(shape)): shape for shape in shapes}
            last = drive(client, runs, timeout=150)
            deaths = list(pool.deaths)
    ended = {
        runs[run_id].tag: (status.status, status.error_class, status.error_message)
        for run_id, status in last.items()
    }
    assert all(status == "done" for status, _, _ in ended.values()), ended
    assert deaths == [], f"worker processes died: {deaths}"
    for run_id in runs:
        history = client.history(run_id)
        calls = {
            c.id for m in history if m.role == "assistant" for c in m.tool_calls or []
        }
        answered = {m.tool_call_id for m in history if m.role == "tool"}
        assert calls == answered, f"unanswered calls in {runs[run_id].tag}"
    client.close()
