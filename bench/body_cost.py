"""What the Anthropic request body costs per model call (bench/PROFILE-19.md section 9): the body's
JSON bytes of call t of a run, built as the provider builds them, after the run's calls 1..t-1 (so
the run's memo holds what the last request sent). The conversation is bench/scale.py's: its system
text, the `note` tool, and per turn an assistant text with a `note` call and a tool message of a
paragraph, with the loop's conversation cache marks (`request_messages`, as `run_tool_loop` sends).
Thread CPU per call, the median of `--rounds` runs of 30 calls, at calls 1, 10 and 30.

    .venv/bin/python bench/body_cost.py                  # this tree
    .venv/bin/python bench/body_cost.py --tree /tmp/main # another tree's toolloop (e.g. main's)

A tree without `toolloop.providers.anthropic.encode` (before it) is measured as its handler built
the body then: `dumps(build_body(...))`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TURNS = 30
SHOWN = (1, 10, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree", type=Path, default=HERE.parent, help="the tree whose toolloop to time"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--runs", type=int, default=300, help="runs in flight, each called in turn"
    )
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree.resolve()), str(HERE)]
    figures = measure(args.rounds, args.runs)
    shown = ", ".join(f"call {t}: {figures[t - 1]:.1f} us" for t in SHOWN)
    print(
        f"{args.tree.resolve()}: {shown} (median of {args.rounds} x {args.runs} runs, thread CPU)"
    )


def measure(rounds: int, runs: int) -> list[float]:
    # imported here: the tree to time is put on sys.path first
    from _durable_agent import PARAGRAPH, TOOLS

    from toolloop.contract import (
        AssistantMessage,
        PromptGenRequest,
        TextPart,
        ToolMessage,
        UserMessage,
    )
    from toolloop.loop.cache import request_messages
    from toolloop.loop.history import History
    from toolloop.loop.tools import tool_definitions
    from toolloop.memo import RunMemo, run_memo
    from toolloop.providers.models import default_catalog
    from toolloop.testing import call

    body = body_of()
    definitions = tool_definitions(TOOLS)
    user = UserMessage(content="Review the rough cut, shot by shot.")
    answers = [
        AssistantMessage(
            content=f"Shot {n}.",
            tool_calls=[call("note", {"shot": n, "text": "ok"}, id=f"c{n}")],
        )
        for n in range(1, TURNS + 1)
    ]
    results = [
        ToolMessage(
            tool_call_id=f"c{n}",
            content=[TextPart(text=f"Noted for shot {n}: ok. " + PARAGRAPH)],
        )
        for n in range(1, TURNS + 1)
    ]
    info = default_catalog().find("claude-sonnet-5-5")
    times: list[list[float]] = [[] for _ in range(TURNS)]
    gc.disable()  # as rare on this path as in the worker (gc.freeze, a young threshold of 100,000)
    for _ in range(rounds):
        memos = [RunMemo(replays=False) for _ in range(runs)]
        histories = [History([user], keep_images=2) for _ in range(runs)]
        for turn in range(TURNS):
            for memo, history in zip(
                memos, histories, strict=True
            ):  # each run's data cold, as in a worker
                token = run_memo.set(memo)
                messages, cache_system = request_messages(
                    history, "conversation", TURNS + 1, memo
                )
                request = PromptGenRequest.model_construct(
                    _fields_set={
                        "prompt",
                        "system",
                        "model",
                        "messages",
                        "tools",
                        "cache_system",
                    },
                    prompt="",
                    system=f"You review storyboards. turns={TURNS}",
                    model="claude-sonnet-5-5",
                    temperature=None,
                    params=None,
                    messages=messages,
                    tools=definitions,
                    tool_choice=None,
                    cache_system=cache_system,
                )
                began = time.thread_time_ns()
                body(request, info)
                times[turn].append((time.thread_time_ns() - began) / 1000)
                history.append(answers[turn])
                history.append(results[turn])
                run_memo.reset(token)
        del memos, histories
        gc.collect()
    gc.enable()
    return [statistics.median(t) for t in times]


def body_of() -> Any:
    """The handler's body step of the tree on sys.path: request -> the bytes it sends."""
    from toolloop.fastjson import dumps
    from toolloop.providers.anthropic import request as built

    try:
        from toolloop.providers.anthropic import encode  # type: ignore[attr-defined]
    except ImportError:

        def old(request: Any, info: Any) -> bytes:
            return dumps(
                built.build_body(
                    request, model=request.model, reasoning=None, images={}, info=info
                )
            )

        return old

    def new(request: Any, info: Any) -> bytes:
        frame = built.body_frame(
            request, model=request.model, reasoning=None, info=info
        )
        return encode.encode_body(request, frame, {})

    return new


if __name__ == "__main__":
    main()
