"""Issue #29's schedule figure: `--runs` runs (default 10,000) that ended `done` are woken by ONE
cron tick (one follow-up schedule per run, all on the same 6-field cron second of the hour), with two worker
processes sweeping the same Redis (two sweepers racing for every tick), the provider simulator in
a process of its own over real HTTP.

Prints, beside the target of each:
- woken: seconds from the tick until every run has its follow-up (its `follow_up` event's id, on
  Redis's clock), and until every run is `running` (the `touched` stamp its RUN_BEGIN wrote, on
  the worker's clock: a worker began its new segment; its model call then waits 30 s at the
  simulator, so a run that began stays `running`). The polls that find when all have begun are
  sparse (`--poll`, 1 s) and never time anything;
- double fires: schedules fired more than once, runs continued more than once (segment > 1, or
  more than one keyed send), and the fires the two workers' metrics count (fired == runs; `taken`:
  ticks the other sweeper had claimed first);
- Redis per schedule: MEMORY USAGE of its two keys (the state hash and the definition), and
  used_memory's growth per schedule added (its index entries included);
- the CPU shares it set and Redis's forks during the watch (an AOF rewrite).

The setup's own writes (10,000 runs, then their schedules) leave Redis's AOF due for its automatic
rewrite, so the AOF is rewritten (and waited for) before the tick; the wake's own writes may still
start one. The workers sweep their live runs every 15 s (TOOLLOOP_SWEEP_INTERVAL's default;
`--sweep-interval`); schedules fire once a second whatever it is.

CPU: each process here is a session of its own, and with Linux's sched_autogroup (on, here) each
session gets an equal share of the CPU when all want it (renice does nothing across sessions). The
simulator stands for the provider's machines, so its session gets the lowest weight
(`--provider-nice`, autogroup nice 19): it takes what the workers, Redis and the bench leave.
`--redis-nice -10` gives Redis a core whenever it wants one, as on a host of its own.

    .venv/bin/python bench/schedules.py                  # 10,000 runs, ~80 s
    .venv/bin/python bench/schedules.py --runs 1000      # a quick look

Machines here are shared (2 cores for several sessions): the woken times move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import REGISTRY, run_spec, wait_all  # noqa: E402
from _procs import ROOT, Worker, env_with, private_redis  # noqa: E402

from workers.client import Client  # noqa: E402
from workers.protocol import keys  # noqa: E402

WAKE_S = 5.0
BYTES = 2048
MESSAGE = "A new day: check the queue again."


@contextmanager
def sim_process(tmp: Path) -> Iterator[tuple[str, int]]:
    """`python -m toolloop.sim` in its own process group: the first turn answers at once, the second
    (the follow-up's) after 30 s. Yields its base URL and pid."""
    script = tmp / "sim-script.json"
    script.write_text(
        json.dumps(
            [{"text": "Parked for the night."}, {"text": "Woken.", "latency_s": 30}]
        )
    )
    args = [
        sys.executable,
        "-m",
        "toolloop.sim",
        "--port",
        "0",
        "--script",
        str(script),
    ]
    sim = subprocess.Popen(
        args, cwd=ROOT, env=env_with(), stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert sim.stdout is not None
        yield sim.stdout.readline().decode().strip(), sim.pid
    finally:
        with suppress(ProcessLookupError):
            os.killpg(sim.pid, signal.SIGTERM)
        sim.wait(timeout=20)


def cpu_share(pid: int, nice: int) -> str:
    """Set the CPU weight of `pid`'s session (Linux's autogroup: with sched_autogroup on, as here,
    each session shares the CPU as one, whatever its threads or its own nice value, so `renice`
    does nothing across sessions). Says what it did, or why not."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError as error:
        return f"left as it was ({error.strerror})"
    return f"autogroup nice {nice}"


def cpu_seconds(pid: int) -> tuple[float, float]:
    """Seconds `pid`'s threads were on a CPU, and waited runnable for one, so far (the sum of
    /proc/PID/task/*/schedstat); (0, 0) where Linux does not say."""
    ran = waited = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(OSError, ValueError):
            on_cpu, queued, _ = task.joinpath("schedstat").read_text().split()
            ran, waited = ran + int(on_cpu), waited + int(queued)
    return ran / 1e9, waited / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fires(port: int) -> dict[str, float]:
    """toolloop_schedule_fires_total by outcome, scraped from a worker's /metrics."""
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        .read()
        .decode()
    )
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("toolloop_schedule_fires_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


def progress(client: Client, run_ids: list[str]) -> list[tuple[int, str, float]]:
    """(segment, status, touched) of each run: segment 1 once its follow-up is in; then `queued`
    until a worker begins the segment (RUN_BEGIN: `running`, `touched` the worker's clock then; `done`
    again once its 30 s model call answers)."""
    pipe = client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hmget(keys.state(run_id), "segment", "status", "touched")
    return [
        (int(segment or 0), str(status), float(touched or 0))
        for segment, status, touched in pipe.execute()
    ]


def follow_up_times(
    client: Client, run_ids: list[str], tick: float
) -> dict[str, float]:
    """When each run's follow-up was written: the id of its `follow_up` event (Redis's clock, ms)."""
    pipe = client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrange(keys.events(run_id), min=str(int(tick * 1000) - 1000), count=8)
    found: dict[str, float] = {}
    for run_id, entries in zip(run_ids, pipe.execute(), strict=True):
        for entry_id, fields in entries:
            if fields.get("kind") == "follow_up":
                found[run_id] = int(str(entry_id).split("-", 1)[0]) / 1000
                break
    return found


def rewrite_aof(client: Client) -> None:
    """BGREWRITEAOF, waited for: the setup's writes (10,000 runs, then their schedules) leave the AOF
    past its automatic rewrite's growth (100 %), and that rewrite would fork during the wake."""
    client.redis.bgrewriteaof()
    while True:
        info = client.redis.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.05)


def tick_second(lead: float) -> tuple[str, float]:
    """A 6-field cron expression that fires once an hour, `lead` s or more from now, and its tick."""
    tick = float(int(time.time() + lead) + 1)
    return f"{int(tick) % 60} {int(tick) // 60 % 60} * * * *", tick


def watch(
    client: Client, run_ids: list[str], tick: float, poll: float
) -> tuple[dict[str, float], dict[str, float]]:
    """When each run was followed up and begun, from the stamps Redis holds (the `follow_up`
    event's id; the `touched` its RUN_BEGIN wrote, on the worker's clock), not from when a poll
    saw them: the polls only say when every run has begun, so they can be sparse (every `poll` s
    from a second after the tick, each reading the runs not begun yet: little load on the Redis it
    measures), up to 120 s after the tick. A begin is stamped by the worker that made it; a step
    begun twice (redelivered) keeps the later stamp, so a time can be late, never early."""
    began: dict[str, float] = {}
    left = list(run_ids)
    time.sleep(max(0.0, tick + 1.0 - time.time()))
    while time.time() < tick + 120 and left:
        for run_id, (segment, status, touched) in zip(
            left, progress(client, left), strict=True
        ):
            if segment >= 1 and status != "queued":
                began[run_id] = touched
        left = [run_id for run_id in left if run_id not in began]
        if left:
            time.sleep(poll)
    return follow_up_times(client, run_ids, tick), began


def when(seen: dict[str, float], runs: int, tick: float, share: float) -> str:
    """Seconds after the tick by which `share` of the runs were seen ("-": not that many)."""
    times = sorted(seen.values())
    need = max(1, int(runs * share))
    return f"{times[need - 1] - tick:.2f} s" if len(times) >= need else "-"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument(
        "--poll",
        type=float,
        default=1.0,
        help="seconds between two reads of the runs' states (each reads every run not begun; "
        "the times come from Redis's stamps, not from the polls)",
    )
    parser.add_argument(
        "--provider-nice",
        type=int,
        default=19,
        help="the CPU weight of the simulator's session (autogroup nice, -20..19; default 19: it "
        "stands for the provider's machines, so it takes the CPU the system under test leaves)",
    )
    parser.add_argument(
        "--redis-nice",
        type=int,
        default=0,
        help="the CPU weight of Redis's session (autogroup nice; default 0: an equal share with "
        "each worker, the simulator and the bench; -10: Redis has a core when it wants one, as on "
        "a host of its own)",
    )
    parser.add_argument(
        "--sweep-interval",
        type=float,
        default=15.0,
        help="TOOLLOOP_SWEEP_INTERVAL of the workers (the full sweep of live runs; default: the "
        "workers' own default, 15 s; the schedules fire once a second whatever it is)",
    )
    args = parser.parse_args()
    runs = args.runs
    with (
        private_redis("bench-schedules-") as (tmp, url),
        sim_process(tmp) as (sim_url, sim_pid),
    ):
        ports = [free_port(), free_port()]
        env = {
            **REGISTRY,
            "REDIS_URL": url,
            "ANTHROPIC_BASE_URL": sim_url,
            "ANTHROPIC_API_KEY": "sim-key",
            "TOOLLOOP_PROMPT_GEN": "",
            "TOOLLOOP_SWEEP_INTERVAL": repr(args.sweep_interval),
            "TOOLLOOP_STEPS_IN_FLIGHT": str(runs),
        }
        os.environ.update({**REGISTRY, "REDIS_URL": url})
        client = Client(url)
        redis_pid = int(client.redis.info("server")["process_id"])
        shares = {
            "simulator": cpu_share(sim_pid, args.provider_nice),
            "Redis": cpu_share(redis_pid, args.redis_nice),
        }
        workers = [
            Worker(
                "workers.app",
                pool="threads",
                concurrency=8,
                queues=["llm", "tools", "control"],
                env=env_with(**env, TOOLLOOP_METRICS_PORT=str(port)),
                log=tmp / f"worker-{i}.log",
            )
            for i, port in enumerate(ports)
        ]
        try:
            for worker in workers:
                worker.start(client.celery)
            print(f"{runs:,} runs to `done` (one model call each) ...", file=sys.stderr)
            run_ids: list[str] = []
            for first in range(0, runs, 1000):
                run_ids += client.enqueue_many(
                    [run_spec(1, max_steps=4) for _ in range(min(1000, runs - first))]
                )
            ended = wait_all(client, run_ids, timeout=600)
            assert {s.status for s in ended} == {"done"}, {s.status for s in ended}

            def add(run_id: str, cron: str) -> str:
                return client.schedule(
                    send_to=run_id, content=MESSAGE, cron=cron, add_max_steps=1
                )

            with ThreadPoolExecutor(8) as pool:  # the adds' round trips overlap
                started = time.monotonic()
                # a sample, removed after
                list(pool.map(add, run_ids[:200], ["0 0 1 1 *"] * 200))
                per_add = (time.monotonic() - started) / 200
                for sid in client.redis.zrange(keys.SCHEDULES_ALL, 0, -1):
                    client.remove_schedule(str(sid))
                cron, tick = tick_second(10 + 2 * per_add * runs)
                before = int(client.redis.info("memory")["used_memory"])
                started = time.monotonic()
                ids = list(pool.map(add, run_ids, [cron] * runs))
            added_s = time.monotonic() - started
            grown = (int(client.redis.info("memory")["used_memory"]) - before) / runs
            sample = ids[:: max(1, runs // 200)]
            usage = [
                int(client.redis.memory_usage(keys.schedule(sid)) or 0)
                + int(client.redis.memory_usage(keys.schedule_def(sid)) or 0)
                for sid in sample
            ]
            rewrite_aof(client)
            if time.time() >= tick:
                raise SystemExit(
                    f"Adding {runs:,} schedules took {added_s:.1f} s, past the tick: raise the lead."
                )
            print(
                f"{runs:,} schedules added in {added_s:.1f} s; the tick is in {tick - time.time():.1f} s",
                file=sys.stderr,
            )
            forks = int(client.redis.info("stats")["total_forks"])
            pids = {
                "Redis": redis_pid,
                **{
                    f"worker {i + 1}": worker.process.pid
                    for i, worker in enumerate(workers)
                    if worker.process
                },
                "simulator": sim_pid,
                "bench": os.getpid(),
            }
            cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
            watched = time.time()
            woken, began = watch(client, run_ids, tick, args.poll)
            watched = time.time() - max(watched, tick)
            for name, pid in pids.items():
                (ran, waited), (ran0, waited0) = cpu_seconds(pid), cpu[name]
                cpu[name] = (ran - ran0, waited - waited0)
            forks = int(client.redis.info("stats")["total_forks"]) - forks
            time.sleep(2.0)  # the next tick is an hour away: let both sweepers settle
            pipe = client.redis.pipeline(transaction=False)
            for sid in ids:
                pipe.hget(keys.schedule(sid), "fired")
            for run_id in run_ids:
                pipe.hget(keys.state(run_id), "segment")
                pipe.hlen(keys.sends(run_id))
            read = pipe.execute()
            fired = [int(v or 0) for v in read[:runs]]
            segments = [int(v or 0) for v in read[runs::2]]
            sends = [int(v or 0) for v in read[runs + 1 :: 2]]
            counted = [fires(port) for port in ports]
        finally:
            for worker in workers:
                worker.stop()
            client.close()
    double = (
        sum(f > 1 for f in fired)
        + sum(s > 1 for s in segments)
        + sum(n > 1 for n in sends)
    )
    total_fired = sum(c.get("fired", 0) for c in counted)
    taken = sum(c.get("taken", 0) for c in counted)

    ran = None if len(began) < runs else max(began.values()) - tick
    print(
        f"schedules: {runs:,} runs parked `done`, woken by one cron tick ({cron!r}), two workers sweeping"
    )
    print(
        "  CPU shares        "
        + ", ".join(f"{name} {how}" for name, how in shares.items())
        + f"; full sweep every {args.sweep_interval:g} s"
    )
    for label, seen in (("followed up", woken), ("running", began)):
        shares = ", ".join(
            f"{share:.0%} {when(seen, runs, tick, share)}" for share in (0.5, 0.9, 1.0)
        )
        target = f"      target 100% <= {WAKE_S:g} s" if seen is began else ""
        print(f"  {label:17} {shares} after the tick{target}")
    within = [sum(t - tick <= WAKE_S for t in seen.values()) for seen in (woken, began)]
    print(
        f"  within {WAKE_S:g} s       {within[0]:,} followed up, {within[1]:,} running"
    )
    print(
        f"  double fires      {double}   (schedules fired twice, runs continued twice)      target 0"
    )
    print(
        f"  fires counted     {total_fired:,.0f} of {runs:,} (worker 1 {counted[0].get('fired', 0):,.0f}, "
        f"worker 2 {counted[1].get('fired', 0):,.0f}; taken by the other first: {taken:,.0f})"
    )
    print(f"  never fired       {sum(f == 0 for f in fired)}")
    print(
        f"  Redis forks       {forks} during the watch (an AOF rewrite: its child takes a core)"
    )
    print(
        f"  CPU, {watched:.1f} s from the tick to the watch's end (on a core / waiting for one): "
        + ", ".join(
            f"{name} {ran:.2f} / {waited:.2f} s" for name, (ran, waited) in cpu.items()
        )
    )
    print(
        f"  Redis/schedule    {max(usage):,} B MEMORY USAGE (hash + definition, max of {len(usage)}), "
        f"{grown:,.0f} B used_memory growth (with its index entries)      target <= {BYTES:,} B"
    )
    ok = (
        ran is not None
        and ran <= WAKE_S
        and double == 0
        and max(usage) <= BYTES
        and grown <= BYTES
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
