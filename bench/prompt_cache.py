"""Prompt cache: a 30-turn tool conversation through the Anthropic provider on the simulator, in each
cache mode of `run_tool_loop` ("off", "system", "conversation"), in one process run.

The workload (DESIGN.md section 7): a system text (~1,600 tokens) and three tool definitions
(~1,800 tokens together, past Anthropic's 1,024-token minimum cacheable prefix); the model reads one
storyboard frame per turn for 29 turns (each result ~90 tokens of text), then answers. Every request
goes over real HTTP to `toolloop.sim.SimServer`, whose prompt cache follows Anthropic's rules
(breakpoints, prefix match, 20-block lookback, minimum length, 5-minute TTL) and reports usage as
the API does; cost is what our provider computes from that usage at the model's catalogue prices
(Sonnet 5.5: cache reads $0.20/M, 5-minute writes $2.50/M). The simulator's cache is reset
between modes, so each mode starts cold.

    .venv/bin/python bench/prompt_cache.py                 # 30 turns, all three modes
    .venv/bin/python bench/prompt_cache.py --turns 10 --json out.json

Figures per mode: uncached input, cache read and cache write tokens, prompt tokens, cost, cost
against "off", and the share of cached reads in prompt tokens from turn 3 on (target for
"conversation": >= 90 %).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from toolloop import (
    Budget,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    PromptGenUsage,
    RunToolLoopOptions,
    TextPart,
    ToolOutput,
    ToolSpec,
    run_tool_loop,
)
from toolloop.providers import AnthropicHandler, default_catalog
from toolloop.sim import SimRequest, SimServer, SimTurn

MODES = ("off", "system", "conversation")
MODEL = "claude-sonnet-5-5"
TARGET = 0.90
FROM_TURN = 3

_RULES = [
    "Check that every shot states its framing (wide, medium, close-up) and that it matches the script.",
    "Flag continuity breaks: props, costume, lighting direction and screen direction across cuts.",
    "Note the pacing of each sequence against the target running time given in the brief.",
    "Prefer concrete fixes (trim by N frames, swap shots 4 and 5) over general remarks.",
    "Keep the director's intent: never propose a change that contradicts the written treatment.",
    "Mark every shot that needs a pickup, with the reason and the minimum coverage needed.",
    "Check the eyelines of dialogue coverage and the 180-degree rule for every scene.",
    "Report sound cues the board implies (door slam, phone ring) so the editor can temp them.",
]
SYSTEM = "You are a storyboard reviewer for a film production.\n\n" + "\n".join(
    f"Rule {section}.{n}: {rule}"
    for section in range(1, 9)
    for n, rule in enumerate(_RULES, 1)
)


class Frame(BaseModel):
    shot: int = Field(description="The shot number, from 1.")
    frame: int = Field(default=1, description="The frame within the shot.")


class Trim(BaseModel):
    shot: int
    frames: int = Field(
        description="How many frames to remove from the end of the shot."
    )


class Note(BaseModel):
    shot: int
    text: str = Field(description="The review note, one or two sentences.")


def _frame(input: Frame, signal: Any) -> ToolOutput:
    text = (
        f"Shot {input.shot}, frame {input.frame}: medium shot, two characters at a kitchen table, "
        f"key light from the window on the left, the kettle steaming in the background, the phone "
        f"face down by the sugar bowl; the camera sits at eye level, slightly right of the axis, and "
        f"the take ends on the woman looking at the door. Continuity: mug in right hand (shot "
        f"{input.shot - 1 if input.shot > 1 else 1} had it in the left)."
    )
    return ToolOutput(value={"shot": input.shot}, content=[TextPart(text=text)])


def _none(input: BaseModel, signal: Any) -> ToolOutput:
    return ToolOutput(value=None, content=[TextPart(text="Recorded.")])


TOOLS = [
    ToolSpec(
        name="read_frame",
        description="Read one storyboard frame as a description.",
        schema=Frame,
        run=_frame,
    ),
    ToolSpec(
        name="trim",
        description="Propose a trim at the end of a shot.",
        schema=Trim,
        run=_none,
    ),
    ToolSpec(
        name="note",
        description="Record a review note on a shot.",
        schema=Note,
        run=_none,
    ),
]


def policy(turns: int) -> Any:
    """Turn n (n assistant messages so far) reads shot n+1; the last turn answers with text."""

    def answer(request: SimRequest) -> SimTurn:
        n = request.assistant_turns
        if n >= turns - 1:
            return SimTurn(
                text=f"Reviewed {n} frames: trim shot 3 by 12 frames, pick up shot 7."
            )
        return SimTurn(
            text="", tool_calls=[{"name": "read_frame", "input": {"shot": n + 1}}]
        )  # type: ignore[list-item]

    return answer


async def run_mode(sim: SimServer, mode: str, turns: int) -> dict[str, Any]:
    sim.reset()  # each mode starts with a cold cache
    handler = AnthropicHandler("sim-key", base_url=sim.base_url)
    usages: list[PromptGenUsage] = []
    costs: list[float] = []

    def on_step(event: Any) -> None:
        if isinstance(event, ModelEvent):
            usages.append(event.usage)
            costs.append(event.cost_usd)

    started = time.perf_counter()
    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=PromptGen({"anthropic": handler}, "anthropic").as_generate(),
            model=MODEL,
            system=SYSTEM,
            messages=[
                {
                    "role": "user",
                    "content": "Review the storyboard of scene 12, frame by frame.",
                }
            ],
            tools=TOOLS,
            budget=Budget(usd=100.0),
            max_steps=turns,
            step=MemoryJournal().step,
            on_step=on_step,
            cache=mode,  # type: ignore[arg-type]
        )
    )
    elapsed = time.perf_counter() - started
    if result.stopped_by != "done" or len(usages) != turns:
        raise SystemExit(
            f"mode {mode!r}: expected {turns} turns ending in 'done', got {len(usages)} / {result.stopped_by}"
        )
    later = usages[FROM_TURN - 1 :]
    prompt_later = sum(u.prompt_tokens for u in later)
    return {
        "mode": mode,
        "turns": len(usages),
        "input_tokens": sum(
            u.prompt_tokens - u.cached_tokens - u.cache_write_tokens for u in usages
        ),
        "cache_read_tokens": sum(u.cached_tokens for u in usages),
        "cache_write_tokens": sum(u.cache_write_tokens for u in usages),
        "prompt_tokens": sum(u.prompt_tokens for u in usages),
        "output_tokens": sum(u.completion_tokens for u in usages),
        "cost_usd": round(sum(costs), 6),
        "cached_share_from_turn_3": (sum(u.cached_tokens for u in later) / prompt_later)
        if prompt_later
        else 0.0,
        "seconds": round(elapsed, 3),
    }


def table(rows: list[dict[str, Any]]) -> str:
    off = next((r["cost_usd"] for r in rows if r["mode"] == "off"), None)
    head = (
        f"{'mode':<13}{'input':>9}{'cache read':>12}{'cache write':>13}{'prompt':>9}"
        f"{'cost USD':>11}{'vs off':>8}{'cached >=t3':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['cost_usd'] / off:.2f}x" if off else "-"
        lines.append(
            f"{r['mode']:<13}{r['input_tokens']:>9}{r['cache_read_tokens']:>12}{r['cache_write_tokens']:>13}"
            f"{r['prompt_tokens']:>9}{r['cost_usd']:>11.4f}{ratio:>8}{r['cached_share_from_turn_3']:>12.1%}"
        )
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--turns",
        type=int,
        default=30,
        help="model turns per conversation (default 30)",
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma list of cache modes"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or args.turns < FROM_TURN:
        parser.error(
            f"modes must be among {', '.join(MODES)} (got {unknown}); --turns at least {FROM_TURN}"
        )
    with SimServer(policy(args.turns)) as sim:
        rows = [await run_mode(sim, mode, args.turns) for mode in modes]
    print(
        f"Prompt cache, {args.turns}-turn tool conversation, anthropic provider on the simulator"
    )
    price = default_catalog().price(MODEL)
    assert price is not None
    print(
        f"model {MODEL} (${price.input:g}/M input, cache read ${price.cache_read:g}/M, "
        f"5-minute cache write ${price.cache_write:g}/M, output ${price.output:g}/M)"
    )
    print(table(rows))
    conversation = next((r for r in rows if r["mode"] == "conversation"), None)
    if conversation is not None:
        share = conversation["cached_share_from_turn_3"]
        verdict = "met" if share >= TARGET else "MISSED"
        print(
            f"conversation: cached reads are {share:.1%} of prompt tokens from turn {FROM_TURN} on "
            f"(target >= {TARGET:.0%}: {verdict})"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"model": MODEL, "turns": args.turns, "modes": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
