"""The storyboard-review toolset: what the agent of `toolloop demo` can do.

    REVIEW_TOOLS = [list_shots, read_frame, render_preview (two-phase), ask]
    PUBLISH_TOOLS = REVIEW_TOOLS + [send_cut (needs approval)]

A worker serves it once registered (`TOOLLOOP_TOOLSETS=review=examples.storyboard.tools:REVIEW_TOOLS`);
a durable run names it by that name: `toolset="review"`.
`read_frame` returns an image part of a committed PNG (examples/storyboard/frames/);
`render_preview` is two-phase: `start` queues the render and returns its job handle, `wait` collects
it, so a crash between the two only waits and never renders twice. `ask` is never run: the loop
parks the run and the person's answer comes back as its result.

`send_cut` sends the cut to someone (`needs_approval=True`): each call waits for a person's decision
(`toolloop approve|reject|edit`), the README's "Approvals" lines; `PUBLISH_TOOLS` registers it
(`TOOLLOOP_TOOLSETS=publish=examples.storyboard.tools:PUBLISH_TOOLS`), and the simulated model of
`examples.storyboard.policy:publish_policy` calls it once per recipient the user's message names.
"""

from __future__ import annotations

import hashlib
import time
from typing import Literal, TypedDict

from pydantic import BaseModel, Field

from examples.storyboard.frames_png import frame_path
from toolloop import AbortSignal, ImagePart, Started, TextPart, ToolOutput, ToolSpec


class Shot(TypedDict):
    title: str
    duration_s: float
    target_s: float


SHOTS: dict[int, Shot] = {
    1: {"title": "Night city, wide", "duration_s": 3.0, "target_s": 3.0},
    2: {"title": "Night city, push in", "duration_s": 2.5, "target_s": 2.5},
    3: {"title": "Sunset, hero walks in", "duration_s": 6.0, "target_s": 4.0},
    4: {"title": "Sunset, hero at the rail", "duration_s": 3.5, "target_s": 3.5},
    5: {"title": "Rooftop, the phone lights up", "duration_s": 5.0, "target_s": 3.0},
    6: {"title": "Rooftop, hero leaves frame", "duration_s": 2.0, "target_s": 2.0},
}

PREVIEW_USD_PER_SECOND = 0.0005


class NoInput(BaseModel):
    pass


class FrameInput(BaseModel):
    shot: int = Field(ge=1, le=len(SHOTS), description="Shot number, 1 to 6.")


class PreviewInput(BaseModel):
    shots: list[int] = Field(
        min_length=1, description="Shot numbers to cut together, in order."
    )


class AskInput(BaseModel):
    question: str = Field(min_length=1, description="One question for the director.")


def list_shots(_input: NoInput, _signal: AbortSignal) -> ToolOutput:
    lines = [
        f"{n}. {s['title']}: {s['duration_s']} s (board says {s['target_s']} s)"
        for n, s in SHOTS.items()
    ]
    return ToolOutput(value=SHOTS, content=[TextPart(text="\n".join(lines))])


def read_frame(input: FrameInput, _signal: AbortSignal) -> ToolOutput:
    path = frame_path(input.shot)
    data = path.read_bytes()
    image = ImagePart(
        path=str(path), mime_type="image/png", hash=hashlib.sha256(data).hexdigest()
    )
    caption = TextPart(
        text=f"Key frame of shot {input.shot} ({SHOTS[input.shot]['title']})."
    )
    return ToolOutput(
        value={"shot": input.shot, "path": str(path)}, content=[caption, image]
    )


def _preview_seconds(shots: list[int]) -> float:
    return sum(SHOTS[n]["duration_s"] for n in shots if n in SHOTS)


def estimate_preview(input: PreviewInput) -> float:
    return round(_preview_seconds(input.shots) * PREVIEW_USD_PER_SECOND, 6)


def start_preview(input: PreviewInput, _signal: AbortSignal) -> Started:
    unknown = [n for n in input.shots if n not in SHOTS]
    job = "preview-" + hashlib.sha256(repr(input.shots).encode()).hexdigest()[:10]
    return Started(
        started={"job": job, "shots": input.shots, "unknown": unknown}, rows=[job]
    )


def wait_preview(started: dict[str, object], signal: AbortSignal) -> ToolOutput:
    time.sleep(0.05)  # the render farm; a real one would poll the job here
    signal.throw_if_aborted()
    shots = [int(n) for n in started["shots"]]  # type: ignore[attr-defined]
    if started.get("unknown"):
        text = (
            f"Render failed: no shot {started['unknown']}. Shots are 1 to {len(SHOTS)}."
        )
        return ToolOutput(value=started, content=[TextPart(text=text)])
    seconds = _preview_seconds(shots)
    job = started["job"]
    text = f"Preview {job} rendered: shots {shots}, {seconds:.1f} s, at previews/{job}.mp4."
    return ToolOutput(
        value={"job": started["job"], "seconds": seconds},
        content=[TextPart(text=text)],
        cost_usd=round(seconds * PREVIEW_USD_PER_SECOND, 6),
        rows=[str(started["job"])],
    )


RECIPIENTS = ("dailies", "director", "studio", "studio-review", "editor")
"""Whom `send_cut` may send the cut to."""


class SendInput(BaseModel):
    to: Literal["dailies", "director", "studio", "studio-review", "editor"] = Field(
        description="Who gets the cut: dailies, director, studio, studio-review or editor."
    )
    note: str = Field(
        default="", max_length=200, description="A line sent with the cut."
    )


def send_cut(input: SendInput, _signal: AbortSignal) -> ToolOutput:
    """Send the trimmed cut (a link) to one recipient: held for a person's decision first."""
    link = "cuts/rooftop-v2.mp4"
    text = f"Sent {link} to {input.to}" + (
        f" with the note {input.note!r}." if input.note else "."
    )
    return ToolOutput(
        value={"to": input.to, "link": link},
        content=[TextPart(text=text)],
        cost_usd=0.0,
    )


def ask(input: AskInput, _signal: AbortSignal) -> ToolOutput:
    """Never called: on a valid `ask` the loop parks the run and the person's answer is the result."""
    raise RuntimeError(
        f"ask {input.question!r} reached the tool; the loop should have parked the run."
    )


REVIEW_TOOLS = [
    ToolSpec(
        name="list_shots",
        description="List the storyboard's shots with their cut durations and the board's targets.",
        schema=NoInput,
        run=list_shots,
    ),
    ToolSpec(
        name="read_frame",
        description="Look at the key frame of one shot (an image).",
        schema=FrameInput,
        run=read_frame,
    ),
    ToolSpec(
        name="render_preview",
        description="Render a low-resolution preview of some shots cut together; returns where it is.",
        schema=PreviewInput,
        start=start_preview,
        wait=wait_preview,
        estimate_usd=estimate_preview,
    ),
    ToolSpec(
        name="ask",
        description="Ask the director one question and wait for the answer.",
        schema=AskInput,
        run=ask,
    ),
]

PUBLISH_TOOLS = [
    *REVIEW_TOOLS,
    ToolSpec(
        name="send_cut",
        description="Send the trimmed cut to one recipient (a person approves each send first).",
        schema=SendInput,
        run=send_cut,
        needs_approval=True,
    ),
]
