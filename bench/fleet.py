"""Fleet: N worker processes on one Redis (DESIGN.md section 7), and the computed ceiling of that Redis.

For N in 1, 2 and the machine's core count: N `workers.app` processes (the step consumer, the
production default) on one private Redis, `--runs` runs per process of `--turns` model turns each
(a tool step between two), the model being the provider simulator over real HTTP at `--latency` s,
in its own process (`python -m toolloop.sim`). All runs are enqueued while the workers hold back
the llm queue; the clock starts when they take it. Reported per N:

    model calls/s per process   model turns committed / wall time / N   (ideal: runs / latency)
    worker CPU per step         user+system CPU of every worker process / steps committed
    Redis CPU per step          used_cpu_user + used_cpu_sys of INFO cpu, after - before / steps
    one Redis core's ceiling    1 s / (Redis CPU per step): the steps/s one Redis can carry while
                                its one command thread is busy all the time
    Redis bytes per run         INFO memory used_memory, after the runs finished - before they were
                                enqueued, per run (a finished run's keys, kept for the retention)

    .venv/bin/python bench/fleet.py [--runs 200] [--turns 5] [--latency 1.0] [--trials 1]

Machines here are shared and noisy: compare the rows of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from _durable_runs import REGISTRY, TOOLSET, run_spec, sim_script, start_queue, step_worker, wait_all  # noqa: E402
from _procs import ROOT, env_with  # noqa: E402

from toolloop.embedded import start_server  # noqa: E402
from workers.client import Client  # noqa: E402


class Simulator:
    """`python -m toolloop.sim` as a child process in its own session, stopped by its pid."""

    def __init__(self, tmp: Path, turns: int, latency: float) -> None:
        script = tmp / "fleet-script.json"
        script.write_text(json.dumps(sim_script(turns)))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolloop.sim", "--port", "0", "--script", str(script),
             "--latency", str(latency)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=(tmp / "fleet-sim.log").open("wb"),
            start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().decode().strip()
        if not self.base_url.startswith("http"):
            self.stop()
            raise RuntimeError(f"The simulator did not start; see {tmp / 'fleet-sim.log'}.")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/_sim/stats", timeout=10) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)


def redis_cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def fleet(url: str, tmp: Path, processes: int, runs: int, turns: int, latency: float) -> dict[str, Any]:
    """One fleet of `processes` workers, `runs` runs each; the figures of the module docstring."""
    sim = Simulator(tmp, turns, latency)
    env = env_with(REDIS_URL=url, **REGISTRY, ANTHROPIC_BASE_URL=sim.base_url,
                   ANTHROPIC_API_KEY="sim-key", TOOLLOOP_PROMPT_GEN="")  # fmt: skip
    logs = [tmp / f"fleet-{processes}-{i}.log" for i in range(processes)]
    workers = [step_worker("consumer", ("threads", runs), env, log, held=("llm",)) for log in logs]
    client = Client(url, toolsets=[TOOLSET])
    plain = redis.Redis.from_url(url)
    try:
        for worker in workers:
            worker.start(client.celery)
        total = runs * processes
        memory0 = int(plain.info("memory")["used_memory"])
        run_ids: list[str] = []
        for start in range(0, total, 500):
            count = min(500, total - start)
            run_ids += client.enqueue_many([run_spec(turns, provider="anthropic")] * count)
        calls0 = sim.stats()["requests"]
        worker0 = sum(w.cpu_seconds() for w in workers)
        redis0, sim0 = redis_cpu(plain), sim.cpu_seconds()
        began = time.time()
        start_queue(client, "consumer", workers, "llm")
        statuses = wait_all(client, run_ids, timeout=120 + 30 * turns * latency * max(1, total / 200))
        redis_s = redis_cpu(plain) - redis0
        worker_s = sum(w.cpu_seconds() for w in workers) - worker0
        sim_s = sim.cpu_seconds() - sim0
        calls = sim.stats()["requests"] - calls0
        run_bytes = (int(plain.info("memory")["used_memory"]) - memory0) / total
    finally:
        for worker in workers:
            worker.stop()
        client.close()
        plain.close()
        sim.stop()
    done = sum(s.status == "done" for s in statuses)
    wall = max(s.updated_at for s in statuses) - began
    steps = total * (2 * turns - 1)
    return {
        "processes": processes, "runs": total, "done": done, "wall_s": wall, "ideal_s": turns * latency,
        "calls_per_process_s": calls / wall / processes, "ideal_calls_per_process_s": runs / latency,
        "worker_cpu_per_step_ms": 1000 * worker_s / steps, "redis_cpu_per_step_ms": 1000 * redis_s / steps,
        "sim_cpu_s": sim_s, "steps": steps, "steps_s": steps / wall,
        "redis_ceiling_steps_s": steps / redis_s if redis_s > 0 else float("inf"), "run_bytes": run_bytes,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="runs per worker process")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=1, help="trials per fleet size (the median)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    sizes = sorted({1, 2, cores})
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = start_server(tmp / "redis")
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            trials = []
            for _ in range(args.trials):
                trials.append(fleet(server.url, tmp, size, args.runs, args.turns, args.latency))
                redis.Redis.from_url(server.url).flushdb()
            rows.append(
                min(trials, key=lambda r: abs(r["wall_s"] - statistics.median(t["wall_s"] for t in trials)))
            )
    finally:
        server.stop()
    print(f"Fleet on one Redis: {args.runs} runs per process, {args.turns} model turns each, "
          f"{args.latency:g} s model latency, simulator in its own process, {cores} cores\n")  # fmt: skip
    print("| Worker processes | Runs done | Wall (ideal) | Model calls/s per process (ideal) | "
          "Steps/s | Worker CPU/step | Redis CPU/step | One Redis core carries | Redis KB/run |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['processes']} | {r['done']}/{r['runs']} | {r['wall_s']:.1f} s ({r['ideal_s']:.1f} s) | "
              f"{r['calls_per_process_s']:.0f} ({r['ideal_calls_per_process_s']:.0f}) | {r['steps_s']:.0f} | "
              f"{r['worker_cpu_per_step_ms']:.2f} ms | {r['redis_cpu_per_step_ms']:.3f} ms | "
              f"{r['redis_ceiling_steps_s']:,.0f} steps/s | {r['run_bytes'] / 1024:.1f} |")  # fmt: skip
    ceiling = statistics.median(r["redis_ceiling_steps_s"] for r in rows)
    per_worker = statistics.median(r["worker_cpu_per_step_ms"] for r in rows)
    print(
        f"\nCeiling of one Redis: ~{ceiling:,.0f} steps/s (median of the rows) = about "
        f"{ceiling / (1000 / per_worker):.0f} worker cores at {per_worker:.2f} ms of CPU per step, "
        f"or {ceiling / 2:,.0f} model calls/s of tool-calling runs (a tool step per model step)."
    )


if __name__ == "__main__":
    main()
