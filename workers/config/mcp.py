"""MCP servers registered as toolsets: what the operator's configuration says, read without connecting.

Two places register a server, both operator configuration (a run only ever names a toolset):

    TOOLLOOP_TOOLSETS="docs=mcp:http://127.0.0.1:3001/mcp,review=examples.storyboard.tools:REVIEW_TOOLS"

registers a streamable-HTTP server as the toolset `docs` (workers/config/toolsets.py parses the entry), and a
YAML file named by TOOLLOOP_TOOLSETS_FILE registers servers with more settings, and toolsets that mix
Python tools and servers:

    everything:
      mcp:
        command: ["npx", "-y", "@modelcontextprotocol/server-everything"]
    docs:
      python: app.tools:DOC_TOOLS          # optional: Python tools beside the server's
      mcp:
        url: "https://docs.example.com/mcp"
        headers: {Authorization: "Bearer ${DOCS_TOKEN}"}
        timeout_s: 30
        needs_approval: [delete_page]     # by name; or approve_destructive: true (destructiveHint)

`mcp` is one server or a list of them. `${VAR}` in `headers`, `env`, `url` or `command` is kept as
written here; only a worker, when it connects (`expand`), reads VAR from its own environment, so the
value never reaches a run spec, the journal, events, logs or Flower. Nothing here imports code or
opens a connection: clients read the names (`Toolset`) to refuse a run naming anything else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from workers.protocol.errors import ToolsetError

FILE_ENV = "TOOLLOOP_TOOLSETS_FILE"
URL_SCHEME = "mcp:"
DEFAULT_TIMEOUT_S = 30.0
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
_SERVER_KEYS = frozenset(
    {
        "url",
        "command",
        "headers",
        "env",
        "timeout_s",
        "needs_approval",
        "approve_destructive",
        "name",
    }
)


@dataclass(frozen=True)
class McpServer:
    """One registered server. `label`: how errors and `toolloop tools` name it ("docs", "docs#2").
    `headers` and `env` are as written (with `${VAR}`): `expand` fills them in, in a worker only."""

    label: str
    url: str | None = None
    command: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    needs_approval: frozenset[str] = frozenset()
    approve_destructive: bool = False

    @property
    def where(self) -> str:
        """The server as logs and errors may name it: its URL (no credentials) or its command."""
        return self.url if self.url is not None else " ".join(self.command)


@dataclass(frozen=True)
class Toolset:
    """A registered toolset: Python tool paths ("pkg.module:NAME") and MCP servers, in order."""

    python: tuple[str, ...] = ()
    servers: tuple[McpServer, ...] = field(default_factory=tuple)


def from_entry(name: str, text: str) -> Toolset:
    """The toolset of one TOOLLOOP_TOOLSETS entry's value: "pkg.module:NAME" or "mcp:<http(s) url>"."""
    if text.startswith(URL_SCHEME):
        url = text[len(URL_SCHEME) :]
        return Toolset(
            servers=(McpServer(label=name, url=_url(url, f"toolset {name!r}")),)
        )
    return Toolset(python=(text,))


def is_entry(text: str) -> bool:
    """True when `text` is a TOOLLOOP_TOOLSETS value this module reads ("mcp:http://...")."""
    return text.startswith(URL_SCHEME) and text[len(URL_SCHEME) :].startswith(
        ("http://", "https://")
    )


def read_file(path: str) -> dict[str, Toolset]:
    """The toolsets of the YAML file at `path` ("" : none); `ToolsetError` saying what to fix."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
    except OSError as error:
        raise ToolsetError(
            f"{FILE_ENV} names {path!r}, which cannot be read: {error.strerror or error}.\n"
            f"  Point {FILE_ENV} at a readable YAML file of toolsets, or unset it."
        ) from None
    except yaml.YAMLError as error:
        raise ToolsetError(
            f"{FILE_ENV} names {path!r}, which is not valid YAML ({_first_line(error)}).\n"
            "  Fix the file: a mapping of toolset names, each with `mcp:` and/or `python:`."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ToolsetError(
            f"{FILE_ENV} ({path!r}) holds a {type(data).__name__}, not a mapping of toolset names.\n"
            "  Write it as `name: {mcp: {command: [...]}}` (see docs/mcp.md)."
        )
    return {str(name): _toolset(str(name), body, path) for name, body in data.items()}


def _first_line(error: Exception) -> str:
    return (
        str(error).strip().splitlines()[0]
        if str(error).strip()
        else type(error).__name__
    )


def _toolset(name: str, body: Any, path: str) -> Toolset:
    where = f"toolset {name!r} of {path!r}"
    if not _NAME.match(name):
        raise ToolsetError(
            f"{FILE_ENV} ({path!r}) names a toolset {name!r}, which is not a plain name.\n"
            "  Use letters, digits, '_', '.', '-' (at most 64), starting with a letter or digit."
        )
    if not isinstance(body, dict) or not body or set(body) - {"mcp", "python"}:
        raise ToolsetError(
            f"The {where} is not a mapping with `mcp:` and/or `python:`.\n"
            "  Write `mcp: {url: ...}` or `mcp: {command: [...]}`, and `python: pkg.module:NAME` "
            "for Python tools."
        )
    python = body.get("python", [])
    python = [python] if isinstance(python, str) else python
    if not isinstance(python, list) or not all(
        isinstance(p, str) and _PATH.match(p) for p in python
    ):
        raise ToolsetError(
            f"The {where} has `python: {python!r}`, which is not pkg.module:NAME (or a list of them).\n"
            "  Name the list of ToolSpec (or the function returning one) as pkg.module:NAME."
        )
    servers = body.get("mcp", [])
    servers = [servers] if isinstance(servers, dict) else servers
    if not isinstance(servers, list):
        raise ToolsetError(
            f"The {where} has an `mcp:` that is neither a server nor a list of servers.\n"
            "  Write `mcp: {url: ...}`, `mcp: {command: [...]}`, or a list of those."
        )
    labels = [
        name if len(servers) == 1 else f"{name}#{i + 1}" for i in range(len(servers))
    ]
    return Toolset(
        python=tuple(python),
        servers=tuple(
            _server(label, raw, f"{where}")
            for label, raw in zip(labels, servers, strict=True)
        ),
    )


def _server(label: str, raw: Any, where: str) -> McpServer:
    if not isinstance(raw, dict) or set(raw) - _SERVER_KEYS:
        extra = sorted(set(raw) - _SERVER_KEYS) if isinstance(raw, dict) else []
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} is not a mapping of known keys"
            f"{' (unknown: ' + ', '.join(map(repr, extra)) + ')' if extra else ''}.\n"
            f"  Use {', '.join(sorted(_SERVER_KEYS))}."
        )
    url, command = raw.get("url"), raw.get("command")
    if (url is None) == (command is None):
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} needs exactly one of `url` and `command`.\n"
            '  Write `url: "http://127.0.0.1:3001/mcp"` (streamable HTTP) '
            'or `command: ["npx", "server"]` (stdio).'
        )
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(c, str) for c in command)
    ):
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} has `command: {command!r}`, not a list of strings.\n"
            '  Write it as a list: `command: ["node", "server.js", "stdio"]`.'
        )
    timeout = raw.get("timeout_s", DEFAULT_TIMEOUT_S)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= 3600
    ):
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} has `timeout_s: {timeout!r}`.\n"
            "  Give seconds above 0 and at most 3600."
        )
    approval = raw.get("needs_approval", [])
    if not isinstance(approval, list) or not all(isinstance(a, str) for a in approval):
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} has `needs_approval: {approval!r}`.\n"
            "  Give a list of the server's tool names whose calls wait for a person's decision."
        )
    return McpServer(
        label=label,
        url=None
        if url is None
        else _url(str(url), f"the MCP server {label!r} of the {where}"),
        command=tuple(command or ()),
        headers=_pairs(raw.get("headers"), "headers", label, where),
        env=_pairs(raw.get("env"), "env", label, where),
        timeout_s=float(timeout),
        needs_approval=frozenset(approval),
        approve_destructive=bool(raw.get("approve_destructive", False)),
    )


def _pairs(raw: Any, key: str, label: str, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(
        isinstance(v, str | int | float) for v in raw.values()
    ):
        raise ToolsetError(
            f"The MCP server {label!r} of the {where} has `{key}:` that is not a mapping of strings.\n"
            f'  Write `{key}: {{Name: "value"}}`; take secrets from the worker\'s environment as "${{VAR}}".'
        )
    return tuple((str(k), str(v)) for k, v in raw.items())


def _url(url: str, where: str) -> str:
    if not url.startswith(("http://", "https://")) or len(url) < 10:
        raise ToolsetError(
            f"The MCP URL {url!r} of {where} is not an http(s) URL.\n"
            "  Give the server's streamable-HTTP endpoint, e.g. mcp:http://127.0.0.1:3001/mcp."
        )
    if "@" in url.split("//", 1)[1].split("/", 1)[0]:
        raise ToolsetError(
            f"The MCP URL of {where} carries credentials in it.\n"
            '  Put them in `headers` as "${VAR}" (TOOLLOOP_TOOLSETS_FILE), '
            "read from the worker's environment."
        )
    return url


def expand(
    text: str, environ: Mapping[str, str] | None = None, *, label: str = ""
) -> str:
    """`text` with each `${VAR}` replaced by VAR from the worker's environment; a VAR that is not set
    raises `ToolsetError` naming VAR (never its value)."""
    environ = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ToolsetError(
                f"The MCP server {label!r} needs ${{{name}}}, which is not set in the worker's environment.\n"
                f"  Set {name} for the worker process (never in a run spec)."
            )
        return environ[name]

    return _VAR.sub(value, text)


def secrets_of(
    server: McpServer, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The values `${VAR}` expands to for `server` (for tests and scrubbing; never logged)."""
    environ = os.environ if environ is None else environ
    texts = [v for _, v in server.headers] + [v for _, v in server.env]
    names = {m.group(1) for text in texts for m in _VAR.finditer(text)}
    return [environ[name] for name in sorted(names) if environ.get(name)]
