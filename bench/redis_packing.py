"""CPU to pack one loop turn's Redis pipeline: redis-py's asyncio packer (pure Python) against the
hiredis packer the worker's connections use (`workers.process.redisio.PackedConnection`).

    .venv/bin/python bench/redis_packing.py [--rounds 2000] [--steps 10]

The pipeline is what a busy worker sends in one turn: `--steps` commits (EVALSHA with 13 keys and a
~2 KB JSON payload, as RUN_COMMIT) and one SEND_MANY carrying a task.multi event message, a successor
and an ack per step. Medians of 5 timings of `--rounds` packings each, in µs per turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis.asyncio as aredis

from workers.process.redisio import PackedConnection


def turn(steps: int) -> list[tuple[Any, ...]]:
    keys = [f"tl:{{run{i}}}:state" for i in range(13)]
    payload = '{"token": 7, "events": [[1, "model", "' + "x" * 2000 + '"]]}'
    commits = [("EVALSHA", "a" * 40, 13, *keys, payload) for _ in range(steps)]
    sends: list[Any] = []
    for i in range(steps):
        sends += [3, "PUBLISH", "/0.celeryev/task.multi", b"e" * 900]
        sends += [3, "LPUSH", "llm", "m" * 1100]
        sends += [3, "ZREM", "unacked_index", f"tag-{i}"]
    return [*commits, ("EVALSHA", "b" * 40, 0, *sends)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument(
        "--steps", type=int, default=10, help="steps whose commands share the turn"
    )
    args = parser.parse_args(argv)
    commands = turn(args.steps)
    sides = {"redis-py": aredis.Connection(), "hiredis": PackedConnection()}
    assert b"".join(sides["redis-py"].pack_commands(commands)) == b"".join(
        sides["hiredis"].pack_commands(commands)
    )
    measured = {}
    for name, connection in sides.items():
        times = timeit.repeat(
            lambda c=connection: c.pack_commands(commands), number=args.rounds, repeat=5
        )
        measured[name] = statistics.median(times) / args.rounds * 1e6
    print(
        f"\nCPU to pack one turn's pipeline ({args.steps} commits + one SEND_MANY), median of 5"
    )
    for name, us in measured.items():
        print(f"{name:<9} {us:8.1f} µs")
    print(f"hiredis / redis-py: {measured['hiredis'] / measured['redis-py']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
