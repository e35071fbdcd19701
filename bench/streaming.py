"""First-delta latency of a streaming durable run (DESIGN.md section 7: <= 100 ms after the provider
sends it), through a real worker:

the simulator (in this process, over real HTTP) streams a 2,000-token answer at a fixed token rate
to the anthropic provider of a `workers.app` worker (step consumer, production settings), which
publishes the deltas to the run's event stream; a `Client.events(follow=True)` reader in this
process receives them. Per run: the simulator's send time of the answer's first text piece (the
time its SSE chunk is handed to the server) and the reader's receive time of the first `delta`
entry, both `time.time()` on this host. Also: the delta entries written per run (batching) and the
last delta's lag behind the simulator's last piece.

    .venv/bin/python bench/streaming.py [--runs 5] [--tokens 2000] [--rate 200]
    .venv/bin/python bench/streaming.py --parse     # the provider alone: CPU per call, streamed or not

`--parse`: the anthropic provider (keep-alive client) against the simulator in another process, 100
calls a round, streamed and not in alternating rounds, `time.process_time()` per call (medians),
for a short answer and one of `--parse-tokens` pieces: what reading SSE events costs over one body.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import TOOLSET, run_spec, sim_env, step_worker  # noqa: E402

from toolloop.embedded import start_server  # noqa: E402
from toolloop.sim import SimServer, SimTurn, stream  # noqa: E402
from workers.client import Client  # noqa: E402

PIECE = "word"  # 4 characters: one simulator token piece (toolloop/sim/stream.py PIECE_CHARS)


class SendTimes:
    """The simulator's stream, timed: when the first and the last text piece of each answer went out."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.last: list[float] = []
        self.lock = threading.Lock()
        self.original = stream.paced

    def install(self) -> None:
        original = self.original

        async def timed(
            events: Iterator[Any], *args: Any, **kwargs: Any
        ) -> AsyncIterator[bytes]:
            first = None
            async for chunk in original(events, *args, **kwargs):
                texty = b"text_delta" in chunk
                now = time.time()
                yield chunk
                if texty and first is None:
                    first = now
                    with self.lock:
                        self.first.append(now)
                if texty:
                    last = now
            if first is not None:
                with self.lock:
                    self.last.append(last)

        stream.paced = timed  # type: ignore[assignment]

    def remove(self) -> None:
        stream.paced = self.original  # type: ignore[assignment]


def measure(url: str, tmp: Path, runs: int, tokens: int, rate: float) -> dict[str, Any]:
    text = PIECE * tokens
    times = SendTimes()
    times.install()
    firsts: list[float] = []
    lasts: list[float] = []
    writes: list[int] = []
    try:
        with SimServer(lambda request: SimTurn(text=text), tokens_per_s=rate) as sim:
            env = sim_env(url, sim)
            worker = step_worker(
                "consumer", ("threads", 16), env, tmp / "streaming-worker.log"
            )
            client = Client(url, toolsets=[TOOLSET])
            try:
                worker.start(client.celery)
                for trial in range(
                    runs + 1
                ):  # the first run warms the worker and its connections up
                    run_id = client.enqueue(
                        run_spec(1, provider="anthropic", stream=True)
                    )
                    got: list[tuple[float, Any]] = []
                    for event in client.events(run_id, follow=True):
                        got.append((time.time(), event))
                    deltas = [(at, e) for at, e in got if e.kind == "delta"]
                    model = next(e for _, e in got if e.kind == "model")
                    if (
                        "".join(e.text for _, e in deltas) != model.text
                        or model.text != text
                    ):
                        raise RuntimeError("the streamed text is not the answer")
                    if trial:
                        firsts.append(deltas[0][0] - times.first[-1])
                        lasts.append(deltas[-1][0] - times.last[-1])
                        writes.append(len(deltas))
            finally:
                worker.stop()
                client.close()
    finally:
        times.remove()
    return {
        "runs": runs,
        "tokens": tokens,
        "rate": rate,
        "first_s": firsts,
        "last_s": lasts,
        "writes": writes,
        "answer_s": tokens / rate,
    }


def parse_cost(
    tokens: int, calls: int = 100, rounds: int = 3
) -> dict[str, list[float]]:
    """CPU per provider call (s), not streamed and streamed, for a short answer and a long one."""
    import asyncio
    import json
    import subprocess

    from toolloop.contract import PromptGenRequest, UserMessage
    from toolloop.embedded import free_port
    from toolloop.http import client_from_env
    from toolloop.providers import from_env

    found: dict[str, list[float]] = {}
    request = PromptGenRequest(
        model="claude-sonnet-5-5", messages=[UserMessage(content="hi")]
    )
    with tempfile.TemporaryDirectory(prefix="toolloop-bench-") as tmp:
        for name, text in (
            ("short", "Reviewed."),
            (f"{tokens} pieces", PIECE * tokens),
        ):
            script = Path(tmp) / "script.json"
            script.write_text(json.dumps([{"text": text}]))
            port = free_port()
            args = [
                sys.executable,
                "-m",
                "toolloop.sim",
                "--port",
                str(port),
                "--script",
                str(script),
            ]
            sim = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                time.sleep(2)
                os.environ.update(
                    ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
                    ANTHROPIC_API_KEY="sim-key",
                )
                prompt_gen = from_env(http_client=client_from_env())

                async def go(streamed: bool, n: int, gen: Any = prompt_gen) -> None:
                    sink: list[Any] = []
                    for _ in range(n):
                        await gen.generate(
                            request,
                            provider="anthropic",
                            on_delta=sink.append if streamed else None,
                        )

                async def measure_all(name: str = name) -> None:
                    await go(False, 10)
                    await go(True, 10)
                    for streamed in (False, True) * rounds:
                        start = time.process_time()
                        await go(streamed, calls)
                        key = f"{name}, {'streamed' if streamed else 'one body'}"
                        found.setdefault(key, []).append(
                            (time.process_time() - start) / calls
                        )

                asyncio.run(measure_all())
            finally:
                sim.terminate()
                sim.wait()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=5, help="runs measured, one after another"
    )
    parser.add_argument("--tokens", type=int, default=2000, help="tokens of the answer")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="the simulator's tokens per second"
    )
    parser.add_argument(
        "--parse", action="store_true", help="only the provider's CPU per call"
    )
    parser.add_argument(
        "--parse-tokens", type=int, default=200, help="pieces of the long answer"
    )
    args = parser.parse_args(argv)
    if args.parse:
        for key, values in parse_cost(args.parse_tokens).items():
            print(
                f"provider CPU per call, {key:<28} {statistics.median(values) * 1e6:>8.0f} µs"
            )
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="toolloop-bench-") as tmp_dir:
        server = start_server(Path(tmp_dir) / "redis")
        try:
            got = measure(server.url, Path(tmp_dir), args.runs, args.tokens, args.rate)
        finally:
            server.stop()
    first = statistics.median(got["first_s"])
    worst = max(got["first_s"])
    print(
        f"\nstreaming durable run, one worker process, private Redis, {os.cpu_count()} CPUs, "
        f"load average {load:.1f} at start; {args.tokens}-token answer at {args.rate:g} tokens/s "
        f"({got['answer_s']:.1f} s), {args.runs} runs"
    )
    print(f"{'figure':<58} {'ours':>10} {'target':>10}  verdict")
    print(
        f"{'first delta: simulator send -> Client.events reader, median':<58} {first * 1000:>7.1f} ms"
        f" {'<= 100 ms':>10}  {'met' if first <= 0.1 else 'MISSED'}"
    )
    print(f"{'  worst of the runs':<58} {worst * 1000:>7.1f} ms {'':>10}")
    last = statistics.median(got["last_s"])
    print(
        f"{'last delta: simulator send -> reader, median':<58} {last * 1000:>7.1f} ms"
    )
    print(
        f"{'delta entries per run (batched, <= 1 per 50 ms)':<58} "
        f"{statistics.median(got['writes']):>10.0f} {got['answer_s'] / 0.05 + 2:>10.0f}"
    )
    print(
        "  first-delta lags (ms): "
        + ", ".join(f"{s * 1000:.1f}" for s in got["first_s"])
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
