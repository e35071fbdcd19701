"""Helpers of the reasoning tests: a recording simulator policy, and what the simulator emitted
versus what a request sent back (toolloop/sim/thinking.py)."""

from __future__ import annotations

import threading
from typing import Any

from toolloop.sim import Script, SimRequest, SimTurn, thinking


class Recording:
    """A simulator policy: answers from a script and keeps each request with the turn it answered."""

    def __init__(self, turns: list[Any]) -> None:
        self.script = Script(turns)
        self.lock = threading.Lock()
        self.seen: list[tuple[SimRequest, SimTurn]] = []

    def __call__(self, request: SimRequest) -> SimTurn:
        turn = self.script(request)
        with self.lock:
            self.seen.append((request, turn))
        return turn

    def of(self, system: str) -> list[tuple[SimRequest, SimTurn]]:
        with self.lock:
            return [(request, turn) for request, turn in self.seen if request.system == system]


def emitted(wire: str, request: SimRequest, turn: SimTurn) -> list[dict[str, Any]]:
    """The reasoning the simulator put in its answer to `request`, as it was on the wire."""
    if wire == "anthropic":
        return thinking.anthropic_blocks(turn, request)
    return list(thinking.fal_fields(turn, request).get("reasoning_details", []))


def sent_back(wire: str, body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The reasoning at the head of each assistant message of a request body (Anthropic: the
    thinking blocks before any other block; fal: `reasoning_details`), in order."""
    out = []
    for message in body["messages"]:
        if message["role"] != "assistant":
            continue
        if wire == "anthropic":
            lead = []
            for block in message["content"]:
                if block["type"] not in ("thinking", "redacted_thinking"):
                    break  # reasoning must come first: blocks after other blocks do not count
                lead.append(block)
            out.append(lead)
        else:
            out.append(list(message.get("reasoning_details", [])))
    return out
