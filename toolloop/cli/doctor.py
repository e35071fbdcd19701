"""`toolloop doctor`: check what a deployment depends on, with the workers' own settings.

- Redis answers, connecting exactly as the workers do (the URL's user, password and TLS);
- Redis keeps what it is given: `maxmemory` set (without it Redis grows until the OS kills it),
  AOF on (`appendonly yes`), and `maxmemory-policy noeviction` (an evicted journal or queue key is
  silent data loss);
- the registered toolsets (TOOLLOOP_TOOLSETS, TOOLLOOP_TOOLSETS_FILE): each Python toolset is
  imported, as a worker would, and each MCP server is asked for its tools (`tools/list`);
- the rejected list (toolloop:rejected): how many messages it holds.

Each line starts with `ok`, `warn` or `error`; the exit status is 1 when any check is an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import redis

from toolloop import defaults, redisurl
from toolloop.cli.errors import redact
from workers.config import toolsets
from workers.config.settings import Settings
from workers.protocol import keys


def add_command(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check Redis (auth, TLS, maxmemory, AOF, eviction) and the toolsets",
    )
    doctor.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    errors = 0

    def say(level: str, text: str) -> None:
        nonlocal errors
        errors += level == "error"
        print(f"{level:<5} {text}")

    try:
        url = defaults.redis_url(start=False).url
    except defaults.DefaultsError as error:
        say("error", str(error).splitlines()[0])
        url = None
    if url is not None:
        problem = defaults.redis_problem(url)
        if problem is not None:
            say("error", f"Redis at {redact(url)}: {problem}")
        else:
            say(
                "ok",
                f"Redis at {redact(url)} answers (with the URL's credentials and TLS)",
            )
            errors += check_config(url, say)
    check_toolsets(say)
    return 1 if errors else 0


def check_toolsets(say: Any) -> None:
    """Import each registered Python toolset and ask each MCP server for its tools."""
    try:
        settings = Settings.from_env()
        registered = toolsets.registered(settings.toolsets, settings.toolsets_file)
    except ValueError as error:
        say("error", str(error).splitlines()[0])
        registered = {}
    if not registered:
        say(
            "warn",
            "no toolsets are registered (TOOLLOOP_TOOLSETS): every run naming one is refused",
        )
        return
    if (
        os.getcwd() not in sys.path
    ):  # as a worker started here imports (its PYTHONPATH has the cwd)
        sys.path.insert(0, os.getcwd())
    # the MCP SDK: ~0.6 s of imports, for the MCP checks only
    from workers.process.mcpservers import (
        probe,
    )

    for name, toolset in sorted(registered.items()):
        for path in toolset.python:
            try:
                tools = toolsets.load(path, name)
            except ValueError as error:
                say("error", f"toolset {name!r}: {str(error).splitlines()[0]}")
            else:
                listed = ", ".join(tool.name for tool in tools) or "no tools"
                say("ok", f"toolset {name!r} = {path} ({listed})")
        servers = list(toolset.servers)
        for server, answer in zip(servers, asyncio.run(probe(servers)), strict=True):
            if isinstance(answer, Exception):
                say("error", f"toolset {name!r}: {str(answer).splitlines()[0]}")
            else:
                listed = ", ".join(tool.name for tool in answer[:8]) + (
                    ", ..." if len(answer) > 8 else ""
                )
                say(
                    "ok",
                    f"toolset {name!r}: MCP server {server.where} answers ({len(answer)} tools: {listed})",
                )


def check_config(url: str, say: Any) -> int:
    """Warn about Redis settings that can lose or refuse work; 0 (the errors it found: none)."""
    client = redisurl.sync_client(url, decode_responses=True, socket_timeout=5)
    try:
        try:
            config: dict[str, str] = {}
            for name in ("maxmemory", "maxmemory-policy", "appendonly"):
                config.update(client.config_get(name))  # type: ignore[arg-type]
        except redis.RedisError as error:
            say(
                "warn",
                f"cannot read Redis CONFIG ({error}); check maxmemory, AOF and eviction by hand",
            )
        else:
            if config.get("maxmemory", "0") == "0":
                say(
                    "warn",
                    "Redis has no maxmemory: it grows until the OS kills it; set maxmemory "
                    "(and watch used_memory)",
                )
            else:
                say("ok", f"maxmemory {int(config['maxmemory']):,} bytes")
            if config.get("appendonly") != "yes":
                say(
                    "warn",
                    "Redis runs without AOF (appendonly no): a restart can lose journal steps "
                    "and queued tasks; set appendonly yes, appendfsync everysec",
                )
            else:
                say("ok", "AOF on (appendonly yes)")
            policy = config.get("maxmemory-policy")
            if policy != "noeviction":
                say(
                    "warn",
                    f"maxmemory-policy is {policy}: Redis may evict a journal or a queue "
                    "silently; set maxmemory-policy noeviction",
                )
            else:
                say("ok", "maxmemory-policy noeviction")
        rejected = int(client.llen(keys.REJECTED))
        if rejected:
            say(
                "warn",
                f"{rejected} messages in the rejected list {keys.REJECTED} "
                f"(inspect: redis-cli LRANGE {keys.REJECTED} 0 9; clear: DEL {keys.REJECTED})",
            )
        else:
            say("ok", f"no rejected messages ({keys.REJECTED})")
    finally:
        client.close()
    return 0
