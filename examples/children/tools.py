"""A toolset with the built-in `spawn` (docs/children.md): a planner that hands work to child runs.

    TOOLLOOP_TOOLSETS=tree=examples.children.tools:TOOLS

`spawn_tool()` is what a toolset lists to let its runs start child runs (each child runs with the
same toolset, one level deeper, up to `max_depth`); `note` is a cheap tool a child may call, and
`ask` lets a child ask the person a question (answered through the root's id).
"""

from __future__ import annotations

from pydantic import BaseModel

from toolloop import AbortSignal, TextPart, ToolOutput, ToolSpec
from workers.runs.children import spawn_tool


class NoteInput(BaseModel):
    text: str


class AskInput(BaseModel):
    question: str


def note(input: NoteInput, signal: AbortSignal) -> ToolOutput:
    return ToolOutput(content=[TextPart(text=f"Noted: {input.text[:200]}")])


TOOLS = [
    spawn_tool(max_depth=3, max_children=20),
    ToolSpec(name="note", description="Write a note.", schema=NoteInput, run=note),
    ToolSpec(name="ask", description="Ask the person one question.", schema=AskInput),
]
