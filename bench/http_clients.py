"""CPU per model call at many calls in flight, on the two HTTP clients of toolloop.http:
a fresh httpx client per call (`HttpxClient`, the library default) and the keep-alive connections
(httptools, toolloop/http/keepalive.py) a worker hands its providers (`KeepAliveClient`). The
simulator answers every call after --latency s.

    .venv/bin/python bench/http_clients.py [--calls 500] [--rounds 3] [--latency 1]

CPU is the calling thread's (`time.thread_time`), so the simulator's own work is not counted;
the first round of each path warms it up (connections, imports) and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolloop.abort import NEVER_ABORTED
from toolloop.http import HttpClient, HttpxClient, KeepAliveClient
from toolloop.providers.base import Secret
from toolloop.providers.call import call_json
from toolloop.providers.retry import Endpoint, RetryPolicy
from toolloop.sim import SimServer

BODY = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi " * 300}],
}
KEY = Secret("sim-key")
HEADERS = {"x-api-key": "sim-key", "anthropic-version": "2023-06-01"}


async def rounds(path: str, url: str, calls: int, count: int) -> list[float]:
    """CPU µs per call of `count` rounds of `calls` concurrent POSTs (after one warm-up round)."""
    client: HttpClient = KeepAliveClient() if path == "keep-alive" else HttpxClient()
    endpoint = Endpoint(
        provider="anthropic",
        url=url,
        key_env="ANTHROPIC_API_KEY",
        timeout_s=60,
        policy=RetryPolicy(),
    )
    per_call: list[float] = []
    try:
        for index in range(count + 1):
            cpu = time.thread_time()
            await asyncio.gather(
                *[
                    call_json(
                        endpoint,
                        BODY,
                        HEADERS,
                        NEVER_ABORTED,
                        client=client,
                        secret=KEY,
                    )
                    for _ in range(calls)
                ]
            )
            if index:
                per_call.append((time.thread_time() - cpu) * 1e6 / calls)
    finally:
        await client.aclose()
    return per_call


def on_own_loop(path: str, url: str, calls: int, count: int) -> list[float]:
    """`rounds` on a uvloop loop in a thread of its own, as a worker runs its steps."""
    import uvloop

    result: dict[str, Any] = {}

    def run() -> None:
        loop = uvloop.new_event_loop()
        try:
            result["value"] = loop.run_until_complete(rounds(path, url, calls, count))
        finally:
            loop.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return list(result["value"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=500, help="calls in flight at once"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--latency", type=float, default=1.0, help="the simulator's answer time, s"
    )
    args = parser.parse_args(argv)
    with SimServer([{"text": "ok"}], latency_s=args.latency) as sim:
        url = f"{sim.base_url}/v1/messages"
        measured = {
            path: on_own_loop(path, url, args.calls, args.rounds)
            for path in ("per-call", "keep-alive")
        }
    print(
        f"\nCPU per model call, {args.calls} in flight at {args.latency:g} s (median of {args.rounds} rounds)"
    )
    for path, values in measured.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{path:<12} {statistics.median(values):7.0f} µs   ({shown})")
    ratio = statistics.median(measured["keep-alive"]) / statistics.median(
        measured["per-call"]
    )
    print(f"keep-alive / per-call: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
