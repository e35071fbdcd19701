"""The process commands: `worker` (a Celery worker with the right pool and queues) and `sim` (the
provider simulator). `start_worker` and `stop` are also what `toolloop demo` uses."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from toolloop import defaults
from toolloop.cli.commands import SHARDS_ENV, connect
from toolloop.cli.errors import CliError
from toolloop.providers.models_file import catalog_from_env
from workers.config import mcp as mcpconfig
from workers.config import toolsets

QUEUES = "llm,tools,control"
"""Every queue a durable run uses (model steps, tool steps, answers and cancels)."""


def worker_argv(
    concurrency: int = 8,
    queues: str = QUEUES,
    loglevel: str = "INFO",
    steps_in_flight: int = 500,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "worker",
        "-P",
        "threads",
        "-c",
        str(concurrency),
        "-Q",
        queues,
        "--steps-in-flight",
        str(steps_in_flight),
        "-E",
        "--without-gossip",
        "--without-mingle",
        "-l",
        loglevel,
        "-n",
        f"toolloop-{os.getpid()}@%h",
    ]


def worker_env(
    redis_url: str,
    extra: Mapping[str, str] | None = None,
    pythonpath: Sequence[str] = (),
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env["REDIS_URL"] = redis_url
    paths = [
        *pythonpath,
        os.getcwd(),
        *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def start_worker(
    redis_url: str,
    *,
    extra_env: Mapping[str, str] | None = None,
    pythonpath: Sequence[str] = (),
    log: IO[bytes] | None = None,
    concurrency: int = 8,
    loglevel: str = "INFO",
) -> subprocess.Popen[bytes]:
    """A worker subprocess in its own process group (so `stop` ends its threads and children too)."""
    return subprocess.Popen(
        worker_argv(concurrency, loglevel=loglevel),
        env=worker_env(redis_url, extra_env, pythonpath),
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
        start_new_session=True,
    )


def stop(process: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM (a warm shutdown: running steps finish), then SIGKILL of its process group."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)
    except ProcessLookupError:
        process.wait(timeout=5)


def start_simulator(script: Any = None, *, latency_s: float = 0.0) -> Any:
    """The provider simulator on a free loopback port, in this process (a server thread). `script`:
    a policy, a list of turns or a script file; None answers every request with the end of script."""
    # the ASGI simulator: loaded only when it is started
    from toolloop.sim import (
        Script,
        SimServer,
    )

    return SimServer(
        Script([]) if script is None else script, latency_s=latency_s
    ).start()


def load_policy(path: str) -> Any:
    """A simulator policy by import path, "pkg.module:NAME" (imported from the working directory)."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        policy = (
            getattr(importlib.import_module(module_name), attribute, None)
            if attribute
            else None
        )
    except ImportError as error:
        raise CliError(
            f"Cannot import the policy module {module_name!r}: {error}.\n  Check the path."
        ) from None
    if not callable(policy):
        raise CliError(
            f"The simulator policy {path!r} is not a callable.\n"
            '  Name a function (SimRequest) -> SimTurn as "pkg.module:NAME".'
        )
    return policy


def add_commands(sub: Any) -> None:
    worker = sub.add_parser(
        "worker", help="start a worker (every toolloop queue; see docs/workers.md)"
    )
    worker.add_argument(
        "-n",
        "--steps-in-flight",
        type=int,
        default=500,
        help="most llm/tools steps run at once on the worker's asyncio loop (default 500)",
    )
    worker.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=8,
        help="threads of the pool for control tasks (default 8)",
    )
    worker.add_argument(
        "-Q", "--queues", default=QUEUES, help=f"queues to consume (default {QUEUES})"
    )
    worker.add_argument("-l", "--loglevel", default="INFO")
    worker.add_argument(
        "--toolsets",
        help='the toolsets the worker serves, "name=pkg.module:NAME,..." (default: TOOLLOOP_TOOLSETS)',
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port, /metrics (default: TOOLLOOP_METRICS_PORT; off)",
    )
    worker.add_argument(
        "--sim-script",
        type=Path,
        help="turns file for the simulator (when no provider key)",
    )
    worker.add_argument("--sim-policy", help='or a policy for it, "pkg.module:NAME"')
    worker.set_defaults(handler=cmd_worker)
    sim = sub.add_parser(
        "sim", help="run the provider simulator (`toolloop sim --help`)", add_help=False
    )
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    sim.set_defaults(handler=cmd_sim)


def cmd_worker(args: argparse.Namespace) -> int:
    extra: dict[str, str] = {}
    if args.toolsets is not None:  # checked before anything starts
        try:
            toolsets.parse(args.toolsets)
        except ValueError as error:
            raise CliError(
                str(error).replace("TOOLLOOP_TOOLSETS has", "--toolsets has")
            ) from None
        extra["TOOLLOOP_TOOLSETS"] = args.toolsets
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port <= 65535:
            raise CliError(
                f"--metrics-port must be a port number 1-65535 (0: off), not {args.metrics_port}."
            )
        extra["TOOLLOOP_METRICS_PORT"] = str(args.metrics_port)
    try:  # a bad operator file is refused before anything starts
        catalog_from_env()
    except ValueError as error:
        raise CliError(str(error)) from None
    if (
        os.environ.get(SHARDS_ENV, "").strip()
        and not os.environ.get("REDIS_URL", "").strip()
    ):
        raise CliError(
            f"{SHARDS_ENV} is set and REDIS_URL is not: a worker serves one shard.\n"
            "  Start a worker per shard with that shard's URL: REDIS_URL=redis://... toolloop worker."
        )
    _, choice = connect()
    server = None
    if not defaults.has_provider_key():
        script = load_policy(args.sim_policy) if args.sim_policy else args.sim_script
        server = start_simulator(str(script) if isinstance(script, Path) else script)
        extra.update(defaults.simulated_provider_env(server.base_url))
        print(
            f"No ANTHROPIC_API_KEY or FAL_KEY: the worker talks to the simulator at {server.base_url}."
        )
    served = extra.get(
        "TOOLLOOP_TOOLSETS", os.environ.get("TOOLLOOP_TOOLSETS", "")
    ).strip()
    listed = [
        entry.split("=")[0].strip() for entry in served.split(",") if entry.strip()
    ]
    try:  # and the MCP servers and toolsets of TOOLLOOP_TOOLSETS_FILE (read, not connected)
        listed += sorted(
            mcpconfig.read_file(os.environ.get("TOOLLOOP_TOOLSETS_FILE", "").strip())
        )
    except ValueError as error:
        raise CliError(str(error)) from None
    names = ", ".join(listed)
    print(
        f"Worker on {'the embedded Redis' if choice.embedded else 'REDIS_URL'}, queues {args.queues}, "
        f"toolsets: {names or 'none (set TOOLLOOP_TOOLSETS or --toolsets)'}."
    )
    process = subprocess.Popen(
        worker_argv(args.concurrency, args.queues, args.loglevel, args.steps_in_flight),
        env=worker_env(choice.url, extra),
    )
    # SIGTERM to this command is a warm shutdown of its worker (running steps finish).
    signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                return process.wait()
            except (
                KeyboardInterrupt
            ):  # the worker got the terminal's SIGINT too: wait for it
                continue
    finally:
        if server is not None:
            server.stop()


def cmd_sim(args: argparse.Namespace) -> int:
    try:
        from toolloop.sim.__main__ import main as sim_main  # as above
    except ImportError as error:
        raise CliError(
            f"The simulator cannot be loaded: {error}.\n  Reinstall toolloop."
        ) from None
    argv = list(args.sim_args)
    code = sim_main(argv[1:] if argv[:1] == ["--"] else argv)
    return int(code or 0)
