"""Helpers of the reasoning tests: what the simulator emitted versus what a request sent back
(toolloop/sim/thinking.py)."""

from __future__ import annotations

from typing import Any

from toolloop.sim import SimRequest, SimTurn, thinking


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
