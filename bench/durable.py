"""Durable-run benchmarks (DESIGN.md section 7), measured in one run on a private server:

1. per-step overhead of a durable run vs a bare self-chaining Celery task hop (target <= 1.5x);
2. CPU time to replay a 200-step journal to the next live step (target <= 20 ms);
3. runs in flight per worker process at 1 s model latency (target >= 500 at >= 80 % of ideal).

    .venv/bin/python bench/durable.py [--hops 200] [--trials 5] [--runs 500]

Machines here are shared and noisy: every figure is a median of trials and sits beside its floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _procs import Worker, env_with, running  # noqa: E402

from toolloop.embedded import start_server  # noqa: E402

# The production pool (docs/operations.md), for the floor and the durable runs alike.
POOL = (os.environ.get("BENCH_POOL", "threads"), int(os.environ.get("BENCH_C", "16")))


def wait_done(client: redis.Redis, key: str, count: int, timeout: float) -> list[float]:
    """BLPOP `count` completion times from `key`."""
    times: list[float] = []
    deadline = time.monotonic() + timeout
    while len(times) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(times)}/{count} chains finished within {timeout:.0f} s")
        item = client.blpop([key], timeout=min(left, 1.0))
        if item:
            times.append(float(item[1]))
    return times


def bare_hop_floor(url: str, tmp: Path, hops: int, trials: int) -> dict[str, Any]:
    """Seconds per hop of a bare self-chaining no-op task (one chain at a time), median of trials."""
    import _bare_app

    app = _bare_app.app
    client = redis.Redis.from_url(url)
    env = env_with(BENCH_REDIS_URL=url)
    worker = Worker(
        "_bare_app",
        pool=POOL[0],
        concurrency=POOL[1],
        queues=[_bare_app.QUEUE],
        env=env,
        log=tmp / "bare-worker.log",
    )
    per_hop: list[float] = []
    with running(worker, app):
        for trial in range(trials + 1):  # the first chain warms the worker up and is not counted
            chain = uuid.uuid4().hex
            start = time.time()
            _bare_app.hop.apply_async((chain, 0, hops))
            (end,) = wait_done(client, f"bench:done:{chain}", 1, timeout=120)
            if trial:
                per_hop.append((end - start) / hops)
    _, source = _bare_app.production_conf()
    return {"per_hop_s": statistics.median(per_hop), "trials": per_hop, "settings_from": source}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=200, help="steps per chain for the per-step figures")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="toolloop-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = start_server(tmp / "redis")
        os.environ["BENCH_REDIS_URL"] = server.url
        try:
            floor = bare_hop_floor(server.url, tmp, args.hops, args.trials)
        finally:
            server.stop()
    print(
        f"bare Celery hop ({POOL[0]} c={POOL[1]}, settings from {floor['settings_from']}): "
        f"{ms(floor['per_hop_s'])} per hop, trials {[round(t * 1000, 2) for t in floor['trials']]} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
