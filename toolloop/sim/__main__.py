"""`python -m toolloop.sim --port N --script FILE.yaml|json | --policy pkg.module:NAME [--latency 1.0]`: the
simulator as a process.

The first line printed is the base URL (e.g. `http://127.0.0.1:8765`); it serves until SIGINT or
SIGTERM. `main(argv)` is also what the `toolloop sim` command calls.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from toolloop.sim.cache import LOOKBACK_BLOCKS, MIN_CACHE_TOKENS
from toolloop.sim.ratelimit import SimRateLimits
from toolloop.sim.script import Script, SimRequest, SimTurn, load_script
from toolloop.sim.server import SimServer

DEFAULT_PORT = 8765


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m toolloop.sim",
        description="Serve the Anthropic Messages API and fal's router on loopback, answered from a script.",
    )
    found.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    found.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"0 = a free port (default {DEFAULT_PORT})",
    )
    found.add_argument(
        "--script",
        help="a YAML or JSON list of turns (default: every answer ends the script)",
    )
    found.add_argument(
        "--policy",
        help='or a policy, "pkg.module:NAME" (a function SimRequest -> SimTurn; imported from the working '
        "directory), e.g. examples.storyboard.policy:review_policy",
    )
    found.add_argument(
        "--latency", type=float, default=0.0, help="seconds added to every answer"
    )
    found.add_argument(
        "--require-key", default=None, help="refuse (401) any other API key"
    )
    found.add_argument(
        "--min-cache-tokens",
        type=int,
        default=MIN_CACHE_TOKENS,
        help="minimum cacheable prefix",
    )
    found.add_argument(
        "--lookback", type=int, default=LOOKBACK_BLOCKS, help="cache lookback in blocks"
    )
    found.add_argument(
        "--strict",
        action="store_true",
        help="validate Anthropic bodies against the anthropic SDK's request types (needs the SDK)",
    )
    found.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="a request on a keep-alive connection idle longer than this many seconds finds it closed",
    )
    found.add_argument(
        "--tokens-per-s",
        type=float,
        default=None,
        help="rate of a streamed answer (default: no pause)",
    )
    found.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="real seconds per simulated second of every wait (default 1; 0.01: 190 s take 1.9 s)",
    )
    found.add_argument(
        "--rpm",
        type=int,
        default=0,
        help="requests per minute per API key (0: no limit)",
    )
    found.add_argument(
        "--input-tpm", type=int, default=0, help="input tokens per minute per API key"
    )
    found.add_argument(
        "--output-tpm", type=int, default=0, help="output tokens per minute per API key"
    )
    return found


def load_policy(path: str) -> Callable[[SimRequest], SimTurn]:
    """A policy by import path, "pkg.module:NAME", imported from the working directory; ValueError
    that says what is wrong."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = (
            getattr(importlib.import_module(module_name), attribute, None)
            if attribute
            else None
        )
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r} ({error})") from None
    if not callable(found):
        raise ValueError(f"{path!r} is not a function; name one as pkg.module:NAME")
    policy: Callable[[SimRequest], SimTurn] = found
    return policy


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    script: Script | Callable[[SimRequest], SimTurn]
    try:
        script = load_script(args.script) if args.script else Script([])
        if args.policy:
            script = load_policy(args.policy)
    except (OSError, ValueError) as error:
        what = (
            f"load the policy {args.policy!r}"
            if args.policy
            else f"read the script {args.script!r}"
        )
        print(f"Cannot {what}: {error}\n  Fix it and start again.", file=sys.stderr)
        return 2
    from toolloop.providers.models_file import catalog_from_env

    try:
        # TOOLLOOP_MODELS: the models the operator file adds are served
        catalog = catalog_from_env()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if not (0 < args.time_scale < float("inf")):
        print(
            f"--time-scale must be a number above 0, got {args.time_scale!r}.\n"
            "  Pass e.g. --time-scale 0.01 (190 s of generation in 1.9 s).",
            file=sys.stderr,
        )
        return 2
    server = SimServer(
        script,
        catalog=catalog,
        host=args.host,
        port=args.port,
        latency_s=args.latency,
        require_key=args.require_key,
        min_cache_tokens=args.min_cache_tokens,
        lookback=args.lookback,
        strict=True if args.strict else None,
        idle_timeout_s=args.idle_timeout,
        rate_limits=SimRateLimits(args.rpm, args.input_tpm, args.output_tpm),
        tokens_per_s=args.tokens_per_s,
        time_scale=args.time_scale,
    )
    try:
        server.bind()
    except OSError as error:
        print(error.strerror, file=sys.stderr)
        return 2
    print(server.base_url, flush=True)
    if args.strict and not server.simulator.strict:
        print(
            "strict mode is off: the anthropic SDK is not installed",
            file=sys.stderr,
            flush=True,
        )
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
