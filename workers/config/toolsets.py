"""Registered toolsets: a run names a toolset the operator registered; it never names code.

The operator's configuration maps names to import paths, and nothing else does:

    TOOLLOOP_TOOLSETS="review=examples.storyboard.tools:REVIEW_TOOLS,agents=app.tools:make_tools"

(`toolloop worker --toolsets ...` sets the same for its worker). A path "pkg.module:NAME" names a
list of ToolSpec, or a callable (no arguments) returning one; "mcp:<http(s) url>" names a
streamable-HTTP MCP server, and TOOLLOOP_TOOLSETS_FILE a YAML file of toolsets that may mix Python
tools and MCP servers (workers/config/mcp.py; the servers' tools: workers/step/mcptools.py).
`Client.enqueue`, the `toolloop` CLI and the web example read only the names (`Registry.check`): a
run naming anything else is refused before anything is imported or connected, and the error lists
the registered names. Only a worker imports, the first time a run names a toolset
(`Registry.for_worker`); a toolset whose import or factory raises (even `SystemExit` or
`KeyboardInterrupt`) fails that run with a `ToolsetError`, never the worker.

In a worker, a tool's sync `run` / `start` / `wait` runs in a thread: every run of the process
shares one asyncio loop, and a sync tool that blocks would stall all of them. What the thread raises
that is not an `Exception` (`SystemExit` from `argparse`, ...) reaches the loop as
`toolloop.loop.tools.Escaped` (`contained`), and the loop answers the call with a tool error.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from toolloop.loop.tools import contained
from toolloop.loop.types import ToolSpec
from workers.config.mcp import FILE_ENV, Toolset, from_entry, is_entry, read_file
from workers.protocol.errors import ToolsetError

ENV = "TOOLLOOP_TOOLSETS"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)


def parse(text: str) -> dict[str, str]:
    """`name=pkg.module:NAME,...` as a mapping; a malformed entry raises `ToolsetError`."""
    found: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, sep, path = (piece.strip() for piece in entry.partition("="))
        if (
            not sep
            or not _NAME.match(name)
            or not (_PATH.match(path) or is_entry(path))
        ):
            raise ToolsetError(
                f"{ENV} has the entry {entry!r}, which is not name=pkg.module:NAME nor name=mcp:<url>.\n"
                f'  Write it as {ENV}="review=examples.storyboard.tools:REVIEW_TOOLS,docs=mcp:http://127.0.0.1:3001/mcp".'
            )
        from_entry(name, path)  # an MCP URL with credentials in it is refused here
        if name in found and found[name] != path:
            raise ToolsetError(
                f"{ENV} registers the toolset {name!r} twice ({found[name]!r} and {path!r}).\n"
                "  Give every toolset its own name."
            )
        found[name] = path
    return found


def registered(entries: Mapping[str, str], file: str = "") -> dict[str, Toolset]:
    """Every registered toolset: TOOLLOOP_TOOLSETS's `entries` (parsed) and TOOLLOOP_TOOLSETS_FILE's
    toolsets. A name registered in both is refused (`ToolsetError`). Nothing is imported or connected."""
    found = {name: from_entry(name, text) for name, text in entries.items()}
    for name, toolset in read_file(file).items():
        if name in found:
            raise ToolsetError(
                f"The toolset {name!r} is registered both in {ENV} and in {FILE_ENV} ({file!r}).\n"
                "  Register every toolset in one place."
            )
        found[name] = toolset
    return found


def names_text(names: Iterable[str]) -> str:
    listed = ", ".join(repr(name) for name in sorted(names))
    return listed or "none"


def not_registered(name: str, names: Iterable[str]) -> ToolsetError:
    """The error for a run that names a toolset that is not registered (no import was tried)."""
    return ToolsetError(
        f"The toolset {name!r} is not registered; the registered toolsets are: {names_text(names)}.\n"
        f"  Name one of them, or register it in the workers' configuration ({ENV}="
        f'"{name if _NAME.match(name) else "name"}=pkg.module:NAME") and give the clients the same.'
    )


def check_name(name: str | None, names: Iterable[str]) -> None:
    """Refuse a toolset name that is not among `names`, importing nothing (None: no tools)."""
    if name is not None and name not in set(names):
        raise not_registered(name, names)


class Registry:
    """The toolsets one process serves: name -> import paths and MCP servers (from the operator's
    configuration), each Python toolset imported at most once, when a run first names it. A
    toolset's MCP tools are not here: a run lists them once and journals them (workers/step/mcptools.py)."""

    def __init__(self, paths: Mapping[str, str], file: str = "") -> None:
        self.paths = dict(paths)
        self.defined = registered(self.paths, file)
        self._tools: dict[str, list[ToolSpec]] = {}
        self._offloaded: dict[str, list[ToolSpec]] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return sorted(self.defined)

    def check(self, name: str | None) -> None:
        check_name(name, self.defined)

    def toolset(self, name: str) -> Toolset:
        self.check(name)
        return self.defined[name]

    def resolve(self, name: str | None) -> list[ToolSpec]:
        """The Python tools of toolset `name` (None: no tools); `ToolsetError` naming it and the fix."""
        if name is None:
            return []
        toolset = self.toolset(name)
        with self._lock:
            found = self._tools.get(name)
            if found is None:
                found = self._tools[name] = _joined(
                    name, [load(path, name) for path in toolset.python]
                )
            return found

    def for_worker(self, name: str | None) -> list[ToolSpec]:
        """`resolve(name)` with every sync `run`, `start` and `wait` moved off the event loop."""
        if name is None:
            return []
        tools = self.resolve(name)
        with self._lock:
            found = self._offloaded.get(name)
            if found is None:
                found = self._offloaded[name] = [_offloaded(tool) for tool in tools]
            return found


def _joined(name: str, lists: list[list[ToolSpec]]) -> list[ToolSpec]:
    tools = [tool for listed in lists for tool in listed]
    names = [tool.name for tool in tools]
    duplicates = sorted({one for one in names if names.count(one) > 1})
    if duplicates:
        raise ToolsetError(
            f"Toolset {name!r} has more than one tool named {', '.join(map(repr, duplicates))}.\n"
            "  Give every tool its own name."
        )
    return tools


def _offloaded(tool: ToolSpec) -> ToolSpec:
    update = {
        name: _in_thread(fn)
        for name in ("run", "start", "wait")
        if (fn := getattr(tool, name)) is not None
        and not inspect.iscoroutinefunction(fn)
    }
    return tool.model_copy(update=update) if update else tool


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    in_thread = contained(fn)

    @functools.wraps(fn)
    async def run_in_thread(*args: Any) -> Any:
        result = await asyncio.to_thread(in_thread, *args)
        return await result if inspect.isawaitable(result) else result

    return run_in_thread


def load(path: str, name: str | None = None) -> list[ToolSpec]:
    """Import the toolset at `path` (an operator-configured path, never a run's input). Anything
    its import or factory raises, `BaseException` included, becomes a `ToolsetError`."""
    label = f"{name!r} ({path!r})" if name else repr(path)
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ToolsetError(
            f"Cannot import the module of toolset {label}: {error}.\n"
            "  Check the path, and that the worker runs where that module can be imported (PYTHONPATH)."
        ) from error
    except (
        BaseException
    ) as error:  # SystemExit, KeyboardInterrupt, ...: the run fails, not the worker
        raise ToolsetError(
            f"Importing the module of toolset {label} raised {type(error).__name__}: {error}.\n"
            f"  Fix the module {module_name!r} so that it imports without raising."
        ) from None
    value: Any = getattr(module, attribute, None)
    if value is None:
        raise ToolsetError(
            f"Module {module_name!r} has no {attribute!r} (toolset {label}).\n"
            f"  Define {attribute} in {module_name} as a list of toolloop.ToolSpec."
        )
    if callable(value) and not isinstance(value, list | tuple):
        try:
            value = value()
        except BaseException as error:
            raise ToolsetError(
                f"Toolset {label} is a function that raised {type(error).__name__}: {error}.\n"
                f"  Make {attribute} a list of toolloop.ToolSpec, or a function (no arguments) returning one."
            ) from None
    if not isinstance(value, list | tuple) or not all(
        isinstance(tool, ToolSpec) for tool in value
    ):
        raise ToolsetError(
            f"Toolset {label} is a {type(value).__name__}, not a list of ToolSpec.\n"
            f"  Make {attribute} a list of toolloop.ToolSpec, or a function returning one."
        )
    names = [tool.name for tool in value]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ToolsetError(
            f"Toolset {label} has more than one tool named {', '.join(map(repr, duplicates))}.\n"
            "  Give every tool its own name."
        )
    return list(value)
