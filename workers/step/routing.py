"""Where a run's next step runs and what it says it is: its queue and its label.

Model steps go to `llm`; a tool step to its tool's own queue (`ToolSpec.queue`) or `tools`. The label
(`model 3`, `tool read_frame`) is the step's kwargsrepr, which Flower and `celery inspect` show.
"""

from __future__ import annotations

import json

from toolloop.loop.types import ToolSpec
from workers.process.live import LiveLoop
from workers.protocol import names


def route(live: LiveLoop | None, key: str) -> str:
    """The queue of step `key`: model, compaction, token-count and steer steps on "llm", tool steps
    on the tool's own queue or "tools"."""
    if key.startswith(("model:", "compact:", "count:", "steer:")):
        return names.LLM
    tool = tool_of(live, key)
    return (tool.queue if tool else None) or names.TOOLS


def describe(live: LiveLoop | None, key: str, steps_base: int = 0) -> str:
    """What step `key` is: "model 5" (the run's model step: the turn of its segment past the
    `steps_base` model steps of the segments before, as `toolloop events` numbers it) or "tool
    read_frame" (a registered tool's name; "tool" alone for any other)."""
    if key.startswith("model:"):
        turn = key.removeprefix("model:")
        return f"model {int(turn) + steps_base}" if turn.isdigit() else f"model {turn}"
    if key.startswith("compact:"):
        return f"compact {key.removeprefix('compact:')}"
    if key.startswith("count:"):
        return f"count {key.removeprefix('count:')}"
    if key.startswith("steer:"):
        return "steer"
    if not key.startswith("tool:"):
        return ""
    tool = tool_of(live, key)
    return f"tool {tool.name}" if tool else "tool"


def tool_of(live: LiveLoop | None, key: str) -> ToolSpec | None:
    """The registered tool that step `key` ("tool:<call id>[:start|:wait]") calls, if any."""
    if live is None:
        return None
    call_id = key.removeprefix("tool:")
    if call_id.endswith((":start", ":wait")):
        call_id = call_id.rsplit(":", 1)[0]
    journal = live.journal
    turns = [
        int(k.removeprefix("model:")) for k in journal.entries if k.startswith("model:")
    ]
    if (
        turns
    ):  # the next tool step answers a call of the latest model turn (decoded by replay)
        latest = f"model:{max(turns)}"
        memo = journal.parsed.get(latest)
        value = (
            memo[1]
            if memo is not None
            else json.loads(journal.entries[latest])["value"]
        )
        for call in value["result"].get("tool_calls", []):
            if call["id"] == call_id:
                return live.tools.get(call["name"])
    held = live.held_names.get(call_id)
    return live.tools.get(held) if held is not None else None
