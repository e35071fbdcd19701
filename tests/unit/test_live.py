"""workers/process/live.py: a run's loop paused at every step boundary and resumed step by step (what a
worker does while a run stays on it) ends exactly as the same loop run straight through; a kept
loop past the limit is ended."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass, field

import pytest
from loop_kit import Counter, options, read_frame, run

from toolloop.loop.types import RunToolLoopResult
from toolloop.testing import ScriptedModel, call, reply
from workers.config.settings import Settings
from workers.process import live
from workers.process.segment import SegmentJournal, StepBoundary


@dataclass
class Step:
    """What the loop reads of the task running it (workers/step/advance.py's step)."""

    outside: float = 0.0
    state: dict[str, str] = field(default_factory=dict)
    lives: list[str] = field(default_factory=list)

    def before_live(self, key: str) -> None:
        self.lives.append(key)


def turns() -> list[object]:
    return [
        reply(
            "Looking at shot 1.",
            tool_calls=[call("read_frame", {"shot": 1}, id="c1")],
            cost_usd=0.01,
        ),
        reply(
            "And shot 2.",
            tool_calls=[call("read_frame", {"shot": 2}, id="c2")],
            cost_usd=0.01,
        ),
        reply("Both are fine.", cost_usd=0.01),
    ]


def paused_loop(counter: Counter | None = None) -> tuple[live.LiveLoop, SegmentJournal]:
    loop = live.LiveLoop({"read_frame": read_frame(counter)})
    journal = SegmentJournal(
        "run1",
        "s0/",
        {},
        live_steps=1,
        pause=loop.pause,
        before_live=loop.before_live,
        signal=loop.controller.signal,
    )
    loop.journal = journal
    return loop, journal


async def test_a_loop_resumed_step_by_step_ends_as_one_run_straight_through() -> None:
    straight, recorded = await run(ScriptedModel(turns()), tools=[read_frame()])
    model, counter = ScriptedModel(turns()), Counter()
    loop, journal = paused_loop(counter)
    steps = [Step() for _ in range(5)]
    opts = options(
        model,
        tools=[read_frame(counter)],
        step=journal.step,
        on_step=loop.events.append,
        signal=loop.controller.signal,
    )
    outcome = await loop.start(steps[0], opts)
    boundaries, pending = [], []
    for step in steps[1:]:
        assert isinstance(outcome, StepBoundary)
        assert loop.keepable()
        boundaries.append(outcome.key)
        pending.append([key for key, _, _ in journal.pending])
        outcome = await loop.go_on(step)
    assert isinstance(outcome, RunToolLoopResult)
    assert boundaries == ["tool:c1", "model:2", "tool:c2", "model:3"]
    # one live step per task
    assert pending == [
        ["model:1"],
        ["tool:c1"],
        ["model:2"],
        ["tool:c2"],
    ]
    assert [step.lives for step in steps] == [
        ["model:1"],
        ["tool:c1"],
        ["model:2"],
        ["tool:c2"],
        ["model:3"],
    ]
    assert (outcome.stopped_by, outcome.final_text, outcome.steps) == (
        "done",
        "Both are fine.",
        3,
    )
    assert outcome.messages == straight.messages
    assert outcome.spent_usd == pytest.approx(straight.spent_usd)
    assert loop.events == recorded.events
    assert (model.calls, counter.calls) == (3, {"read_frame": 2})
    assert journal.replayed == 0
    assert not loop.keepable()


async def test_past_the_limit_the_oldest_kept_loop_ends() -> None:
    kept = live.KeptLoops(2)  # TOOLLOOP_KEPT_LOOPS=2
    loops, tasks = [], []
    for i in range(3):
        loop, journal = paused_loop()
        opts = options(
            ScriptedModel(turns()),
            tools=[read_frame()],
            step=journal.step,
            signal=loop.controller.signal,
        )
        assert isinstance(await loop.start(Step(), opts), StepBoundary)
        tasks.append(loop.task)
        kept.keep(f"run{i}", loop)
        loops.append(loop)
    await asyncio.sleep(0)  # the cancelled task runs to its end
    assert kept.take("run0") is None
    assert tasks[0] is not None and tasks[0].cancelled()
    assert [kept.take(f"run{i}") for i in (1, 2)] == loops[1:]
    assert all(loop.keepable() for loop in loops[1:])
    for loop in loops[1:]:
        loop.close()


@pytest.mark.parametrize("how", ["ended", "closed"])
async def test_an_ended_or_closed_loop_dies_by_refcount(how: str) -> None:
    """No reference cycle is left between the loop, its journal, its task and the step that ran it
    last: once nothing holds them they are freed at once, with the collector off (the worker's
    thresholds rarely collect old objects; cyclic garbage there is memory held)."""
    gc.collect()
    gc.disable()
    try:
        loop, journal = paused_loop()
        # one answer, or a tool call first
        script = turns()[2:] if how == "ended" else turns()
        opts = options(
            ScriptedModel(script),
            tools=[read_frame()],
            step=journal.step,
            signal=loop.controller.signal,
        )
        step = Step()
        outcome = await loop.start(step, opts)
        if how == "ended":
            assert isinstance(outcome, RunToolLoopResult)
        else:
            assert isinstance(outcome, StepBoundary)
            task = loop.task
            loop.close()
            await asyncio.sleep(0)  # the cancelled task runs to its end
            assert task is not None and task.cancelled()
            del task
        await asyncio.sleep(0)
        gone = [weakref.ref(loop), weakref.ref(journal), weakref.ref(step)]
        del loop, journal, opts, outcome, step
        assert [ref() for ref in gone] == [None, None, None]
    finally:
        gc.enable()


def test_the_kept_loops_size_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLLOOP_KEPT_LOOPS", "7")
    assert live.KeptLoops(Settings.from_env().kept_loops).size == 7
    with pytest.raises(ValueError, match="TOOLLOOP_KEPT_LOOPS must be 0 or more"):
        live.KeptLoops(-1)
