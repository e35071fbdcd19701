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

With `--shards N`: for 1..N shards (workers/client/shards.py `ShardedClient`), each shard a private Redis with
one worker process, `--runs` runs per shard enqueued through one sharded client; per row the Redis
CPU per step of each shard (the median shard) and the capacity the shards carry by that measure (N x
one Redis core's ceiling). `--commit-wait` adds, per shard count, the same fleet with a replica per
shard and `TOOLLOOP_COMMIT_WAIT=1` (every commit ends with WAIT 1): its cost per step.

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

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import (  # noqa: E402
    REGISTRY,
    TOOLSET,
    run_spec,
    sim_script,
    start_queue,
    step_worker,
    wait_all,
)
from _procs import ROOT, env_with  # noqa: E402

from toolloop.embedded import (  # noqa: E402
    EmbeddedServer,
    free_port,
    ping,
    server_binary,
    start_server,
)
from workers.client import Client, ShardedClient  # noqa: E402


class Simulator:
    """`python -m toolloop.sim` as a child process in its own session, stopped by its pid."""

    def __init__(self, tmp: Path, turns: int, latency: float) -> None:
        script = tmp / "fleet-script.json"
        script.write_text(json.dumps(sim_script(turns)))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "toolloop.sim",
                "--port",
                "0",
                "--script",
                str(script),
                "--latency",
                str(latency),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=(tmp / "fleet-sim.log").open("wb"),
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().decode().strip()
        if not self.base_url.startswith("http"):
            self.stop()
            raise RuntimeError(
                f"The simulator did not start; see {tmp / 'fleet-sim.log'}."
            )

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/_sim/stats", timeout=10) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def cpu_seconds(self) -> float:
        fields = (
            Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        )
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)


def redis_cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def fleet(
    url: str, tmp: Path, processes: int, runs: int, turns: int, latency: float
) -> dict[str, Any]:
    """One fleet of `processes` workers, `runs` runs each; the figures of the module docstring."""
    sim = Simulator(tmp, turns, latency)
    env = env_with(
        REDIS_URL=url,
        **REGISTRY,
        ANTHROPIC_BASE_URL=sim.base_url,
        ANTHROPIC_API_KEY="sim-key",
        TOOLLOOP_PROMPT_GEN="",
    )
    logs = [tmp / f"fleet-{processes}-{i}.log" for i in range(processes)]
    workers = [
        step_worker("consumer", ("threads", runs), env, log, held=("llm",))
        for log in logs
    ]
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
            run_ids += client.enqueue_many(
                [run_spec(turns, provider="anthropic")] * count
            )
        calls0 = sim.stats()["requests"]
        worker0 = sum(w.cpu_seconds() for w in workers)
        redis0, sim0 = redis_cpu(plain), sim.cpu_seconds()
        began = time.time()
        start_queue(client, "consumer", workers, "llm")
        statuses = wait_all(
            client, run_ids, timeout=120 + 30 * turns * latency * max(1, total / 200)
        )
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
        "processes": processes,
        "runs": total,
        "done": done,
        "wall_s": wall,
        "ideal_s": turns * latency,
        "calls_per_process_s": calls / wall / processes,
        "ideal_calls_per_process_s": runs / latency,
        "worker_cpu_per_step_ms": 1000 * worker_s / steps,
        "redis_cpu_per_step_ms": 1000 * redis_s / steps,
        "sim_cpu_s": sim_s,
        "steps": steps,
        "steps_s": steps / wall,
        "redis_ceiling_steps_s": steps / redis_s if redis_s > 0 else float("inf"),
        "run_bytes": run_bytes,
    }


def replica_of(primary: EmbeddedServer, tmp: Path) -> subprocess.Popen[bytes]:
    """A redis-server replicating `primary` (for TOOLLOOP_COMMIT_WAIT=1), once it is in sync."""
    port = free_port()
    home = tmp / f"replica-{port}"
    home.mkdir()
    process = subprocess.Popen(
        [
            server_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(home),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--replicaof",
            "127.0.0.1",
            str(primary.port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(primary.url)
    deadline = time.monotonic() + 30
    while not (
        ping("127.0.0.1", port) and int(client.wait(1, 500)) >= 1
    ):  # its first full sync done
        if time.monotonic() > deadline:
            raise RuntimeError("the replica was not in sync within 30 s")
        time.sleep(0.1)
    return process


def sharded(
    tmp: Path, shards: int, runs: int, turns: int, latency: float, wait: bool
) -> dict[str, Any]:
    """`shards` shards, a worker each, `runs` runs per shard through one ShardedClient; with `wait`, a
    replica per shard and TOOLLOOP_COMMIT_WAIT=1."""
    servers = [
        start_server(tmp / f"shard-{shards}-{i}-{int(wait)}") for i in range(shards)
    ]
    replicas = [replica_of(server, tmp) for server in servers] if wait else []
    sim = Simulator(tmp, turns, latency)
    extra = {"TOOLLOOP_COMMIT_WAIT": "1"} if wait else {}
    plain = [redis.Redis.from_url(server.url) for server in servers]
    workers = []
    client = ShardedClient([server.url for server in servers], toolsets=[TOOLSET])
    try:
        for i, server in enumerate(servers):
            env = env_with(
                REDIS_URL=server.url,
                **REGISTRY,
                ANTHROPIC_BASE_URL=sim.base_url,
                ANTHROPIC_API_KEY="sim-key",
                TOOLLOOP_PROMPT_GEN="",
                **extra,
            )
            worker = step_worker(
                "consumer",
                ("threads", runs),
                env,
                tmp / f"shard-{shards}-{i}.log",
                held=("llm",),
            )
            worker.start(client.clients[i].celery)
            workers.append(worker)
        total = runs * shards
        run_ids = client.enqueue_many([run_spec(turns, provider="anthropic")] * total)
        worker0 = sum(w.cpu_seconds() for w in workers)
        redis0 = [redis_cpu(p) for p in plain]
        began = time.time()
        for i, worker in enumerate(workers):
            start_queue(client.clients[i], "consumer", [worker], "llm")
        statuses = [
            status
            for i, shard in enumerate(client.clients)
            for status in wait_all(
                shard, [r for r in run_ids if client.shard(r) is shard], timeout=600
            )
        ]
        redis_s = [redis_cpu(p) - r0 for p, r0 in zip(plain, redis0, strict=True)]
        worker_s = sum(w.cpu_seconds() for w in workers) - worker0
    finally:
        for worker in workers:
            worker.stop()
        client.close()
        sim.stop()
        for replica in replicas:
            replica.terminate()
            replica.wait(10)
        for server in servers:
            server.stop()
    steps_per_shard = runs * (2 * turns - 1)
    per_step = statistics.median(1000 * r / steps_per_shard for r in redis_s)
    wall = max(s.updated_at for s in statuses) - began
    return {
        "shards": shards,
        "wait": wait,
        "done": sum(s.status == "done" for s in statuses),
        "runs": total,
        "wall_s": wall,
        "steps_s": shards * steps_per_shard / wall,
        "redis_ms": per_step,
        "worker_ms": 1000 * worker_s / (shards * steps_per_shard),
        "capacity": shards * 1000 / per_step if per_step > 0 else float("inf"),
    }


def print_shards(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"Sharded fleet: {args.runs} runs per shard, {args.turns} model turns each, {args.latency:g} s "
        "model latency, one worker process per shard, simulator in its own process\n"
    )
    print(
        "| Shards | Commit wait | Runs done | Wall | Steps/s | Worker CPU/step | Redis CPU/step per shard "
        "| Capacity of the shards |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        waits = "WAIT 1" if r["wait"] else "off"
        print(
            f"| {r['shards']} | {waits} | {r['done']}/{r['runs']} | {r['wall_s']:.1f} s "
            f"| {r['steps_s']:.0f} | {r['worker_ms']:.2f} ms | {r['redis_ms']:.3f} ms "
            f"| {r['capacity']:,.0f} steps/s |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="runs per worker process")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument(
        "--trials", type=int, default=1, help="trials per fleet size (the median)"
    )
    parser.add_argument(
        "--shards", type=int, default=0, help="sharded fleets of 1..N shards instead"
    )
    parser.add_argument(
        "--commit-wait",
        action="store_true",
        help="with --shards: also WAIT 1 on a replica",
    )
    args = parser.parse_args()
    if args.shards:
        tmp = Path(tempfile.mkdtemp(prefix="bench-shards-"))
        rows = [
            sharded(tmp, n, args.runs, args.turns, args.latency, wait)
            for n in range(1, args.shards + 1)
            for wait in ((False, True) if args.commit_wait else (False,))
        ]
        print_shards(rows, args)
        return
    cores = os.cpu_count() or 1
    sizes = sorted({1, 2, cores})
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = start_server(tmp / "redis")
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            trials = []
            for _ in range(args.trials):
                trials.append(
                    fleet(server.url, tmp, size, args.runs, args.turns, args.latency)
                )
                redis.Redis.from_url(server.url).flushdb()
            rows.append(
                min(
                    trials,
                    key=lambda r: abs(
                        r["wall_s"] - statistics.median(t["wall_s"] for t in trials)
                    ),
                )
            )
    finally:
        server.stop()
    print(
        f"Fleet on one Redis: {args.runs} runs per process, {args.turns} model turns each, "
        f"{args.latency:g} s model latency, simulator in its own process, {cores} cores\n"
    )
    print(
        "| Worker processes | Runs done | Wall (ideal) | Model calls/s per process (ideal) | "
        "Steps/s | Worker CPU/step | Redis CPU/step | One Redis core carries | Redis KB/run |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['processes']} | {r['done']}/{r['runs']} | {r['wall_s']:.1f} s ({r['ideal_s']:.1f} s) | "
            f"{r['calls_per_process_s']:.0f} ({r['ideal_calls_per_process_s']:.0f}) | {r['steps_s']:.0f} | "
            f"{r['worker_cpu_per_step_ms']:.2f} ms | {r['redis_cpu_per_step_ms']:.3f} ms | "
            f"{r['redis_ceiling_steps_s']:,.0f} steps/s | {r['run_bytes'] / 1024:.1f} |"
        )
    ceiling = statistics.median(r["redis_ceiling_steps_s"] for r in rows)
    per_worker = statistics.median(r["worker_cpu_per_step_ms"] for r in rows)
    print(
        f"\nCeiling of one Redis: ~{ceiling:,.0f} steps/s (median of the rows) = about "
        f"{ceiling / (1000 / per_worker):.0f} worker cores at {per_worker:.2f} ms of CPU per step, "
        f"or {ceiling / 2:,.0f} model calls/s of tool-calling runs (a tool step per model step)."
    )


if __name__ == "__main__":
    main()
