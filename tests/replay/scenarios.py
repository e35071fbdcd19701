"""Golden-journal scenarios: each is recorded once into `golden/<name>.json` and replayed by
test_replay.py. Regenerate (and say why in the commit) with:

    .venv/bin/python tests/replay/scenarios.py

A golden file holds the options summary, the journal entries (in the order they were written), and
what the run produced: every model request, the result and the events.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolloop import (
    Budget,
    ImagePart,
    LoopEvent,
    MemoryJournal,
    PromptGenRequest,
    RunToolLoopOptions,
    RunToolLoopResult,
    Started,
    TextPart,
    ToolOutput,
    ToolSpec,
    run_tool_loop,
)
from toolloop.testing import ScriptedModel, call, reply

GOLDEN = Path(__file__).parent / "golden"


class Shot(BaseModel):
    shot: int
    take: int = 1


class Question(BaseModel):
    question: str


def _read_frame(input: Shot, signal: Any) -> ToolOutput:
    image = ImagePart(
        path=f"/boards/shot{input.shot}.png",
        mime_type="image/png",
        hash=f"{input.shot:02x}",
    )
    return ToolOutput(
        value={"shot": input.shot},
        content=[TextPart(text=f"Shot {input.shot}."), image],
        cost_usd=0.01,
    )


def _start(input: Shot, signal: Any) -> Started:
    return Started(started={"job": f"render-{input.shot}"}, rows=[f"job-{input.shot}"])


def _wait(started: Any, signal: Any) -> ToolOutput:
    return ToolOutput(
        value=started,
        content=[TextPart(text=f"Rendered {started['job']}.")],
        cost_usd=0.25,
    )


def _ask(input: Question, signal: Any) -> ToolOutput:
    raise AssertionError("ask is never run")


def _estimate(input: Shot) -> float:
    return 0.3


def tools(
    names: list[str], live: bool, explode: Callable[..., Any] | None = None
) -> list[ToolSpec]:
    """The named tools; with `live=False` every callable but the (pure) estimate is `explode`."""

    def pick(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn if live or explode is None else explode

    registry = {
        "read_frame": ToolSpec(
            name="read_frame",
            description="Read one frame.",
            schema=Shot,
            run=pick(_read_frame),
        ),
        "render": ToolSpec(
            name="render",
            description="Render a shot.",
            schema=Shot,
            start=pick(_start),
            wait=pick(_wait),
            estimate_usd=_estimate,
        ),
        "ask": ToolSpec(
            name="ask", description="Ask the person.", schema=Question, run=pick(_ask)
        ),
    }
    return [registry[name] for name in names]


SCENARIOS: dict[str, dict[str, Any]] = {
    "review_images": {
        "options": {
            "model": "claude-test",
            "system": "You review storyboards.",
            "messages": [{"role": "user", "content": "Review shots 1 to 4."}],
            "tools": ["read_frame"],
            "budget": {"usd": 5.0, "finish_at": 0.8},
            "max_steps": 8,
            "keep_images": 1,
            "cache": "conversation",
            "reasoning": "low",
        },
        "script": [
            reply(tool_calls=[call("read_frame", {"shot": 1}, id="r1")], cost_usd=0.02),
            reply(
                "Next.",
                tool_calls=[
                    call("read_frame", {"shot": 2}, id="r2"),
                    call("zoom", {}, id="r3"),
                ],
                cost_usd=0.02,
            ),
            reply(
                tool_calls=[call("read_frame", {"shot": "three"}, id="r4")],
                cost_usd=0.02,
            ),
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="r5")], cost_usd=0.02),
            reply("Shots 1-3 look fine.", cost_usd=0.02),
        ],
    },
    "render_finish": {
        "options": {
            "model": "claude-test",
            "system": "You render shots.",
            "messages": [{"role": "user", "content": "Render shots 1 and 2."}],
            "tools": ["render", "read_frame"],
            "budget": {"usd": 1.0, "finish_at": 0.5},
            "max_steps": 6,
            "finish_note": "The budget is nearly spent: wrap up.",
        },
        "script": [
            reply(tool_calls=[call("render", {"shot": 1}, id="p1")], cost_usd=0.1),
            reply(tool_calls=[call("render", {"shot": 2}, id="p2")], cost_usd=0.1),
            reply(
                tool_calls=[
                    call("read_frame", {"shot": 2}, id="p3"),
                    call("render", {"shot": 3}, id="p4"),
                ],
                cost_usd=0.1,
            ),
        ],
    },
    "ask_held": {
        "options": {
            "model": "claude-test",
            "system": "You review storyboards.",
            "messages": [{"role": "user", "content": "Review shot 5."}],
            "tools": ["read_frame", "ask"],
            "budget": {"usd": 2.0},
            "max_steps": 4,
            "cache": "system",
        },
        "script": [
            reply(tool_calls=[call("read_frame", {"shot": 5}, id="a1")], cost_usd=0.03),
            reply(
                "One question.",
                tool_calls=[
                    call("ask", {"question": "Trim shot 5?"}, id="a2"),
                    call("ask", {"question": "And shot 6?"}, id="a3"),
                    call("read_frame", {"shot": 6}, id="a4"),
                ],
                cost_usd=0.03,
            ),
        ],
    },
}


def build_options(
    summary: dict[str, Any],
    generate: Any,
    journal: MemoryJournal,
    on_step: Any,
    tool_list: list[ToolSpec],
) -> RunToolLoopOptions:
    values = {k: v for k, v in summary.items() if k not in ("tools", "budget")}
    return RunToolLoopOptions(
        generate=generate,
        tools=tool_list,
        budget=Budget(**summary["budget"]),
        step=journal.step,
        on_step=on_step,
        **values,
    )


def dump(
    result: RunToolLoopResult, events: list[LoopEvent], requests: list[PromptGenRequest]
) -> dict[str, Any]:
    return {
        "requests": [r.model_dump(mode="json") for r in requests],
        "result": result.model_dump(mode="json"),
        "events": [e.model_dump(mode="json") for e in events],
    }


async def record(name: str) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    summary = scenario["options"]
    model = ScriptedModel(scenario["script"])
    journal = MemoryJournal()
    events: list[LoopEvent] = []
    opts = build_options(
        summary, model, journal, events.append, tools(summary["tools"], live=True)
    )
    result = await run_tool_loop(opts)
    return {
        "options": summary,
        "journal": [[key, json.loads(text)] for key, text in journal.entries.items()],
        **dump(result, events, model.requests),
    }


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name in sorted(SCENARIOS):
        data = asyncio.run(record(name))
        (GOLDEN / f"{name}.json").write_text(
            json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        )
        stopped_by = data["result"]["stopped_by"]
        print(
            f"wrote {GOLDEN / name}.json: {len(data['journal'])} steps, stopped by {stopped_by}"
        )


if __name__ == "__main__":
    sys.exit(main())
