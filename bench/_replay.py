"""The replay figure of bench/durable.py: CPU time to replay a 200-step journal to the next live step.

The journal is made the way a durable run makes it: `run_tool_loop` over the bench agent (100 model
turns, each calling `note`: 200 steps) with a journal that stores each step's JSON text. The figure
is what a worker's `advance` task does between loading that hash and running the next step:
`run_tool_loop` over the worker's `SegmentJournal` (workers/process/segment.py) preloaded with the 200
entries, which replays every stored step (JSON parsing, model validation, history, events) and
stops at step 201 with `StepBoundary` before any work. Timed with `time.process_time()`, median of `trials`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from _durable_agent import TOOLS, make_generate

from toolloop import Budget, MemoryJournal, RunToolLoopOptions
from toolloop.loop.run import run_tool_loop
from workers.process.segment import SegmentJournal, StepBoundary


def options(step: Any, turns: int, max_steps: int) -> RunToolLoopOptions:
    return RunToolLoopOptions(
        generate=make_generate(),
        model="bench",
        system=f"You review storyboards. turns={turns + 1}",
        messages=[{"role": "user", "content": "Review the rough cut, shot by shot."}],
        tools=TOOLS,
        budget=Budget(usd=100.0, finish_at=1.0),
        max_steps=max_steps,
        step=step,
    )


async def _replay(entries: dict[str, str], turns: int) -> str:
    journal = SegmentJournal("bench-replay", "", entries, live_steps=0)
    try:
        await run_tool_loop(options(journal.step, turns, turns + 1))
    except StepBoundary as boundary:
        return boundary.key
    raise AssertionError(
        "the replay ran past the journal instead of stopping at the next live step"
    )


def measure_replay(steps: int = 200, trials: int = 20) -> dict[str, Any]:
    turns = steps // 2
    journal = MemoryJournal()
    loop = asyncio.new_event_loop()
    try:
        first = loop.run_until_complete(
            run_tool_loop(options(journal.step, turns, turns))
        )
        assert first.stopped_by == "steps" and len(journal.entries) == steps, (
            first.stopped_by
        )
        cpu: list[float] = []
        for _ in range(
            trials + 1
        ):  # the first replay warms caches up and is not counted
            start = time.process_time()
            next_key = loop.run_until_complete(_replay(dict(journal.entries), turns))
            cpu.append(time.process_time() - start)
        assert next_key == f"model:{turns + 1}", next_key
    finally:
        loop.close()
    size = sum(len(text) for text in journal.entries.values())
    return {
        "cpu_s": statistics.median(cpu[1:]),
        "trials": cpu[1:],
        "steps": steps,
        "journal_bytes": size,
    }
