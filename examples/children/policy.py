"""The simulated model of examples/children (a `toolloop.sim` policy): a planner that fans work out
to child runs over `spawn`, read from each run's first user message.

    "fan=4,4,5 Review the cut."   spawn 4 children, each told "fan=4,5 Review the cut." (so a tree
                                  of 4 + 16 + 80 = 100 children in 3 levels); once they have
                                  finished, answer with what they said
    "Review the cut."             a leaf: answer at once
    "ask ..."                     a leaf that asks the person first, then answers "You said: ..."
    "spin ..."                    a leaf that calls `note` turn after turn (until its budget stops it)
    "slow=0.5 ..."                every answer of a leaf takes 0.5 s longer
    "budget=0.02 ..."             each child spawned asks for a budget of $0.02 (else an even share)

It answers from the request alone (the history), so a replayed or retried request gets the same turn.
"""

from __future__ import annotations

import re

from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.sim.script import SimRequest, SimToolCall, SimTurn

_FAN = re.compile(r"\bfan=([\d,]+)\s*")
_SLOW = re.compile(r"\bslow=([\d.]+)")
_BUDGET = re.compile(r"\bbudget=([\d.]+)\s*")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(getattr(part, "text", "") for part in content or [])  # type: ignore[attr-defined]


def tree_policy(request: SimRequest) -> SimTurn:
    first = next((m for m in request.messages if isinstance(m, UserMessage)), None)
    prompt = _text(first.content) if first is not None else ""
    slow = float(found.group(1)) if (found := _SLOW.search(prompt)) else 0.0
    last = request.messages[-1] if request.messages else None
    fan = _FAN.search(prompt)
    if fan is not None:
        if isinstance(last, ToolMessage):
            return SimTurn(text=f"Collected: {_text(last.content).splitlines()[0]}")
        counts = [int(n) for n in fan.group(1).split(",") if n]
        rest = ",".join(str(n) for n in counts[1:])
        task = _BUDGET.sub("", _FAN.sub("", prompt))
        child = f"fan={rest} {task}" if rest else task
        children: list[dict[str, object]] = [
            {"prompt": f"{child} (part {i + 1})"} for i in range(counts[0])
        ]
        if (budget := _BUDGET.search(prompt)) is not None:
            children = [
                {**one, "budget_usd": float(budget.group(1))} for one in children
            ]
        return SimTurn(
            text=f"Splitting into {counts[0]}.",
            tool_calls=[SimToolCall(name="spawn", input={"children": children})],
        )
    turns = sum(isinstance(m, AssistantMessage) for m in request.messages)
    if prompt.startswith("spin"):
        return SimTurn(
            text=f"Note {turns + 1}.",
            latency_s=slow,
            tool_calls=[SimToolCall(name="note", input={"text": f"step {turns + 1}"})],
        )
    if prompt.startswith("ask"):
        if isinstance(last, ToolMessage):
            return SimTurn(text=f"You said: {_text(last.content)}", latency_s=slow)
        return SimTurn(
            text="One question.",
            latency_s=slow,
            tool_calls=[
                SimToolCall(name="ask", input={"question": f"Which take for {prompt}?"})
            ],
        )
    return SimTurn(text=f"Done: {prompt}", latency_s=slow)
