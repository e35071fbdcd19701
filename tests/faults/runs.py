"""Durable runs of the fault suite: their spec, driving them to the end (asks answered), snapshots.

A snapshot is what a user can observe of a finished run: its status, its history
(`client.history`), its event stream (`client.events`) and the journal fields of every segment.
Comparing a crashed run's snapshot with the fault-free run of the same shape is the suite's test
of "nothing lost, nothing different".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from faults.shapes import Shape
from workers.client import Client
from workers.protocol import keys
from workers.protocol.records import FINAL, RunStatus

MODEL = "claude-sonnet-5-5"
SYSTEM = "You review storyboards for a film crew. Use the tools; ask when unsure."
TOOLSET = "faults"

# Fields of run events that differ between two runs of the same shape by design.
VOLATILE = frozenset({"answer_id", "at", "created", "touched", "run_id", "id_"})


def spec_for(shape: Shape, **overrides: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": shape.first_message}],
        "toolset": TOOLSET,
        "budget_usd": 10.0,
        "max_steps": 20,
        **overrides,
    }


@dataclass
class Snapshot:
    run_id: str
    status: RunStatus
    history: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    """Every journal field of the run, as "s<segment>/<step key>"."""


OnFailed = Callable[[Client, str, Shape, RunStatus], bool]


def drive(
    client: Client,
    runs: dict[str, Shape],
    timeout: float,
    on_failed: OnFailed | None = None,
) -> dict[str, RunStatus]:
    """Answer every ask of `runs` as it parks, until each has ended or `timeout` s have passed.
    A failed run is passed to `on_failed`, which may retry it (returns True: keep waiting for it).
    Returns the last status seen of every run (not final for those still going at the timeout)."""
    answered: set[tuple[str, int]] = set()
    last: dict[str, RunStatus] = {}
    pending = set(runs)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for run_id in sorted(pending):
            try:
                status = client.status(run_id)
            except (
                redis.ConnectionError,
                redis.TimeoutError,
            ):  # Redis restarting (test_redis_restart)
                time.sleep(0.2)
                continue
            last[run_id] = status
            if (
                status.status == "failed"
                and on_failed is not None
                and on_failed(client, run_id, runs[run_id], status)
            ):
                continue
            if status.status in FINAL:
                pending.discard(run_id)
            elif status.status == "asked" and (run_id, status.segment) not in answered:
                question = str((status.asked or {}).get("question", ""))
                try:
                    client.answer(run_id, runs[run_id].answer_for(question))
                except (redis.ConnectionError, redis.TimeoutError):
                    continue
                answered.add((run_id, status.segment))
        if pending:
            time.sleep(0.1)
    return last


def snapshot(
    client: Client, redis_client: redis.Redis, run_id: str, status: RunStatus
) -> Snapshot:
    history = [message.model_dump(mode="json") for message in client.history(run_id)]
    events = [
        (record.seq, record.segment, record.kind, _stable(record.data))
        for record in client.events(run_id)
    ]
    journal: list[str] = []
    for segment in range(status.segment + 1):
        name = keys.segment_name(segment)
        fields = redis_client.hkeys(keys.journal(run_id, name))
        journal += sorted(f"{name}/{field}" for field in fields)  # type: ignore[union-attr]
    return Snapshot(run_id, status, history, events, journal)


def _stable(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in VOLATILE}


def model_keys(shape: Shape) -> dict[str, int]:
    """The journal field of each model turn of a shape ("s<segment>/model:<k>" -> turn index).
    Each answered ask starts a new segment, whose model keys start again at 1 (DESIGN.md 5)."""
    found: dict[str, int] = {}
    segment, k = 0, 1
    for turn in range(shape.model_turns):
        found[f"s{segment}/model:{k}"] = turn
        k += 1
        if turn < len(shape.turns) and any(
            call.tool == "ask" for call in shape.turns[turn]
        ):
            segment, k = segment + 1, 1
    return found


def wait_for(what: str, check: Any, timeout: float) -> Any:
    """`check()`'s first truthy value, polled every 50 ms; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
