"""Which Celery pool keeps many slow model calls in flight in ONE worker process (Celery 5.7 has no
async tasks)? Each run is a chain of `--steps` model steps; each step is one HTTP call that the
server answers after `--latency` seconds, then enqueues the next step. With R runs in flight the
ideal wall time is steps x latency; "of ideal" = ideal wall / measured wall.

    .venv/bin/python bench/pools.py [--runs 500] [--steps 5] [--latency 1.0]

Variants (see bench/_pool_app.py): threads pool + one asyncio loop per process with one shared
AsyncClient (`threads+loop`) or a fresh client per call (`threads+loopfresh`, what
workers/process/worker_process.py and providers/call.py do), threads pool + a loop and client per thread,
threads pool + a shared sync
httpx.Client, threads pool + `time.sleep` (Celery's own floor), gevent (when installed) + sync client,
and prefork (one process per call in flight, at small concurrency, with its memory per child).
Results and the choice: docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _procs import Worker, env_with  # noqa: E402

from toolloop.embedded import free_port, start_server  # noqa: E402


def listening(port: int) -> bool:
    with (
        contextlib.suppress(OSError),
        socket.create_connection(("127.0.0.1", port), timeout=0.2),
    ):
        return True
    return False


@contextlib.contextmanager
def slow_server(latency: float) -> Iterator[str]:
    """`bench/_slow_server.py` as a child process; yields its URL."""
    port = free_port()
    script = Path(__file__).resolve().parent / "_slow_server.py"
    process = subprocess.Popen(
        [sys.executable, str(script), str(port), str(latency)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not listening(port):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(
                    "The slow HTTP server did not start.\n  Run bench/_slow_server.py by hand."
                )
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1/messages"
    finally:
        process.terminate()
        process.wait(timeout=10)


def measure(
    app: Any, task: Any, worker: Worker, client: redis.Redis, runs: int, steps: int
) -> dict[str, Any]:
    """Send `runs` chains of `steps` steps at once; wall time until the last one finished."""
    worker.start(app)
    try:
        group = uuid.uuid4().hex
        task.apply_async((f"{group}:warm", 0, 1))
        deadline = time.monotonic() + 60
        while (
            not client.blpop([f"bench:done:{group}"], timeout=1)
            and time.monotonic() < deadline
        ):
            pass
        cpu0 = worker.cpu_seconds()
        profiler = worker.spy(steps * 3)
        start = time.time()
        for i in range(runs):
            task.apply_async((f"{group}:{i}", 0, steps))
        done = 0
        last = start
        deadline = time.monotonic() + steps * 60
        while done < runs and time.monotonic() < deadline:
            item = client.blpop([f"bench:done:{group}"], timeout=1)
            if item:
                done += 1
                last = max(last, float(item[1]))
        rss = worker.pid_rss_mb()
        if profiler:
            profiler.wait(timeout=120)
        cpu = worker.cpu_seconds() - cpu0
    finally:
        worker.stop()
    wall = last - start
    return {"runs": runs, "finished": done, "wall_s": wall, "cpu_s": cpu, "rss_mb": rss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument(
        "--prefork", type=int, default=8, help="prefork children (runs in flight)"
    )
    parser.add_argument("--only", default="", help="comma-separated variant names")
    args = parser.parse_args(argv)
    variants = [
        ("threads+loop", "threads", args.runs, "loop", args.runs),
        ("threads+loopfresh", "threads", args.runs, "loopfresh", args.runs),
        ("threads+threadloop", "threads", args.runs, "threadloop", args.runs),
        ("threads+sync", "threads", args.runs, "sync", args.runs),
        ("threads+sleep", "threads", args.runs, "sleep", args.runs),
        ("gevent+sync", "gevent", args.runs, "sync", args.runs),
        ("prefork+sync", "prefork", args.prefork, "sync", args.prefork),
    ]
    if importlib.util.find_spec("gevent") is None:
        variants = [v for v in variants if v[1] != "gevent"]
    if args.only:
        variants = [v for v in variants if v[0] in args.only.split(",")]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="toolloop-pools-") as tmp_dir,
        slow_server(args.latency) as model,
    ):
        tmp = Path(tmp_dir)
        server = start_server(tmp / "redis")
        try:
            os.environ.update(BENCH_REDIS_URL=server.url, BENCH_MODEL_URL=model)
            import _pool_app

            client = redis.Redis.from_url(server.url)
            for name, pool, concurrency, mode, runs in variants:
                env = env_with(
                    BENCH_REDIS_URL=server.url,
                    BENCH_MODEL_URL=model,
                    BENCH_CALL_MODE=mode,
                )
                worker = Worker(
                    "_pool_app",
                    pool=pool,
                    concurrency=concurrency,
                    queues=[_pool_app.QUEUE],
                    env=env,
                    log=tmp / f"{name}.log",
                )
                result = measure(
                    _pool_app.app,
                    _pool_app.model_step,
                    worker,
                    client,
                    runs,
                    args.steps,
                )
                rows.append((name, concurrency, result))
                print(f"  {name}: {result}", file=sys.stderr)
        finally:
            server.stop()
    ideal = args.steps * args.latency
    print(
        f"\n{args.steps} steps per run, {args.latency:.1f} s per model call, one worker process; "
        f"ideal wall {ideal:.1f} s"
    )
    print(
        f"{'variant':<18} {'in flight':>9} {'done':>6} {'wall s':>7} {'of ideal':>8} {'steps/s':>8} "
        f"{'CPU ms/step':>11} {'RSS MB':>7}"
    )
    for name, concurrency, r in rows:
        steps_done = r["finished"] * args.steps
        print(
            f"{name:<18} {concurrency:>9} {r['finished']:>6} {r['wall_s']:>7.2f} {ideal / r['wall_s']:>8.0%} "
            f"{steps_done / r['wall_s']:>8.1f} {r['cpu_s'] * 1000 / max(steps_done, 1):>11.2f} "
            f"{r['rss_mb']:>7.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
