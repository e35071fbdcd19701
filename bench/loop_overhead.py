"""Loop overhead per model turn: toolloop vs pydantic-ai vs LangGraph, in one process run.

The workload (DESIGN.md section 7): a 20-turn scripted conversation. Turns 1-19 each call one trivial
tool (`add` on odd turns, `echo` on even ones) that returns at once; turn 20 answers with text. The
model is a zero-cost async function on every side, and so is every tool (async, so no side pays a
thread hop for a sync callable). What is left is the loop's own work per turn.

    ours       toolloop.run_tool_loop + MemoryJournal (every step journaled, JSON round-trip)
    pydantic   pydantic_ai.Agent + FunctionModel, tools registered with @agent.tool_plain
    langgraph  StateGraph(MessagesState): an agent node calling a chat model bound to the tools,
               ToolNode + tools_condition (the graph of LangGraph's agent guide), no checkpointer

Repetitions are interleaved (ours, pydantic, langgraph, ours, ...) after a warm-up so all sides share
the machine's noise; each figure is the median over repetitions of (one conversation) / 20, wall
time (perf_counter) and CPU time (process_time). Every conversation is checked: 20 model turns, 19
tool runs, the scripted final text.

    .venv/bin/python bench/loop_overhead.py                 # default reps, all sides
    .venv/bin/python bench/loop_overhead.py --reps 50 --sides ours --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _overhead_sides import FINAL, TOOL_CALLS, TURNS, Script, build_side

SIDES = ("ours", "pydantic-ai", "langgraph")
TARGET = 1 / 3
MIN_REPS = 10
PACKAGES = {
    "ours": "toolloop",
    "pydantic-ai": "pydantic-ai-slim",
    "langgraph": "langgraph",
}

Conversation = Callable[[], Awaitable[str]]


Samples = dict[str, list[float]]


async def measure(
    sides: list[str], reps: int, warmup: int, max_seconds: float
) -> tuple[Samples, Samples, dict[str, Script]]:
    """Run `warmup` then `reps` interleaved conversations per side: wall and CPU seconds per run, and
    each side's script (its counts are those of the last conversation, checked after every one).
    Past `max_seconds` the repetitions stop early once `MIN_REPS` of them are measured."""
    runs: dict[str, tuple[Script, Conversation]] = {}
    for name in sides:
        script = Script()
        runs[name] = (script, build_side(name, script))
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    deadline = time.monotonic() + max_seconds
    for rep in range(warmup + reps):
        if rep - warmup >= MIN_REPS and time.monotonic() > deadline:
            break
        if rep == warmup:
            gc.collect()
            gc.freeze()  # the imported libraries' objects: collections below no longer scan them
        for name in sides:
            script, conversation = runs[name]
            script.reset()
            gc.collect()  # each side starts clean, so no side pays for another's garbage
            c0, w0 = time.process_time(), time.perf_counter()
            text = await conversation()
            w1, c1 = time.perf_counter(), time.process_time()
            check(name, script, text)
            if rep >= warmup:
                wall[name].append(w1 - w0)
                cpu[name].append(c1 - c0)
    return wall, cpu, {name: script for name, (script, _) in runs.items()}


def check(name: str, script: Script, text: str) -> None:
    """Every side must do the same logical work, or the comparison is not honest."""
    if (script.model_calls, script.tool_runs, text) != (TURNS, TOOL_CALLS, FINAL):
        raise SystemExit(
            f"{name}: the conversation ran {script.model_calls} model turns and {script.tool_runs} tools"
            f" and ended with {text!r}.\n"
            f"  Expected {TURNS} turns, {TOOL_CALLS} tools and {FINAL!r}: the side is broken, fix it."
        )


def us_per_turn(samples: list[float]) -> float:
    return statistics.median(samples) / TURNS * 1e6


def report(
    sides: list[str], wall: Samples, cpu: Samples, scripts: dict[str, Script]
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name in sides:
        figures[name] = {
            "version": version(name),
            "wall_us_per_turn": round(us_per_turn(wall[name]), 1),
            "cpu_us_per_turn": round(us_per_turn(cpu[name]), 1),
            "wall_us_per_turn_p90": round(quantile(wall[name], 0.9) / TURNS * 1e6, 1),
            "turns": scripts[name].model_calls,
            "tool_calls": scripts[name].tool_runs,
        }
    ratios: dict[str, Any] = {}
    if "ours" in figures:
        for peer in (name for name in sides if name != "ours"):
            wall_ratio = (
                figures["ours"]["wall_us_per_turn"] / figures[peer]["wall_us_per_turn"]
            )
            cpu_ratio = (
                figures["ours"]["cpu_us_per_turn"] / figures[peer]["cpu_us_per_turn"]
            )
            ratios[peer] = {
                "wall": round(wall_ratio, 3),
                "cpu": round(cpu_ratio, 3),
                "meets_target": wall_ratio <= TARGET and cpu_ratio <= TARGET,
            }
    return {
        "sides": figures,
        "ratios_ours_over_peer": ratios,
        "target_ratio": round(TARGET, 4),
    }


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def version(name: str) -> str:
    try:
        return metadata.version(PACKAGES[name])
    except metadata.PackageNotFoundError:
        return "?"


def print_table(results: dict[str, Any], reps: int) -> None:
    print(
        f"Loop overhead per model turn: {TURNS} turns, {TOOL_CALLS} tool calls, medians of {reps} reps"
    )
    print(
        f"{'side':<12} {'version':<9} {'wall us/turn':>13} {'cpu us/turn':>12} {'wall p90':>9}"
    )
    for name, fig in results["sides"].items():
        print(
            f"{name:<12} {fig['version']:<9} {fig['wall_us_per_turn']:>13.1f} {fig['cpu_us_per_turn']:>12.1f}"
            f" {fig['wall_us_per_turn_p90']:>9.1f}"
        )
    for peer, ratio in results["ratios_ours_over_peer"].items():
        verdict = "meets" if ratio["meets_target"] else "MISSES"
        print(
            f"ours/{peer}: wall {ratio['wall']:.3f}, cpu {ratio['cpu']:.3f}"
            f" (target <= {TARGET:.3f}: {verdict})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reps", type=int, default=60, help="measured conversations per side"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="unmeasured conversations per side first"
    )
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        help=f"comma-separated subset of {', '.join(SIDES)}",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help=f"stop early past this time once {MIN_REPS} reps are measured (the table says how many ran)",
    )
    parser.add_argument(
        "--json", type=Path, help="also write the results to this JSON file"
    )
    args = parser.parse_args(argv)
    sides = [name.strip() for name in args.sides.split(",") if name.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or not sides or args.reps < 1 or args.warmup < 0:
        parser.error(
            f"--sides takes some of {', '.join(SIDES)} (got {args.sides!r}); --reps >= 1"
        )
    wall, cpu, scripts = asyncio.run(
        measure(sides, args.reps, args.warmup, args.max_seconds)
    )
    results = report(sides, wall, cpu, scripts)
    reps = len(wall[sides[0]])
    results.update(reps=reps, warmup=args.warmup, python=platform.python_version())
    print_table(results, reps)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
