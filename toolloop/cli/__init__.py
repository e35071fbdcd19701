"""The `toolloop` command: enqueue and watch durable runs, start a worker or the simulator, run the
demo. `toolloop --help` lists the commands; every failure is two lines on stderr and exit 1 (2 for
usage), never a traceback (set TOOLLOOP_DEBUG=1 to see one).

Layers: this package is the top of the stack, the one part of `toolloop` above `workers/`. It
imports `workers` statically (the client, settings, toolsets, the run spec: typed, checked by
mypy); `workers` imports the library (`toolloop` but this package) and never the CLI, and the
library never imports `workers`, so there is no cycle (tests/unit/test_layers.py checks both
arrows). Only the MCP SDK behind `workers.process.mcpservers` is imported inside the two commands that
list MCP tools (`tools`, `doctor`): ~0.6 s of imports every other command does not pay."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from toolloop.cli import (
    accounts,
    commands,
    demo,
    doctor,
    models,
    processes,
    schedules,
    tools,
)
from toolloop.cli.errors import CliError, explain

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolloop",
        description="Durable LLM tool-calling runs. Without REDIS_URL an embedded Redis is started in "
        "./.toolloop (TOOLLOOP_HOME); without a provider key the worker talks to the simulator.",
        epilog="Exit status: 0 done; 1 an error (two lines on stderr) or a followed run that failed; "
        "2 a usage error. TOOLLOOP_DEBUG=1 shows the traceback behind an error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_commands(sub)
    processes.add_commands(sub)
    demo.add_command(sub)
    doctor.add_command(sub)
    accounts.add_command(sub)
    models.add_command(sub)
    tools.add_command(sub)
    schedules.add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:  # the simulator parses its own flags
        argv = ["sim", "--", *argv[1:]]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except KeyboardInterrupt:
        print("\nInterrupted.", file=sys.stderr)
        return 130
    except (
        BrokenPipeError
    ):  # `toolloop events ID | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        # Python's flush at exit must not fail again
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as error:
        if os.environ.get("TOOLLOOP_DEBUG"):
            raise
        message = error.message if isinstance(error, CliError) else explain(error)
        print(message, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
