"""Run shapes of the fault suite: what the simulated model does in each run, drawn from a seed.

A shape is a list of tool turns (each one or more calls, in parallel: one-phase `note`, two-phase
`render`, `ask`) followed by a final text. Every call's input carries a `tag` unique in the suite
(`<run tag>.<turn>.<position>`), so the tools can log which call ran, and every model request is
known by `<run tag>#<turn>` (turn = assistant messages in its history, as the simulator counts).
The simulator policy (faults.policy) answers each request from its run's shape.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Need = Literal["note", "render", "ask"] | None

_FIRST = "fault run {tag}: review the storyboard."
_TAG = re.compile(r"^fault run (\S+): ")


@dataclass(frozen=True)
class Call:
    tool: Literal["note", "render", "ask", "slow", "vigil"]
    input: dict[str, Any]

    @property
    def tag(self) -> str:
        return str(self.input.get("tag", ""))


@dataclass(frozen=True)
class Shape:
    tag: str
    turns: tuple[tuple[Call, ...], ...]
    final: str = ""
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def first_message(self) -> str:
        return _FIRST.format(tag=self.tag)

    @property
    def model_turns(self) -> int:
        return len(self.turns) + 1

    @property
    def asks(self) -> int:
        return sum(1 for turn in self.turns if any(call.tool == "ask" for call in turn))

    def calls(self, tool: str) -> list[Call]:
        return [call for turn in self.turns for call in turn if call.tool == tool]

    def sim_turn(
        self, index: int, attempt: int = 1, wire: str = "anthropic", faults: bool = True
    ) -> dict[str, Any]:
        """The simulator's answer to model turn `index` (0-based), the `attempt`-th time it is asked.

        With `faults`, `extra` may add: `faults: {turn: SimFault dict}` (served by the simulator, which
        counts its `times`), `raw_once: [turn, ...]` (the first attempt's first call has arguments
        that are not JSON), `raw: {turn: text}` (the first call's arguments are always this text),
        `refuse: {wire: status}` (every request on that wire is refused)."""
        if index < len(self.turns):
            calls = [
                {"name": call.tool, "input": call.input} for call in self.turns[index]
            ]
            answer = {
                "text": f"Turn {index} of {self.tag}.",
                "tool_calls": calls,
                "latency_s": self.latency_s,
            }
        else:
            answer = {
                "text": self.final or f"Done with {self.tag}.",
                "latency_s": self.latency_s,
            }
        if not faults:
            return answer
        refuse = self.extra.get("refuse", {}).get(wire)
        if refuse:
            return {
                **answer,
                "fault": {"kind": "error", "status": refuse, "times": None},
            }
        fault = self.extra.get("faults", {}).get(index)
        if fault:
            answer["fault"] = fault
        raw = self.extra.get("raw", {}).get(index)
        if raw is not None and answer.get("tool_calls"):
            answer["tool_calls"] = [
                {**answer["tool_calls"][0], "raw_arguments": raw},
                *answer["tool_calls"][1:],
            ]
        if (
            index in self.extra.get("raw_once", ())
            and attempt == 1
            and answer.get("tool_calls")
        ):
            first = dict(answer["tool_calls"][0])
            first["raw_arguments"] = (
                '{"tag": "' + first["input"].get("tag", "") + '", "text": oops'
            )
            answer["tool_calls"] = [first, *answer["tool_calls"][1:]]
        return answer

    def answer_for(self, question: str) -> str:
        return f"Yes, go on ({self.tag}; you asked {question!r})."


def first_text(messages: Sequence[Any] | None) -> str:
    """The text of the first message of a conversation (string content or its text parts)."""
    if not messages:
        return ""
    content = getattr(messages[0], "content", "")
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content or [])


def run_tag(first_message: str) -> str | None:
    """The run tag in a run's first user message, or None when it is not a fault-suite run."""
    match = _TAG.match(first_message)
    return match.group(1) if match else None


def make_shape(
    tag: str,
    rng: random.Random,
    need: Need = None,
    max_turns: int = 4,
    min_turns: int = 1,
) -> Shape:
    """A random shape of `min_turns` to `max_turns` tool turns that contains at least one call of
    the `need`ed kind."""
    turns: list[tuple[Call, ...]] = []
    count = rng.randint(min_turns, max_turns)
    needed_at = rng.randrange(count)
    asked = False
    for index in range(count):
        kinds = [
            rng.choice(["note", "note", "render"])
            for _ in range(rng.choice([1, 1, 2, 3]))
        ]
        if index == needed_at and need is not None and need not in kinds:
            kinds[rng.randrange(len(kinds))] = need
        if not asked and "ask" not in kinds and need is None and rng.random() < 0.2:
            kinds.append("ask")
        if kinds.count("ask") > 1:
            kinds = [kind for kind in kinds if kind != "ask"] + ["ask"]
        asked = asked or "ask" in kinds
        turns.append(
            tuple(
                _call(kind, f"{tag}.{index}.{position}", rng)
                for position, kind in enumerate(kinds)
            )
        )
    return Shape(
        tag=tag, turns=tuple(turns), final=f"All {count} turns of {tag} reviewed."
    )


def _call(kind: str, call_tag: str, rng: random.Random) -> Call:
    if kind == "note":
        return Call(
            "note", {"tag": call_tag, "text": f"shot {rng.randint(1, 9)} looks fine"}
        )
    if kind == "render":
        return Call("render", {"tag": call_tag, "frames": rng.randint(1, 48)})
    if kind == "ask":
        return Call("ask", {"question": f"Shall I go on with {call_tag}?"})
    raise ValueError(f"unknown call kind {kind!r}")
