"""Scale of one worker process (issue #19), measured in one run on a private server:

1. the bare Celery hop floor (bench/durable.py's, same settings), for reference in the same run;
2. `--runs` runs (default 2,000) of `--turns` model turns at `--latency` s, all in flight on ONE
   worker process (`--steps-in-flight` = runs), the provider simulator in a process of its own
   (`python -m toolloop.sim`, not the worker's and not the bench's): model calls/s against the
   ideal runs / latency, makespan, and worker CPU per step (the worker process's own CPU time);
3. `--parked` runs (default 10,000) parked on an `ask` after `--park-turns` turns (zero-latency
   scripted model): the worker's RSS before the first enqueue and once all are parked.

    .venv/bin/python bench/scale.py                                  # floor + 2,000 in flight + 10,000 parked
    .venv/bin/python bench/scale.py --skip parked --runs 500         # 500 in flight only
    .venv/bin/python bench/scale.py --skip floor,flight --trace      # parked, with tracemalloc's growth
    .venv/bin/python bench/scale.py --skip floor,parked --profile pyspy:/tmp/w.json  # py-spy speedscope
    .venv/bin/python bench/scale.py --skip floor,parked --profile cprofile:/tmp/w.prof  # cProfile

The worker is `workers.app` with two bench-only control commands (`_probe_app.py`). Machines here
are shared: repeat with `--trials` and read the medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import run_spec, sim_script  # noqa: E402
from _procs import ROOT, Worker, env_with, private_redis  # noqa: E402
from durable import bare_hop_floor  # noqa: E402

from workers.client import Client  # noqa: E402
from workers.protocol import keys  # noqa: E402

TOOLSETS = "durable=_durable_agent:TOOLS,parking=_durable_agent:PARK_TOOLS"


@contextmanager
def sim_process(tmp: Path, turns: int, latency: float) -> Iterator[tuple[str, int]]:
    """`python -m toolloop.sim` in its own process group; yields its base URL and pid."""
    script = tmp / "sim-script.json"
    script.write_text(json.dumps(sim_script(turns)))
    args = [
        sys.executable,
        "-m",
        "toolloop.sim",
        "--port",
        "0",
        "--script",
        str(script),
        "--latency",
        str(latency),
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


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads, no children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu(client: Client) -> float:
    """Redis's own CPU seconds so far (INFO cpu: main thread and its other threads)."""
    info = client.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident set (`VmHWM`: its peak so far), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def settled_rss_mb(pid: int, least: float = 5.0, most: float = 30.0) -> float:
    """The process's RSS once it holds still: at least `least` s from now (the last commits'
    batches, the kept-loop drops, the idle worker's trim 3 sweeper ticks after its last step), then
    once it moved less than 1 MB over 3 s, or after `most` s."""
    time.sleep(least)
    seen = [proc_rss_mb(pid)]
    for _ in range(int(most - least)):
        time.sleep(1)
        seen.append(proc_rss_mb(pid))
        if len(seen) >= 4 and max(seen[-4:]) - min(seen[-4:]) < 1:
            break
    return seen[-1]


def rss_by_mapping(pid: int) -> dict[str, float]:
    """The process's resident MB by kind of mapping (/proc/<pid>/smaps): `heap` (glibc's main arena,
    [heap]), `stacks` (8 MiB anonymous mappings right after a 4 KiB guard page: thread stacks),
    `arenas` (glibc's thread arenas: anonymous, 64 MiB-aligned, the rest of the 64 MiB reserved
    behind them), `anon` (other anonymous memory: pymalloc's 1 MiB arenas, glibc's mmapped chunks),
    `files` (code and data of files)."""
    maps: list[tuple[int, int, str, str, float]] = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if (
            "-" in head[0] and len(head) >= 5
        ):  # a mapping's first line: range perms offset dev inode [path]
            start, end = (int(part, 16) for part in head[0].split("-"))
            maps.append((start, end, head[1], head[5] if len(head) > 5 else "", 0.0))
        elif head[0] == "Rss:":
            maps[-1] = (*maps[-1][:4], int(head[1]) / 1024)
    kinds: Counter[str] = Counter()
    for i, (start, end, _perms, path, rss) in enumerate(maps):
        before = maps[i - 1] if i else None
        after = maps[i + 1] if i + 1 < len(maps) else None
        if path == "[heap]":
            kind = "heap"
        elif path:
            kind = "files"
        elif (
            before
            and before[1] == start
            and before[2] == "---p"
            and before[1] - before[0] == 4096
            and end - start == 8 << 20
        ):
            kind = "stacks"
        elif (
            start % (64 << 20) == 0
            and after
            and after[0] == end
            and after[2] == "---p"
            and after[1] - start == 64 << 20
        ):
            kind = "arenas"
        else:
            kind = "anon"
        kinds[kind] += rss
    return {name: round(mb, 1) for name, mb in kinds.items()}


def worker(
    tmp: Path,
    name: str,
    env: dict[str, str],
    step_queues: str,
    in_flight: int,
    pin: str = "",
) -> Worker:
    """The bench worker; `pin`: the CPUs it may run on (`taskset -c`), else any."""
    extra = ["--step-queues", step_queues, "--steps-in-flight", str(in_flight)]
    who = Worker(
        "_probe_app",
        pool="threads",
        concurrency=8,
        queues=["control"],
        env=env,
        log=tmp / f"{name}.log",
        extra=extra,
    )
    if pin:
        who.args = ["taskset", "-c", pin, *who.args]
    return who


def pin_others(pin: str) -> str:
    """Keep this process and every process it starts from now on (Redis, the simulator, the
    clients) off the worker's CPUs `pin` ("0" or "0-1"); returns the CPUs left to them."""
    first, _, last = pin.partition("-")
    taken = set(range(int(first), int(last or first) + 1))
    rest = os.sched_getaffinity(0) - taken
    if not rest:
        raise SystemExit(
            f"--pin {pin} leaves no CPU for Redis, the simulator and the clients."
        )
    os.sched_setaffinity(0, rest)
    return ",".join(str(cpu) for cpu in sorted(rest))


def control(client: Client, who: Worker, command: str, **arguments: Any) -> Any:
    replies = client.celery.control.broadcast(
        command, arguments=arguments, destination=[who.name], reply=True, timeout=60
    )
    return replies[0][who.name] if replies else None


def statuses(client: Client, run_ids: list[str]) -> Counter[str]:
    pipe = client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(keys.state(run_id), "status")
    return Counter(pipe.execute())


def wait_settled(client: Client, run_ids: list[str], timeout: float) -> Counter[str]:
    """Poll every status in one pipelined round trip per second until none is queued or running."""
    deadline = time.monotonic() + timeout
    while True:
        found = statuses(client, run_ids)
        if not found["queued"] and not found["running"]:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout:.0f} s: {dict(found)}")
        time.sleep(1.0)


def _enqueue_chunk(job: tuple[str, list[dict[str, Any]]]) -> list[str]:
    url, specs = job
    with Client(url, toolsets=["durable", "parking"]) as client:
        return [client.enqueue(spec) for spec in specs]


def enqueue_all(
    url: str, specs: list[dict[str, Any]], processes: int
) -> tuple[list[str], float]:
    """Enqueue `specs` from `processes` client processes; the run ids and the seconds it took."""
    start = time.monotonic()
    chunks = [(url, specs[i::processes]) for i in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        run_ids = [
            run_id for chunk in pool.map(_enqueue_chunk, chunks) for run_id in chunk
        ]
    return run_ids, time.monotonic() - start


@contextmanager
def profiled(how: str, client: Client, who: Worker, seconds: float) -> Iterator[None]:
    """`pyspy:<file>` (.json: speedscope, else raw collapsed stacks), `cprofile:<file>`, or ''."""
    kind, _, path = how.partition(":")
    spy = None
    if kind == "pyspy":
        assert who.process is not None
        form = "speedscope" if path.endswith(".json") else "raw"
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "-p",
                str(who.process.pid),
                "-d",
                str(int(seconds)),
                "-f",
                form,
                "-o",
                path,
                "--nonblocking",
                "--threads",
                "--rate",
                "200",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    elif kind == "cprofile":
        control(client, who, "bench_cprofile", action="start", path=path)
    try:
        yield
    finally:
        if kind == "cprofile":
            control(client, who, "bench_cprofile", action="stop", path=path)
        if spy is not None:
            spy.wait(timeout=seconds + 60)


def flight(
    url: str,
    tmp: Path,
    runs: int,
    turns: int,
    latency: float,
    profile: str,
    pin: str = "",
) -> dict[str, Any]:
    """`runs` runs enqueued while the worker does not take `llm` (after 20 warm-up runs), then all
    started at once; model calls/s counted while all are in flight (from the moment every run made
    its first model call to the moment the first run finished)."""
    with sim_process(tmp, turns, latency) as (sim_url, sim_pid):
        env = env_with(
            REDIS_URL=url,
            TOOLLOOP_TOOLSETS=TOOLSETS,
            ANTHROPIC_BASE_URL=sim_url,
            ANTHROPIC_API_KEY="sim-key",
            TOOLLOOP_PROMPT_GEN="",
        )
        who = worker(tmp, f"flight-{runs}", env, "tools", runs, pin)
        client = Client(url, toolsets=["durable"])
        try:
            who.start(client.celery)
            assert who.process is not None
            pid = who.process.pid
            # a warm-up: imports, connections
            control(client, who, "add_step_queue", queue="llm")
            warm, _ = enqueue_all(url, [run_spec(2, provider="anthropic")] * 20, 1)
            wait_settled(client, warm, timeout=60)
            control(client, who, "cancel_step_queue", queue="llm")
            run_ids, _ = enqueue_all(
                url, [run_spec(turns, provider="anthropic")] * runs, 2
            )
            rss0, cpu0, start = proc_rss_mb(pid), proc_cpu(pid), time.time()
            sim0, redis0 = proc_cpu(sim_pid), redis_cpu(client)
            with profiled(profile, client, who, turns * latency * 4):
                control(client, who, "add_step_queue", queue="llm")
                found = wait_settled(
                    client, run_ids, timeout=120 + 10 * turns * latency * runs / 100
                )
            cpu, rss = proc_cpu(pid) - cpu0, proc_rss_mb(pid)
            collector = control(client, who, "bench_probe", action="gcstats")
            if os.environ.get("BENCH_GC_YOUNG") == "1":
                collector["young"] = control(
                    client, who, "bench_probe", action="gcyoung"
                )
            sim_cpu, redis_used = proc_cpu(sim_pid) - sim0, redis_cpu(client) - redis0
            times = model_times(client, run_ids)
            ended = [float(t) for t in _field_of(client, run_ids, "touched")]
        finally:
            who.stop()
            client.close()
    begin = max(t[0] for t in times)  # every run has made its first model call
    end = min(ended)  # the first run is done
    window = max(end - begin, 1e-9)
    committed = sum(begin < t <= end for run in times for t in run)
    steps = runs * (2 * turns - 1)
    return {
        "runs": runs,
        "turns": turns,
        "done": found["done"],
        "statuses": dict(found),
        "window_s": window,
        "model_calls_s": committed / window,
        "ideal_calls_s": runs / latency,
        "wall_s": max(ended) - start,
        "ideal_s": turns * latency,
        "cpu_s": cpu,
        "steps": steps,
        "cpu_per_step_ms": cpu * 1000 / steps,
        "rss_before_mb": rss0,
        "rss_after_mb": rss,
        "sim_cpu_s": sim_cpu,
        "redis_cpu_s": redis_used,
        "gc": collector,
    }


def model_times(client: Client, run_ids: list[str]) -> list[list[float]]:
    pipe = client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrange(keys.events(run_id))
    return [
        [
            int(str(eid).split("-")[0]) / 1000
            for eid, f in events
            if f["kind"] == "model"
        ]
        for events in pipe.execute()
    ]


def _field_of(client: Client, run_ids: list[str], field: str) -> list[Any]:
    pipe = client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(keys.state(run_id), field)
    return list(pipe.execute())


def parked(
    url: str,
    tmp: Path,
    runs: int,
    turns: int,
    trace: bool,
    bursts: int = 1,
    peak: bool = False,
    warm: int = 0,
) -> dict[str, Any]:
    """Worker RSS before the first enqueue and once `runs` runs are parked on an `ask` (after 20
    warm-up runs, parked too, so imports and first-use caches are not counted); with `bursts` > 1,
    again after each further `runs` parked (what a parked run costs once the allocator has the first
    burst's high-water mark), and where the memory is (allocators, mappings) before and after.

    `warm` > 0: before the baseline, `warm` runs of the same turns that end `done` (none parks), at
    the worker's full steps in flight: the baseline then has the allocator's high-water of a burst
    at the worker's in-flight limit (what any worker that ran at its limit once keeps, parked runs
    or not), and the growth is what the parked runs themselves cost (bench/PROFILE-19.md section 8).
    With `warm` = 0 the growth also counts that high-water (the cold figure)."""
    gen = "_durable_agent:make_generate"
    env = env_with(REDIS_URL=url, TOOLLOOP_TOOLSETS=TOOLSETS, TOOLLOOP_PROMPT_GEN=gen)
    who = worker(tmp, f"parked-{runs}", env, "llm,tools", 500)
    client = Client(url, toolsets=["parking"])
    spec = run_spec(
        turns, toolset="parking", system=f"You review storyboards. turns={turns} ask"
    )
    try:
        who.start(client.celery)
        assert who.process is not None
        pid = who.process.pid
        warm_ids, _ = enqueue_all(url, [spec] * 20, 1)
        wait_settled(client, warm_ids, timeout=60)
        if warm:
            done_spec = run_spec(
                turns,
                toolset="parking",
                system=f"You review storyboards. turns={turns}",
            )
            warm_ids, _ = enqueue_all(url, [done_spec] * warm, 2)
            warmed = wait_settled(client, warm_ids, timeout=120 + warm / 10)
            assert warmed["done"] == warm, (
                f"the warm-up runs did not all end done: {dict(warmed)}"
            )
            # the idle trim after the warm-up burst, before the baseline
            settled_rss_mb(pid)
        time.sleep(2)
        if trace:
            control(client, who, "bench_probe", action="trace_start")
        if peak:
            control(client, who, "bench_probe", action="peak_start")
        before = control(client, who, "bench_probe", action="counts")
        alloc0 = control(client, who, "bench_probe", action="alloc")
        control(client, who, "bench_probe", action="arenas")
        rss0, mappings0 = proc_rss_mb(pid), rss_by_mapping(pid)
        found: Counter[str] = Counter()
        rss_after, enqueue_s = [], 0.0
        for _ in range(bursts):
            run_ids, took = enqueue_all(url, [spec] * runs, 2)
            found += wait_settled(client, run_ids, timeout=120 + runs / 10)
            enqueue_s += took
            # after the worker's idle trim (workers/worker/trim.py)
            rss_after.append(settled_rss_mb(pid))
            print(
                f"  parked: RSS {rss_after[-1]:.0f} MB once settled after the last park",
                file=sys.stderr,
            )
        rss1, peak, mappings = (
            rss_after[0],
            proc_rss_mb(pid, "VmHWM"),
            rss_by_mapping(pid),
        )
        threads = Counter(
            task.joinpath("comm").read_text().strip().rstrip("_0123456789")
            for task in Path(f"/proc/{pid}/task").iterdir()
        )
        alloc1 = control(client, who, "bench_probe", action="alloc")
        pins = control(client, who, "bench_probe", action="pins")
        garbage = control(client, who, "bench_probe", action="garbage")
        after = control(client, who, "bench_probe", action="counts")
        trim = control(client, who, "bench_probe", action="trim")
        trimmed, collected = trim["rss_kb"] / 1024, trim["collected_rss_kb"] / 1024
        grown = (
            control(client, who, "bench_probe", action="trace_diff") if trace else None
        )
        at_peak = (
            control(client, who, "bench_probe", action="peak_diff") if peak else None
        )
    finally:
        who.stop()
        client.close()
    parked_runs = runs * bursts
    return {
        "runs": runs,
        "bursts": bursts,
        "turns": turns,
        "statuses": dict(found),
        "enqueue_s": enqueue_s,
        "rss_before_mb": rss0,
        "rss_after_mb": rss1,
        "rss_growth_mb": rss1 - rss0,
        "rss_after_bursts_mb": rss_after,
        "rss_trimmed_mb": trimmed,
        "rss_collected_mb": collected,
        "rss_peak_mb": peak,
        "rss_by_mapping_before": mappings0,
        "rss_by_mapping_after": mappings,
        "threads": threads,
        "garbage_per_run": garbage["objects"] / parked_runs,
        "held_per_run": (after["objects"] - before["objects"]) / parked_runs,
        "probe_before": before,
        "probe_after": after,
        "alloc_before": alloc0,
        "alloc_after": alloc1,
        "pins": pins,
        "garbage": garbage,
        "trace": grown,
        "peak": at_peak,
        "warm": warm,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=2000, help="runs in flight on the one worker"
    )
    parser.add_argument(
        "--turns", type=int, default=10, help="model turns per run in flight"
    )
    parser.add_argument(
        "--latency", type=float, default=1.0, help="simulated model latency, s"
    )
    parser.add_argument(
        "--trials", type=int, default=1, help="trials of the in-flight figure (median)"
    )
    parser.add_argument(
        "--parked", type=int, default=10000, help="runs parked on an ask"
    )
    parser.add_argument(
        "--bursts", type=int, default=2, help="bursts of --parked runs, RSS after each"
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=2000,
        help="runs that end done at full steps in flight before the parked row's "
        "baseline (0: a cold worker, the burst's high-water counted)",
    )
    parser.add_argument(
        "--park-turns", type=int, default=3, help="model turns before the ask"
    )
    parser.add_argument("--hops", type=int, default=200)
    parser.add_argument("--floor-trials", type=int, default=5)
    parser.add_argument(
        "--skip", default="", help="comma-separated: floor,flight,parked"
    )
    parser.add_argument(
        "--profile",
        default="",
        help="pyspy:<file> or cprofile:<file> (1st in-flight trial)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="tracemalloc in the parked worker"
    )
    parser.add_argument(
        "--peak",
        action="store_true",
        help="tracemalloc in the parked worker: what a step in flight holds",
    )
    parser.add_argument("--json", default="", help="write every figure to this file")
    parser.add_argument(
        "--pin",
        default="",
        help="CPUs of the in-flight worker (taskset -c, e.g. 0); "
        "Redis, the simulator and the clients get the others",
    )
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    load = os.getloadavg()[0]
    results: dict[str, Any] = {}
    if args.pin:
        print(
            f"  pinned: the worker on CPU {args.pin}, the rest on {pin_others(args.pin)}",
            file=sys.stderr,
        )
    with private_redis("toolloop-scale-") as (tmp, url):
        if "floor" not in skip:
            results["floor"] = bare_hop_floor(url, tmp, args.hops, args.floor_trials)
            print(f"  floor: {results['floor']}", file=sys.stderr)
        if "flight" not in skip:
            trials = []
            for trial in range(args.trials):
                got = flight(
                    url,
                    tmp,
                    args.runs,
                    args.turns,
                    args.latency,
                    args.profile if trial == 0 else "",
                    args.pin,
                )
                print(f"  flight: {got}", file=sys.stderr)
                trials.append(got)
            results["flight"] = trials
        if "parked" not in skip:
            results["parked"] = parked(
                url,
                tmp,
                args.parked,
                args.park_turns,
                args.trace,
                args.bursts,
                args.peak,
                args.warm,
            )
            print(
                f"  parked: {json.dumps(results['parked'], indent=1)}", file=sys.stderr
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print_table(results, args, load)
    return 0


def print_table(results: dict[str, Any], args: argparse.Namespace, load: float) -> None:
    print(
        f"\nscale of one worker process, private Redis on loopback, simulator in its own process, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    floor = results.get("floor")
    if floor:
        print(
            f"bare Celery hop (floor): {floor['per_hop_s'] * 1000:.2f} ms per hop (median of "
            f"{', '.join(f'{t * 1000:.2f}' for t in floor['trials'])})"
        )
    trials = results.get("flight")
    if trials:
        rate = statistics.median(t["model_calls_s"] for t in trials)
        cpu = statistics.median(t["cpu_per_step_ms"] for t in trials)
        ideal = trials[0]["ideal_calls_s"]
        print(
            f"{args.runs} runs in flight x {args.turns} turns at {args.latency:g} s: {rate:.0f} calls/s "
            f"= {rate / ideal:.0%} of ideal {ideal:.0f}/s (target >= 90 %); worker CPU per step "
            f"{cpu:.3f} ms (target <= 0.3)"
        )
        for t in trials:
            print(
                f"  trial: {t['done']}/{t['runs']} done, {t['model_calls_s']:.0f} calls/s over "
                f"{t['window_s']:.1f} s, makespan {t['wall_s']:.1f} s (ideal {t['ideal_s']:.0f} s), "
                f"{t['cpu_s']:.1f} s worker CPU for {t['steps']} steps = {t['cpu_per_step_ms']:.3f} ms, "
                f"RSS {t['rss_before_mb']:.0f} -> {t['rss_after_mb']:.0f} MB; simulator CPU "
                f"{t['sim_cpu_s']:.1f} s, Redis CPU {t['redis_cpu_s']:.1f} s"
            )
            need = (
                t["ideal_calls_s"]
                * t["steps"]
                / (t["runs"] * t["turns"])
                * t["cpu_per_step_ms"]
                / 1000
            )
            busy = t["cpu_s"] / t["wall_s"]
            print(
                f"    the worker used {busy:.2f} of a core over the makespan; the ideal rate needs "
                f"{need:.2f} cores of worker CPU at this CPU per step"
            )
    kept = results.get("parked")
    if kept:
        warmed = (
            f"after {kept['warm']} runs at full steps in flight"
            if kept["warm"]
            else "on a cold worker (the burst's in-flight high-water counted)"
        )
        print(
            f"{kept['runs']} parked runs raise the worker's RSS by {kept['rss_growth_mb']:.0f} MB {warmed} "
            f"({kept['rss_before_mb']:.0f} -> {kept['rss_after_mb']:.0f} MB; target < 20 MB; "
            f"{kept['rss_trimmed_mb']:.0f} MB after gc.collect + malloc_trim; peak "
            f"{kept['rss_peak_mb']:.0f} MB); statuses {kept['statuses']}, enqueued in "
            f"{kept['enqueue_s']:.1f} s"
        )
        print(
            f"  cyclic garbage per parked run: {kept['garbage_per_run']:.2f} objects "
            f"({kept['garbage']['objects']} in all, target 0); GC-tracked objects held per parked run: "
            f"{kept['held_per_run']:.2f}"
        )
        print_memory(kept)


def print_memory(kept: dict[str, Any]) -> None:
    """Where the parked row's memory is: RSS after each burst, by mapping, and by allocator."""
    later = kept["rss_after_bursts_mb"]
    if len(later) > 1:
        steps = ", ".join(f"+{b - a:.1f}" for a, b in itertools.pairwise(later))
        print(
            f"  RSS after each burst of {kept['runs']}: {', '.join(f'{mb:.0f}' for mb in later)} MB "
            f"(each further burst: {steps} MB)"
        )
    one, two = kept["rss_by_mapping_before"], kept["rss_by_mapping_after"]
    kinds = sorted(set(one) | set(two))
    print(
        "  RSS by mapping, before -> after, MB: "
        + "; ".join(
            f"{kind} {one.get(kind, 0):.1f} -> {two.get(kind, 0):.1f}" for kind in kinds
        )
    )
    first, last = kept["alloc_before"], kept["alloc_after"]
    stats = "arenas_allocated_current"  # absent when tracemalloc runs (--peak, --trace)
    if first and last and stats in first["pymalloc"] and stats in last["pymalloc"]:
        pool_a, pool_b = first["pymalloc"], last["pymalloc"]
        mib = 1 << 20
        arenas = f"{pool_a['arenas_allocated_current']} -> {pool_b['arenas_allocated_current']}"
        used_a, used_b = (
            pool_a["bytes_in_allocated_blocks"] / mib,
            pool_b["bytes_in_allocated_blocks"] / mib,
        )
        used = f"{used_a:.1f} -> {used_b:.1f}"
        unused = (
            f"{pool_a['unused_pools'] / 64:.1f} -> {pool_b['unused_pools'] / 64:.1f}"
        )
        pins = kept["pins"]
        print(
            f"  pymalloc: arenas {arenas} (1 MiB each; peak {pool_b['arenas_highwater_mark']}), in "
            f"allocated blocks {used} MiB, unused pools {unused} MiB; the {pins['new_arenas']} arenas "
            f"the bursts added are kept by {pins['objects']} objects the collector sees"
        )
        libc_a, libc_b = first["glibc"], last["glibc"]
        system = f"{libc_a['system_kb'] / 1024:.1f} -> {libc_b['system_kb'] / 1024:.1f}"
        free = f"{libc_a['free_kb'] / 1024:.1f} -> {libc_b['free_kb'] / 1024:.1f}"
        print(
            f"  glibc: arenas {libc_a['arenas']} -> {libc_b['arenas']}, from the OS {system} MiB, of it "
            f"free {free} MiB (free pages are not resident once trimmed)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
