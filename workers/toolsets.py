"""Resolve a toolset by import path: "pkg.module:NAME" names a list of ToolSpec, or a callable
returning one. A run names its toolset; it never ships code. Resolved toolsets are cached per process.

In a worker (`for_worker`), a tool's sync `run` / `start` / `wait` runs in a thread: every run of the
process shares one asyncio loop, and a sync tool that blocks would stall all of them.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from toolloop.loop.types import ToolSpec
from workers.errors import ToolsetError

_cache: dict[str, list[ToolSpec]] = {}
_worker_cache: dict[str, list[ToolSpec]] = {}
_lock = threading.Lock()


def resolve(path: str | None) -> list[ToolSpec]:
    """The tools of `path` (None: no tools). Raises `ToolsetError` naming the path and the fix."""
    if path is None:
        return []
    with _lock:
        found = _cache.get(path)
        if found is None:
            found = _cache[path] = _load(path)
        return found


def for_worker(path: str | None) -> list[ToolSpec]:
    """`resolve(path)` with every sync `run`, `start` and `wait` moved off the event loop."""
    if path is None:
        return []
    tools = resolve(path)
    with _lock:
        found = _worker_cache.get(path)
        if found is None:
            found = _worker_cache[path] = [_offloaded(tool) for tool in tools]
        return found


def _offloaded(tool: ToolSpec) -> ToolSpec:
    update = {
        name: _in_thread(fn)
        for name in ("run", "start", "wait")
        if (fn := getattr(tool, name)) is not None and not inspect.iscoroutinefunction(fn)
    }
    return tool.model_copy(update=update) if update else tool


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def run_in_thread(*args: Any) -> Any:
        result = await asyncio.to_thread(fn, *args)
        return await result if inspect.isawaitable(result) else result

    return run_in_thread


def _load(path: str) -> list[ToolSpec]:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ToolsetError(
            f"Cannot import the module of toolset {path!r}: {error}.\n"
            "  Check the path, and that the worker runs where that module can be imported (PYTHONPATH)."
        ) from error
    value: Any = getattr(module, attribute, None)
    if value is None:
        raise ToolsetError(
            f"Module {module_name!r} has no {attribute!r} (toolset {path!r}).\n"
            f"  Define {attribute} in {module_name} as a list of toolloop.ToolSpec."
        )
    if callable(value) and not isinstance(value, list | tuple):
        try:
            value = value()
        except Exception as error:
            raise ToolsetError(
                f"Toolset {path!r} is a function that raised {type(error).__name__}: {error}.\n"
                f"  Make {attribute} a list of toolloop.ToolSpec, or a function (no arguments) returning one."
            ) from error
    if not isinstance(value, list | tuple) or not all(isinstance(tool, ToolSpec) for tool in value):
        raise ToolsetError(
            f"Toolset {path!r} is a {type(value).__name__}, not a list of ToolSpec.\n"
            f"  Make {attribute} a list of toolloop.ToolSpec, or a function returning one."
        )
    names = [tool.name for tool in value]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ToolsetError(
            f"Toolset {path!r} has more than one tool named {', '.join(map(repr, duplicates))}.\n"
            "  Give every tool its own name."
        )
    return list(value)
