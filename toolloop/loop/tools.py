"""Tools as the loop sees them (SPEC.md 2.3, 2.4): definitions, input checks, the loop's own answers.

Every callable a user gives (`run`, `start`, `wait`, `estimate_usd`, `budget.spent`, `generate`'s
helpers) may be sync or async: `call` awaits what needs awaiting and nothing else.

Tool code cannot stop the process that runs the loop: a `BaseException` that is not an `Exception`
raised by a tool's `run`, `start` or `wait` (`SystemExit` from `argparse` or `sys.exit`,
`KeyboardInterrupt`, a `GeneratorExit` that escaped, a sync tool's thread ended by one of them)
becomes `ToolCrashed` (`call_tool`), which the loop answers as a tool error the model reads. What
still goes through unchanged: `asyncio.CancelledError` (cancellation is how a step is stopped), a
`GeneratorExit` thrown into the loop's own coroutine as it is closed, and a `KeyboardInterrupt` or
`SystemExit` raised in the main thread, which may be a signal (Ctrl-C, a handler's `sys.exit`) rather
than the tool: a durable worker runs its loop in a thread of its own, where no signal lands.
A sync tool run in a thread goes through `contained` there: a `GeneratorExit` that reaches the
loop through a future is thrown into the task's outermost coroutine (CPython closes the awaits in
between), so the thread hands it over inside an `Exception`, `Escaped`, which `call_tool` unwraps.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from toolloop.contract import ContentPart, ImagePart, TextPart, ToolDefinition
from toolloop.loop.types import Started, ToolOutput, ToolSpec
from toolloop.stepkey import idempotency_key

_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
"""Keys whose value maps names to schemas: a property named `title` there is kept."""
_DATA = frozenset({"default", "const", "enum", "examples", "example"})
"""Keys whose value is data, not a schema: a `title` key inside is the user's and is kept."""

NO_OUTPUT = "(no output)"

log = logging.getLogger("toolloop.loop")


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async callable and return its result."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


class ToolCrashed(Exception):
    """A tool's `run`, `start` or `wait` raised a `BaseException` that is not an `Exception` (see
    the module docstring). `text` is the tool error the model reads in the call's answer."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class Escaped(Exception):
    """What a sync tool raised in its thread that is not an `Exception`, handed to the loop (`contained`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


def contained(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` for running in a thread of its own (`asyncio.to_thread`): what it raises that is not an
    `Exception` comes out as `Escaped` (no signal lands in a thread that is not the main one)."""

    @functools.wraps(fn)
    def in_its_thread(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            raise
        except BaseException as error:
            raise Escaped(error) from None

    return in_its_thread


async def call_tool(fn: Any, tool: str, call_id: str, *args: Any) -> Any:
    """`call(fn, *args)` for a tool's `run` / `start` / `wait`: what only stops a process becomes
    `ToolCrashed` (logged with the step, which names the run, and the call id)."""
    task = asyncio.current_task()
    try:
        return await call(fn, *args)
    except Escaped as escaped:
        error = escaped.error
    except Exception:
        raise
    except BaseException as raised:
        if not _crash_of_tool(raised, task):
            raise
        error = raised
    log.error(
        "tool %r (call %s, step %s) raised %r, which would stop the process: the call is answered "
        "as a tool error and the run goes on",
        tool,
        call_id,
        idempotency_key() or "-",
        error,
        exc_info=error,
    )
    text = (
        f"Tool {tool!r} failed: it raised {error!r} instead of returning a result. "
        "The call did not complete; try other input, or another way."
    )
    raise ToolCrashed(text) from None


def _crash_of_tool(error: BaseException, task: asyncio.Task[Any] | None) -> bool:
    """True when `error` (not an Exception) is the tool's own, not the caller stopping the loop."""
    if isinstance(error, asyncio.CancelledError):
        return False
    if (
        isinstance(error, BaseExceptionGroup)
        and error.subgroup(asyncio.CancelledError) is not None
    ):
        return False
    if isinstance(
        error, GeneratorExit
    ):  # thrown into our coroutine as it is closed: not the tool's
        return task is not None and asyncio.current_task() is task
    if isinstance(
        error, KeyboardInterrupt | SystemExit
    ):  # the main thread is where signals land
        return threading.current_thread() is not threading.main_thread()
    return True


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
    return ToolOutput(
        value=text, content=[TextPart(text=text)], cost_usd=0.0, is_error=is_error
    )


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


def bounded(
    output: ToolOutput, tool: str, max_bytes: int | None, max_image_bytes: int | None
) -> ToolOutput:
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
                        f"returned the image {name!r} of {size:,} bytes;"
                        f" the limit is {max_image_bytes:,}"
                    )
                    break
    if problem is None:
        return output
    text = f"Tool {tool!r} {problem}. The result was not kept; ask for less (a narrower input)."
    return ToolOutput(
        value=None,
        content=[TextPart(text=text)],
        cost_usd=output.cost_usd,
        rows=output.rows,
        is_error=True,
    )
