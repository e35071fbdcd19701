"""The fault suite's toolset, loaded by the worker as "faults" (PYTHONPATH=tests).

Every tool writes one line to `$TOOLLOOP_FAULTS_DIR/effects.log` per outside effect (`run`, `start`,
`wait`), with the call's tag and the worker's pid: the suite counts these lines to prove that no
finished step ran twice and no `start` ran twice. The lines are written with O_APPEND in one write
each, so a SIGKILL leaves whole lines, and a line written is in the file even if the process dies
the next instant. The kill points inside steps are here too (workers/testing/killpoints.py):

    tool:before   a one-phase tool was called, before its effect
    tool:after    a one-phase tool made its effect, before it returns
    start:after   a two-phase tool's start made its effect, before it returns
    wait:inside   a two-phase tool's wait began (its start is journaled), before it returns

and the stop points of the lease suite (a SIGSTOP, then the tool checks its abort signal before its
effect, as a tool with an effect it cannot take back should): `tool:inside`, `start:inside`. Every
`start` also writes one line to `attempts.log` as it begins, with its idempotency key
(`toolloop.idempotency_key()`), and its effect line carries the key too.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    Started,
    TextPart,
    ToolOutput,
    ToolSpec,
    idempotency_key,
)
from workers.testing.killpoints import kill_point, stop_point

EFFECTS = "effects.log"
ATTEMPTS = "attempts.log"


def record(kind: str, tag: str, file: str = EFFECTS, **extra: Any) -> None:
    """Append one effect line (no-op when TOOLLOOP_FAULTS_DIR is unset)."""
    directory = os.environ.get("TOOLLOOP_FAULTS_DIR")
    if not directory:
        return
    line = (
        json.dumps(
            {"kind": kind, "tag": tag, "pid": os.getpid(), "at": time.time(), **extra}
        )
        + "\n"
    )
    descriptor = os.open(
        os.path.join(directory, file), os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644
    )
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def read_effects(
    directory: str | os.PathLike[str], file: str = EFFECTS
) -> list[dict[str, Any]]:
    path = os.path.join(directory, file)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


class Note(BaseModel):
    tag: str
    text: str


class Render(BaseModel):
    tag: str
    frames: int


class Slow(BaseModel):
    tag: str
    seconds: float


class Vigil(BaseModel):
    tag: str
    seconds: float


class Ask(BaseModel):
    question: str


def note(item: Note, signal: AbortSignal) -> ToolOutput:
    kill_point("tool:before", tag=item.tag)
    stop_point("tool:inside", tag=item.tag)
    signal.throw_if_aborted()
    record("run", item.tag)
    kill_point("tool:after", tag=item.tag)
    return ToolOutput(
        value={"noted": item.tag},
        content=[TextPart(text=f"Noted {item.tag}: {item.text}")],
        cost_usd=0.001,
    )


def render_start(item: Render, signal: AbortSignal) -> Started:
    key = idempotency_key()
    record("start", item.tag, ATTEMPTS, key=key)
    stop_point("start:inside", tag=item.tag)
    signal.throw_if_aborted()
    record("start", item.tag, key=key)
    kill_point("start:after", tag=item.tag)
    return Started(
        started={"job": item.tag, "frames": item.frames}, rows=[f"job-{item.tag}"]
    )


def render_wait(handle: Any, _signal: Any) -> ToolOutput:
    tag = str(handle["job"])
    record("wait", tag)
    kill_point("wait:inside", tag=tag)
    text = f"Rendered {handle['frames']} frames for {tag}."
    return ToolOutput(value={"job": tag}, content=[TextPart(text=text)], cost_usd=0.002)


def slow(item: Slow, _signal: Any) -> ToolOutput:
    """Outlives the visibility timeout on purpose; its effect is logged when it begins."""
    record("run", item.tag)
    time.sleep(item.seconds)
    return ToolOutput(
        value={"slept": item.seconds},
        content=[TextPart(text=f"Slept {item.seconds} s ({item.tag}).")],
    )


def vigil(item: Vigil, signal: AbortSignal) -> ToolOutput:
    """Works `seconds` in slices, stopping when its signal aborts (as a long tool that honours its
    signal does); logs its begin and its abort to attempts.log, and its effect when it finishes."""
    record("vigil-begin", item.tag, ATTEMPTS, key=idempotency_key())
    ends = time.monotonic() + item.seconds
    while time.monotonic() < ends:
        if signal.aborted:
            record("vigil-abort", item.tag, ATTEMPTS, reason=str(signal.reason))
            signal.throw_if_aborted()
        time.sleep(0.02)
    record("run", item.tag)
    return ToolOutput(
        value={"watched": item.seconds}, content=[TextPart(text=f"Watched {item.tag}.")]
    )


def _ask(*_: Any) -> ToolOutput:
    raise AssertionError("the loop never runs the ask tool")


TOOLS = [
    ToolSpec(
        name="note",
        description="Write a review note about a shot.",
        schema=Note,
        run=note,
    ),
    ToolSpec(
        name="render",
        description="Render a preview of some frames (two-phase).",
        schema=Render,
        start=render_start,
        wait=render_wait,
    ),
    ToolSpec(name="slow", description="Work for a while.", schema=Slow, run=slow),
    ToolSpec(
        name="vigil",
        description="Watch for a while (stops when aborted).",
        schema=Vigil,
        run=vigil,
    ),
    ToolSpec(
        name="ask", description="Ask the person a question.", schema=Ask, run=_ask
    ),
]
