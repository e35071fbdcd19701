"""CPU of reading one streamed Anthropic answer, beside reading the same answer whole, in one run.

    .venv/bin/python bench/stream_parse.py [--tokens 2000] [--reps 20]

The answer is the simulator's (toolloop/sim/stream.py): `--tokens` text pieces of 4 characters, each
its own `content_block_delta` (the worst case: real streams often carry several tokens per event).
Sides, interleaved, median CPU per answer (`time.process_time`):
    whole       the non-streamed body: JSON parse + surrogate check (what `call_json` does)
    streamed    the SSE parser and `MessageStream`, fed in 1,400-byte chunks, no `on_delta`
    deltas      the same with `on_delta`: a `DeltaEvent` per piece through the loop's `Relay` and
                its step stamping (what a run with an `on_step` pays)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolloop.contract import DeltaEvent
from toolloop.deltas import Relay
from toolloop.fastjson import valid_text
from toolloop.providers.anthropic.stream import MessageStream
from toolloop.sim.stream import anthropic_events, encode


def answer(tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": "word" * tokens}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "stop_details": None,
        "usage": {"input_tokens": 1200, "output_tokens": tokens},
    }


def streamed(raw: bytes, on_delta: Any) -> Any:
    reader = MessageStream(on_delta)
    for start in range(0, len(raw), 1400):
        reader.feed(raw[start : start + 1400])  # what `call_json` does with each read
        reader.flush()
    return reader.result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    body = answer(args.tokens)
    whole = json.dumps(body).encode()
    raw = b"".join(encode(name, data) for name, data, _ in anthropic_events(body))
    shown: list[DeltaEvent] = []

    def stamped(event: DeltaEvent) -> None:
        shown.append(
            DeltaEvent(
                step=1, text=event.text, thinking=event.thinking, discard=event.discard
            )
        )

    sides: dict[str, Callable[[], Any]] = {
        "whole": lambda: valid_text(json.loads(whole)),
        "streamed": lambda: streamed(raw, None),
        "deltas": lambda: streamed(raw, Relay(stamped)),
    }
    assert sides["streamed"]() == sides["whole"]() == sides["deltas"]()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.reps):
        for name, side in sides.items():
            shown.clear()
            cpu = time.process_time()
            side()
            times[name].append((time.process_time() - cpu) * 1000)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"one answer of {args.tokens} one-piece deltas ({len(raw):,} bytes streamed), median of {args.reps}:"
    )
    for name, value in median.items():
        ratio = value / median["whole"]
        per_token = value * 1000 / args.tokens
        print(
            f"  {name:9s} {value:7.2f} ms CPU  ({per_token:5.2f} us per token, {ratio:5.1f}x whole)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
