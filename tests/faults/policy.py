"""The simulator policy of the fault suite: it answers each run from its shape and counts every call.

It runs in the test process, inside the simulator. Every request is counted under the current
`phase` ("ref" for the fault-free runs, "fault" for the crash runs) and its `<run tag>#<turn>`: these
counts are what a provider would bill, so a turn counted twice is a model call paid twice. For the
turns named in `hold`, the policy writes `arrived/<tag>` (the worker's model wrapper waits for it
before it kills itself: faults/model.py) and answers only after `hold_s`, so the kill lands while the
call is in flight.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faults.model import arrived_path
from faults.shapes import Shape, first_text, run_tag
from toolloop.sim.script import SimRequest


class FaultPolicy:
    def __init__(self, directory: Path, hold_s: float = 1.5) -> None:
        self.directory = directory
        (directory / "arrived").mkdir(parents=True, exist_ok=True)
        self.hold_s = hold_s
        self.shapes: dict[str, Shape] = {}
        self.hold: set[str] = set()
        self.phase = "ref"
        self.counts: Counter[tuple[str, str]] = Counter()
        self.unknown = 0
        self._lock = threading.Lock()

    def add(self, shape: Shape) -> None:
        self.shapes[shape.tag] = shape

    def calls(self, phase: str, tag: str) -> int:
        with self._lock:
            return self.counts[(phase, tag)]

    def __call__(self, request: SimRequest) -> dict[str, Any]:
        tag = run_tag(first_text(request.messages))
        shape = self.shapes.get(tag or "")
        if shape is None:
            with self._lock:
                self.unknown += 1
            return {"text": "This conversation is not part of the fault suite."}
        turn = request.assistant_turns
        call_tag = f"{tag}#{turn}"
        with self._lock:
            self.counts[(self.phase, call_tag)] += 1
            attempt = self.counts[(self.phase, call_tag)]
        answer = shape.sim_turn(turn, attempt, request.wire, faults=self.phase != "ref")
        if call_tag in self.hold:
            Path(arrived_path(str(self.directory), call_tag)).touch()
            answer["latency_s"] = answer.get("latency_s", 0.0) + self.hold_s
        return answer


def clear_arrivals(directory: Path) -> None:
    for path in (directory / "arrived").glob("*"):
        os.unlink(path)


class LoggedPolicy(FaultPolicy):
    """The fault suite's policy, also logging each model call's arrival: (time, `<run tag>#<turn>`)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.arrivals: list[tuple[float, str]] = []
        self._log_lock = threading.Lock()

    def __call__(self, request: SimRequest) -> dict[str, Any]:
        tag = f"{run_tag(first_text(request.messages))}#{request.assistant_turns}"
        with self._log_lock:
            self.arrivals.append((time.time(), tag))
        return super().__call__(request)

    def arrived(self, tag: str) -> list[float]:
        with self._log_lock:
            return [at for at, seen in self.arrivals if seen == tag]
