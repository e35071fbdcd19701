"""Tools as the loop sees them (SPEC.md 2.3, 2.4): definitions, input checks, the loop's own answers.

Every callable a user gives (`run`, `start`, `wait`, `estimate_usd`, `budget.spent`, `generate`'s
helpers) may be sync or async: `call` awaits what needs awaiting and nothing else.
"""

from __future__ import annotations

import inspect
import os
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from toolloop.contract import ContentPart, ImagePart, TextPart, ToolDefinition
from toolloop.loop.types import Started, ToolOutput, ToolSpec

_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
"""Keys whose value maps names to schemas: a property named `title` there is kept."""
_DATA = frozenset({"default", "const", "enum", "examples", "example"})
"""Keys whose value is data, not a schema: a `title` key inside is the user's and is kept."""

NO_OUTPUT = "(no output)"


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async callable and return its result."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


def tool_definitions(tools: list[ToolSpec]) -> list[ToolDefinition]:
    """One definition per tool, in order: the input-side JSON schema without `title` / `$schema`."""
    return [_definition(spec.name, spec.description, spec.schema_) for spec in tools]


@lru_cache(maxsize=512)
def _definition(name: str, description: str, schema: type[BaseModel]) -> ToolDefinition:
    """Cached: a schema class gives the same JSON schema every time, and definitions are frozen."""
    input_schema = _strip_titles(schema.model_json_schema(mode="validation"))
    input_schema.pop("$schema", None)
    return ToolDefinition(name=name, description=description, input_schema=input_schema)


def _strip_titles(node: Any, names: bool = False) -> Any:
    if isinstance(node, dict):
        return {
            key: value
            if not names and key in _DATA
            else _strip_titles(value, not names and key in _SCHEMA_MAPS)
            for key, value in node.items()
            if names or key != "title"
        }
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


def validate_input(spec: ToolSpec, raw: Any) -> BaseModel | str:
    """The validated input, or the loop's text answer `Invalid input for <name>: ...`."""
    try:
        return spec.schema_.model_validate(raw)
    except ValidationError as error:
        return f"Invalid input for {spec.name}: {format_errors(error)}"


def format_errors(error: ValidationError) -> str:
    """One `✖ <message>` line per error, each followed by `  → at <loc>` when it has a location."""
    lines: list[str] = []
    for detail in error.errors(include_url=False, include_input=False):
        lines.append(f"✖ {detail['msg']}")
        if detail["loc"]:
            lines.append("  → at " + ".".join(str(part) for part in detail["loc"]))
    return "\n".join(lines)


def text_answer(text: str, *, is_error: bool = False) -> ToolOutput:
    """An answer the loop gives itself (unknown tool, invalid input, a second ask); `is_error`: the
    call failed (unknown tool, invalid input), and the model's tool result says so."""
    return ToolOutput(value=text, content=[TextPart(text=text)], cost_usd=0.0, is_error=is_error)


def as_output(returned: Any, tool: str) -> ToolOutput:
    """What `run` / `wait` returned, as a `ToolOutput` (a dict in its shape is accepted)."""
    if isinstance(returned, ToolOutput):
        return returned
    if isinstance(returned, dict):
        return ToolOutput.model_validate(returned)
    raise TypeError(
        f"Tool {tool!r} returned {type(returned).__name__}, not a ToolOutput.\n"
        "  Return ToolOutput(value=..., content=[...]) (or a dict in that shape)."
    )


def as_started(returned: Any, tool: str) -> Started:
    """What `start` returned, as a `Started` (a dict in its shape is accepted)."""
    if isinstance(returned, Started):
        return returned
    if isinstance(returned, dict):
        return Started.model_validate(returned)
    raise TypeError(
        f"Tool {tool!r} start returned {type(returned).__name__}, not a Started.\n"
        "  Return Started(started=<JSON-safe handle>) (or a dict in that shape)."
    )


def message_content(output: ToolOutput) -> str | list[ContentPart]:
    """What the model reads for a tool result: its parts, or `(no output)`."""
    return list(output.content) if output.content else NO_OUTPUT


def summary(output: ToolOutput) -> str:
    """The first text part of a tool result, cut to 200 characters (`""` when none)."""
    for part in output.content:
        if isinstance(part, TextPart):
            return part.text[:200]
    return ""


def bounded(output: ToolOutput, tool: str, max_bytes: int | None, max_image_bytes: int | None) -> ToolOutput:
    """`output`, or, when it is larger than `max_bytes` as JSON or carries an image file larger than
    `max_image_bytes`, an error answer for the model in its place (same cost and rows; the oversized
    value is not journaled)."""
    problem = None
    if max_bytes is not None:
        size = len(output.model_dump_json())
        if size > max_bytes:
            problem = f"returned {size:,} bytes; the limit is {max_bytes:,}"
    if problem is None and max_image_bytes is not None:
        for part in output.content:
            if isinstance(part, ImagePart):
                try:
                    size = os.stat(part.path).st_size
                except OSError:
                    continue
                if size > max_image_bytes:
                    name = os.path.basename(part.path)
                    problem = (
                        f"returned the image {name!r} of {size:,} bytes; the limit is {max_image_bytes:,}"
                    )
                    break
    if problem is None:
        return output
    text = f"Tool {tool!r} {problem}. The result was not kept; ask for less (a narrower input)."
    return ToolOutput(
        value=None, content=[TextPart(text=text)], cost_usd=output.cost_usd, rows=output.rows, is_error=True
    )
