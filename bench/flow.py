"""Flow-control benchmark (issue 17): R runs of T turns through two worker processes against the
provider simulator, which enforces a requests-per-minute limit per API key (429 rate_limit_error
with retry-after beyond it), while the workers hold the same limit (TOOLLOOP_RATE_LIMITS).

    .venv/bin/python bench/flow.py            # the full one: 1,000 runs x 10 turns at 600 rpm (~17 min)
    .venv/bin/python bench/flow.py --quick    # 200 runs x 10 turns at 2,400 rpm (~50 s)

Pass when: no 429 was served (so none reached a provider retry: the simulator counts every one it
sends), and model calls per second over the whole benchmark are within 10 % of the limit. The clock
starts when the workers begin to take model steps (every run is enqueued first) and stops at the
last run's last commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import (  # noqa: E402
    TOOLSET,
    run_spec,
    sim_env,
    sim_script,
    start_queue,
    step_worker,
    wait_all,
)

from toolloop.embedded import start_server  # noqa: E402
from toolloop.sim import SimServer  # noqa: E402
from toolloop.sim.ratelimit import SimRateLimits  # noqa: E402
from workers.client import Client  # noqa: E402


def flow(
    runs: int,
    turns: int,
    rpm: int,
    latency: float,
    processes: int,
    tmp: Path,
    limiter: bool = True,
) -> dict[str, Any]:
    server = start_server(tmp / "redis")
    limits = json.dumps({"anthropic": {"*": {"requests_per_minute": rpm}}})
    try:
        with SimServer(
            sim_script(turns), latency_s=latency, rate_limits=SimRateLimits(rpm=rpm)
        ) as sim:
            env = {**sim_env(server.url, sim), "TOOLLOOP_RATE_LIMITS": limits}
            if not limiter:
                del env["TOOLLOOP_RATE_LIMITS"]
            logs = [tmp / f"flow-worker-{i}.log" for i in range(processes)]
            workers = [
                step_worker("consumer", ("threads", 500), env, log, held=("llm",))
                for log in logs
            ]
            client = Client(server.url, toolsets=[TOOLSET])
            try:
                for worker in workers:
                    worker.start(client.celery)
                run_ids = [
                    client.enqueue(run_spec(turns, provider="anthropic"))
                    for _ in range(runs)
                ]
                start = time.time()
                start_queue(client, "consumer", workers, "llm")
                expected = runs * turns / rpm * 60
                statuses = wait_all(client, run_ids, timeout=120 + 2 * expected)
            finally:
                for worker in workers:
                    worker.stop()
                client.close()
            stats = sim.stats()
    finally:
        server.stop()
    wall = max(s.updated_at for s in statuses) - start
    calls = stats["requests"]
    served_429 = stats["statuses"].get("429", 0)
    rate = calls / wall * 60
    return {
        "limiter": limiter,
        "runs": runs,
        "turns": turns,
        "processes": processes,
        "limit_rpm": rpm,
        "done": sum(s.status == "done" for s in statuses),
        "model_calls": calls,
        "served_429": served_429,
        "wall_s": round(wall, 2),
        "ideal_s": round(calls / rpm * 60, 2),
        "calls_per_min": round(rate, 1),
        "of_limit": round(rate / rpm, 3),
        "pass": served_429 == 0
        and abs(rate / rpm - 1) <= 0.10
        and calls == runs * turns,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="200 runs at 2,400 rpm (the same 10-turn runs)",
    )
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--rpm", type=int, default=None)
    parser.add_argument(
        "--latency", type=float, default=0.05, help="the simulator's seconds per answer"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--no-limiter",
        action="store_true",
        help="workers without TOOLLOOP_RATE_LIMITS: they learn the limit from the simulator's headers",
    )
    args = parser.parse_args()
    runs = args.runs or (200 if args.quick else 1000)
    rpm = args.rpm or (2400 if args.quick else 600)
    with tempfile.TemporaryDirectory() as tmp:
        result = flow(
            runs,
            args.turns,
            rpm,
            args.latency,
            args.processes,
            Path(tmp),
            not args.no_limiter,
        )
    print(json.dumps(result, indent=2))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
