"""Summarize py-spy raw (collapsed) stacks of a worker: `python bench/_spy_summary.py FILE [THREAD]`.

Counts only the samples of THREAD (default `toolloop-asyncio`, the process loop that runs every
step) and prints three tables, each as shares of those samples:

- by concern: the innermost frame of our own code (`workers/`, `toolloop/`) decides what the
  sample was for (CONCERNS below, first match), so JSON or pydantic called by the journal counts
  for the journal;
- by leaf library: the file of the innermost frame (what burnt the CPU: json, pydantic, aiohttp...);
- by our function, inclusive: every `workers/` or `toolloop/` function on the stack.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

CONCERNS = [
    (
        "step consumer: claim, dispatch, ack (workers/worker/consumer.py)",
        ("workers/worker/consumer.py",),
    ),
    (
        "Celery wire: message + task-event encode/decode (workers/protocol/wire.py)",
        ("workers/protocol/wire.py",),
    ),
    (
        "Redis batch and leases (workers/process/redisio.py)",
        ("workers/process/redisio.py", "workers/process/leases.py"),
    ),
    (
        "task events and progress (advance publish, process.TaskEvents)",
        ("_Step.publish", "TaskEvents"),
    ),
    (
        "model call: provider request/response + HTTP (toolloop/providers/)",
        ("toolloop/providers/",),
    ),
    (
        "kept loop + journal (toolloop/loop/, toolloop/journal/, workers/process/live.py)",
        (
            "toolloop/loop/",
            "toolloop/journal/",
            "workers/process/live.py",
            "toolloop/abort.py",
        ),
    ),
    ("tools in a thread (workers/config/toolsets.py)", ("workers/config/toolsets.py",)),
    (
        "advance: begin, commit, records (workers/step/advance.py, runs.py, records.py)",
        (
            "workers/step/advance.py",
            "workers/runs/lifecycle.py",
            "workers/protocol/records.py",
            "workers/flow/limiter.py",
        ),
    ),
    ("other workers/ and toolloop/", ("workers/", "toolloop/")),
]
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+):\d+\)$")


def concern_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marks in CONCERNS:
            if any(mark in frame for mark in marks):
                return name
    return "no frame of ours (event loop callbacks, Redis/HTTP protocol callbacks)"


def _library(file: str) -> str:
    """`aiohttp/client.py` -> `aiohttp`; a file of the standard library's top level stays whole."""
    return file.split("/")[0] if "/" in file else file


def main(path: str, thread: str = "toolloop-asyncio") -> None:
    concerns: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if frames[0].startswith(
            "process "
        ):  # py-spy --subprocesses puts the process first
            frames = frames[1:]
        if not frames or thread not in frames[0]:
            continue
        n = int(count)
        total += n
        concerns[concern_of(frames[1:])] += n
        found = FRAME.match(frames[-1])
        leaves[_library(found["file"]) if found else frames[-1]] += n
        for func in {f for f in frames[1:] if "workers/" in f or "toolloop/" in f}:
            ours[re.sub(r":\d+\)$", ")", func)] += n
    print(f"{total} samples of {thread}")
    for title, table, limit in (
        ("by concern", concerns, 20),
        ("by leaf library", leaves, 25),
        ("by our function, inclusive", ours, 45),
    ):
        print(f"\n{title}:")
        for key, n in table.most_common(limit):
            print(f"  {n / total:6.1%}  {key}")


if __name__ == "__main__":
    main(*sys.argv[1:])
