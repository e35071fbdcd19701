"""Child runs (SPEC 6.2, docs/children.md): the built-in two-phase tool `spawn` as a toolset lists it,
and what a tree of runs adds to a commit. The tool bound to a durable run (its `start` and `wait`)
is workers/step/children.py.

A toolset that wants it lists `spawn_tool()` among its tools (the operator registers toolsets,
workers/config/toolsets.py; a run never names code); outside a durable worker it answers that it
starts nothing. What a commit adds for a tree (RUN_COMMIT's `Children` payload,
workers/protocol/scripts/commit.py): `ended` (a child's stop or failure: its record in its parent,
its spend in micro-dollars, the parent woken when it was the last open child), `parked` (a child's
question, told to each ancestor) and `wake_message` (the task of the parent a child's end woke).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from toolloop.abort import AbortSignal
from toolloop.contract import TextPart
from toolloop.loop.types import Started, ToolOutput, ToolSpec
from workers.protocol import keys, names, wire
from workers.protocol.scripts.commit import Children

SPAWN_NAME = "spawn"
MICROS = 1_000_000
FINAL_TEXT_CHARS = 4000
"""How much of a child's final text its parent's model reads (and its record holds)."""

DESCRIPTION = (
    "Start child runs that work in parallel, each on its own task, and wait until every one has "
    "finished; you get each child's status, spend and final answer. Give each child a self-contained "
    "prompt. A child's budget comes out of yours: set budget_usd per child, or leave it out for an "
    "even share of what you have left. Put every child you want to run at once in ONE call."
)


class ChildTask(BaseModel):
    """One child of a `spawn` call."""

    prompt: str = Field(
        min_length=1,
        max_length=100_000,
        description="The child's task, self-contained.",
    )
    budget_usd: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Its budget."
    )
    system: str | None = Field(
        default=None, max_length=100_000, description="Its system text."
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=1000, description="Its step limit."
    )


class SpawnInput(BaseModel):
    children: list[ChildTask] = Field(min_length=1, max_length=100)


@dataclass(frozen=True)
class SpawnOptions:
    """What the operator's `spawn_tool(...)` chose: the deepest level a child may be at, and the most
    children one call may start."""

    max_depth: int = 3
    max_children: int = 20


async def _unbound_start(checked: SpawnInput, signal: AbortSignal) -> Started:
    return Started(
        started={
            "refused": "spawn starts child runs of a durable run; this run is not one."
        }
    )


async def _unbound_wait(handle: Any, signal: AbortSignal) -> ToolOutput:
    return refused(str((handle or {}).get("refused") or "spawn started nothing."))


def spawn_tool(
    *,
    max_depth: int = 3,
    max_children: int = 20,
    description: str = DESCRIPTION,
    queue: str | None = None,
) -> ToolSpec:
    """The `spawn` tool, for a toolset's list (`TOOLS = [*MY_TOOLS, spawn_tool()]`). `max_depth`: how
    deep a tree may grow (a root is depth 0; its children 1, ...); `max_children`: the most children
    one call may start. Outside a durable worker it answers that it starts nothing."""
    if not 1 <= max_depth <= 10 or not 1 <= max_children <= 100:
        raise ValueError(
            f"spawn_tool(max_depth={max_depth!r}, max_children={max_children!r}) is out of range.\n"
            "  Use a max_depth from 1 to 10 and a max_children from 1 to 100."
        )

    async def start(checked: SpawnInput, signal: AbortSignal) -> Started:
        return await _unbound_start(checked, signal)

    start.__dict__["toolloop_spawn"] = SpawnOptions(max_depth, max_children)
    return ToolSpec(
        name=SPAWN_NAME,
        description=description,
        schema=SpawnInput,
        start=start,
        wait=_unbound_wait,
        queue=queue,
    )


def options_of(tool: ToolSpec) -> SpawnOptions | None:
    """The spawn options of a `spawn_tool()` (None for any other tool)."""
    found = getattr(tool.start, "toolloop_spawn", None)
    return found if isinstance(found, SpawnOptions) else None


def is_spawn(tool: ToolSpec | None) -> bool:
    return tool is not None and options_of(tool) is not None


def refused(text: str) -> ToolOutput:
    """A spawn wait that has no children to read: its refusal, as the model reads it."""
    return ToolOutput(content=[TextPart(text=text)], is_error=True)


# -- what a commit adds for a tree (workers/step/commit.py) ----------------------------------------


def ended(
    run_id: str, state: dict[str, str], status: str, fields: dict[str, Any]
) -> Children | None:
    """A child's stop or failure: its parent's keys and the child's record (None for a root)."""
    parent = keys.parent_of(run_id)
    call = state.get("call")
    if parent is None or not call:
        return None
    spent = float(fields.get("spent_usd", state.get("spent_usd", 0)) or 0)
    micros = round(spent * MICROS)
    record = {
        "child": run_id,
        "status": status,
        "spent_usd": micros / MICROS,
        "spent_micros": str(micros),
        "final_text": str(fields.get("final_text") or "")[:FINAL_TEXT_CHARS],
    }
    if fields.get("error_message"):
        record["error"] = f"{fields.get('error_class')}: {fields['error_message']}"[
            :FINAL_TEXT_CHARS
        ]
    return Children(
        parent={
            "state": keys.state(parent),
            "children": keys.children(parent),
            "events": keys.events(parent),
            "outbox": keys.outbox(parent),
            "open": f"open:{call}",
            "record": json.dumps(record),
            "micros": str(micros),
        }
    )


def parked(run_id: str, asked: Any) -> Children | None:
    """A child's park on a question: each ancestor's state and events keys, and the event's data."""
    ancestors = []
    parent = keys.parent_of(run_id)
    while parent is not None:
        ancestors.append([keys.state(parent), keys.events(parent)])
        parent = keys.parent_of(parent)
    if not ancestors:
        return None
    return Children(
        ancestors=ancestors, parked_child=json.dumps({"child": run_id, "asked": asked})
    )


def wake_message(
    parent: str, member: str, traceparent: str | None = None
) -> tuple[str, wire.Delivery]:
    """The queue and task message of a parent woken by its last child (outbox member "<n>|<queue>")."""
    n, queue = names.parse_member(member)
    message = wire.task_message(
        names.ADVANCE,
        [parent, n],
        names.step_id(parent, n),
        queue,
        "tool spawn",
        traceparent=traceparent,
    )
    return queue, message
