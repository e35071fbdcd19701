"""A simulator policy for the tests: it answers from a script and keeps each request it answered."""

from __future__ import annotations

import threading
from typing import Any

from toolloop.sim import Script, SimRequest, SimTurn


class Recording:
    """Answers turn `request.assistant_turns` of `turns` (toolloop.sim.Script) and keeps each request
    with the turn it answered, in order; safe across the simulator's threads."""

    def __init__(self, turns: list[Any]) -> None:
        self.script = Script(turns)
        self.lock = threading.Lock()
        self.seen: list[tuple[SimRequest, SimTurn]] = []

    def __call__(self, request: SimRequest) -> SimTurn:
        turn = self.script(request)
        with self.lock:
            self.seen.append((request, turn))
        return turn

    @property
    def requests(self) -> list[SimRequest]:
        with self.lock:
            return [request for request, _ in self.seen]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON body of each request."""
        return [request.body for request in self.requests]

    def of(self, system: str) -> list[tuple[SimRequest, SimTurn]]:
        """The requests whose system text is `system`, each with its turn."""
        with self.lock:
            return [
                (request, turn)
                for request, turn in self.seen
                if request.system == system
            ]
