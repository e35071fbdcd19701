"""Durable-run benchmarks (DESIGN.md section 7), measured in one run on a private server:

1. per-step overhead of a durable run vs a bare self-chaining Celery task hop (target <= 1.5x);
2. CPU time to replay a 200-step journal to the next live step (target <= 20 ms);
3. runs in flight per worker process at 1 s model latency (target >= 500 at >= 80 % of ideal);
4. worker CPU per step with tracing and metrics on vs off (target <= 1.15x, docs/operations.md);
5. worker CPU per step of streaming runs (`"stream": true`, docs/streaming.md) vs the same runs not
   streamed, 500 in flight (target <= 1.10x).

    .venv/bin/python bench/durable.py [--hops 200] [--turns 20] [--trials 5] [--runs 500]

Machines here are shared and noisy: every figure is a median of trials and sits beside its floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _durable_runs import in_flight, observed, per_step, steady, streamed  # noqa: E402
from _procs import Worker, env_with, private_redis, running  # noqa: E402
from _replay import measure_replay  # noqa: E402

# The production pool (docs/operations.md), for the floor and the durable runs alike.
POOL = (os.environ.get("BENCH_POOL", "threads"), int(os.environ.get("BENCH_C", "16")))


def wait_done(client: redis.Redis, key: str, count: int, timeout: float) -> list[float]:
    """BLPOP `count` completion times from `key`."""
    times: list[float] = []
    deadline = time.monotonic() + timeout
    while len(times) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"{len(times)}/{count} chains finished within {timeout:.0f} s"
            )
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
        for trial in range(
            trials + 1
        ):  # the first chain warms the worker up and is not counted
            chain = uuid.uuid4().hex
            start = time.time()
            _bare_app.hop.apply_async((chain, 0, hops))
            (end,) = wait_done(client, f"bench:done:{chain}", 1, timeout=120)
            if trial:
                per_hop.append((end - start) / hops)
    _, source = _bare_app.production_conf()
    return {
        "per_hop_s": statistics.median(per_hop),
        "trials": per_hop,
        "settings_from": source,
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=200, help="hops per bare chain")
    parser.add_argument(
        "--turns", type=int, default=20, help="model turns per durable run (2N-1 steps)"
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--runs", type=int, default=500, help="runs in flight for the last figure"
    )
    parser.add_argument(
        "--flight-turns", type=int, default=3, help="model turns of each run in a burst"
    )
    parser.add_argument(
        "--steady-turns",
        type=int,
        default=10,
        help="model turns of each run kept in flight",
    )
    parser.add_argument(
        "--steady-trials",
        type=int,
        default=3,
        help="trials of the runs kept in flight (median)",
    )
    parser.add_argument(
        "--latency", type=float, default=1.0, help="simulated model latency, s"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes sharing the runs in flight",
    )
    parser.add_argument(
        "--observe-runs",
        type=int,
        default=100,
        help="runs in flight for the on/off figure",
    )
    parser.add_argument(
        "--observe-turns", type=int, default=5, help="model turns of each of those runs"
    )
    parser.add_argument(
        "--observe-trials", type=int, default=3, help="off/on pairs (median)"
    )
    parser.add_argument(
        "--stream-runs",
        type=int,
        default=500,
        help="runs in flight for the streaming figure",
    )
    parser.add_argument(
        "--stream-turns", type=int, default=3, help="model turns of each of those runs"
    )
    parser.add_argument(
        "--stream-trials", type=int, default=3, help="off/on pairs (median)"
    )
    parser.add_argument(
        "--stream-tokens", type=int, default=200, help="tokens of each streamed answer"
    )
    parser.add_argument(
        "--stream-rate", type=float, default=200.0, help="the simulator's tokens/s"
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated: floor,step,replay,steady,flight,observe,stream",
    )
    parser.add_argument(
        "--modes",
        default="consumer,celery",
        help="how steps run, comma-separated: consumer (the step consumer, production default), celery "
        "(Celery tasks in the threads pool)",
    )
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    results: dict[str, Any] = {}
    load = os.getloadavg()[0]
    with private_redis("toolloop-bench-") as (tmp, url):
        if "floor" not in skip:
            results["floor"] = bare_hop_floor(url, tmp, args.hops, args.trials)
            print(f"  floor: {results['floor']}", file=sys.stderr)
        modes = [m for m in args.modes.split(",") if m]
        for mode in modes if "step" not in skip else []:
            results[f"step:{mode}"] = per_step(
                url, tmp, POOL, args.turns, args.trials, mode
            )
            print(f"  step ({mode}): {results[f'step:{mode}']}", file=sys.stderr)
        if "replay" not in skip:
            results["replay"] = measure_replay(200, trials=20)
            print(
                f"  replay: {results['replay']['cpu_s'] * 1000:.2f} ms", file=sys.stderr
            )
        for mode in modes if "steady" not in skip else []:
            trials = [
                steady(url, tmp, args.runs, args.steady_turns, args.latency, mode)
                for _ in range(args.steady_trials)
            ]
            trials.sort(key=lambda kept: kept["model_calls_s"])
            rates = [kept["model_calls_s"] for kept in trials]
            results[f"steady:{mode}"] = {
                **trials[len(trials) // 2],
                "trials_calls_s": rates,
            }
            print(f"  steady ({mode}): {results[f'steady:{mode}']}", file=sys.stderr)
        for mode in modes if "flight" not in skip else []:
            results[f"flight:{mode}"] = in_flight(
                url,
                tmp,
                args.runs,
                args.flight_turns,
                args.latency,
                args.processes,
                mode,
            )
            print(f"  flight ({mode}): {results[f'flight:{mode}']}", file=sys.stderr)
        if "observe" not in skip:
            results["observe"] = observed(
                url,
                tmp,
                args.observe_runs,
                args.observe_turns,
                args.latency,
                args.observe_trials,
            )
            print(f"  observe: {results['observe']}", file=sys.stderr)
        if "stream" not in skip:
            results["stream"] = streamed(
                url,
                tmp,
                args.stream_runs,
                args.stream_turns,
                args.latency,
                args.stream_trials,
                args.stream_tokens,
                args.stream_rate,
            )
            print(f"  stream: {results['stream']}", file=sys.stderr)
    print_table(results, args, load)
    return 0


MODES = {"consumer": "step consumer", "celery": "Celery threads pool"}


def stream_rows(
    streaming: dict[str, Any] | None,
) -> list[tuple[str, str, str, float, bool]]:
    """The streaming figure's row (none when it was skipped)."""
    if not streaming:
        return []
    return [
        (
            f"streaming on vs off, {streaming['runs']} in flight, CPU per step",
            ms(streaming["on_cpu_per_step_s"]),
            "<= 1.10 x off",
            streaming["ratio"],
            streaming["ratio"] <= 1.10,
        )
    ]


def print_table(results: dict[str, Any], args: argparse.Namespace, load: float) -> None:
    print(
        f"\ndurable runs, one worker process, private Redis on loopback, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print(f"{'figure':<52} {'ours':>10} {'floor/target':>14} {'ratio':>7}  verdict")
    rows: list[tuple[str, str, str, float, bool]] = []
    floor = results.get("floor")
    if floor:
        rows.append(
            (
                "bare Celery hop (floor), per hop",
                ms(floor["per_hop_s"]),
                "-",
                float("nan"),
                True,
            )
        )
    for mode, how in MODES.items():
        step = results.get(f"step:{mode}")
        if floor and step:
            ratio = step["per_step_s"] / floor["per_hop_s"]
            rows.append(
                (
                    f"durable step, {how}, per step",
                    ms(step["per_step_s"]),
                    "<= 1.5 x floor",
                    ratio,
                    ratio <= 1.5,
                )
            )
    replay = results.get("replay")
    if replay:
        rows.append(
            (
                "replay 200-step journal to next live step, CPU",
                ms(replay["cpu_s"]),
                "<= 20 ms",
                replay["cpu_s"] / 0.020,
                replay["cpu_s"] <= 0.020,
            )
        )
    steadies = [
        (MODES[mode], results[f"steady:{mode}"])
        for mode in MODES
        if f"steady:{mode}" in results
    ]
    for how, kept in steadies:
        share = (
            kept["model_calls_s"] / kept["ideal_calls_s"]
            if kept["done"] == kept["runs"]
            else 0.0
        )
        rows.append(
            (
                f"{kept['runs']} kept in flight at {args.latency:g} s, {how}",
                f"{share:.0%}",
                ">= 80 % ideal",
                share / 0.8,
                share >= 0.8,
            )
        )
    flights = [
        (MODES[mode], results[f"flight:{mode}"])
        for mode in MODES
        if f"flight:{mode}" in results
    ]
    for how, flight in flights:
        share = (
            flight["ideal_s"] / flight["wall_s"]
            if flight["done"] == flight["runs"]
            else 0.0
        )
        where = (
            "" if flight["processes"] == 1 else f" ({flight['processes']} processes)"
        )
        rows.append(
            (
                f"{flight['runs']} started at once, {how}{where}",
                f"{share:.0%}",
                "(makespan)",
                float("nan"),
                True,
            )
        )
    seen = results.get("observe")
    if seen:
        rows.append(
            (
                "tracing + metrics on vs off, worker CPU per step",
                ms(seen["on_cpu_per_step_s"]),
                "<= 1.15 x off",
                seen["ratio"],
                seen["ratio"] <= 1.15,
            )
        )
        rows.append(
            (
                "  the same, 10 % of runs' traces sampled",
                ms(seen["sampled_cpu_per_step_s"]),
                "<= 1.15 x off",
                seen["sampled_ratio"],
                seen["sampled_ratio"] <= 1.15,
            )
        )
    rows += stream_rows(results.get("stream"))
    for name, ours, target, ratio, ok in rows:
        shown = "" if ratio != ratio else f"{ratio:.2f}"
        verdict = "-" if target in ("-", "(makespan)") else ("met" if ok else "MISSED")
        print(f"{name:<52} {ours:>10} {target:>14} {shown:>7}  {verdict}")
    for how, kept in steadies:
        print(
            f"  kept in flight, {how}: {kept['done']}/{kept['runs']} done, {kept['turns']} turns each; "
            f"{kept['model_calls_s']:.0f} model calls/s over {kept['window_s']:.1f} s with all "
            f"{kept['runs']} in flight (ideal {kept['ideal_calls_s']:.0f}/s); "
            f"{kept['cpu_s'] * 1000 / kept['tasks']:.1f} ms worker CPU per step; median of "
            f"{', '.join(f'{c:.0f}' for c in kept['trials_calls_s'])} calls/s"
        )
    for how, flight in flights:
        steps_per_s = flight["tasks"] / flight["wall_s"]
        cpu_ms = flight["cpu_s"] * 1000 / flight["tasks"]
        print(
            f"  in flight, {how}: {flight['done']}/{flight['runs']} done in {flight['wall_s']:.1f} s "
            f"(ideal {flight['ideal_s']:.1f} s), {flight['model_calls']} model calls, {steps_per_s:.0f} "
            f"steps/s, {cpu_ms:.1f} ms worker CPU per step, {flight['rss_mb']:.0f} MB"
        )

    if seen:
        print(
            f"  tracing + metrics: {seen['runs']} runs x {seen['turns']} turns in flight, "
            f"{ms(seen['off_cpu_per_step_s'])} off, {ms(seen['on_cpu_per_step_s'])} on per step "
            f"(medians of off {', '.join(ms(t) for t in seen['trials_off'])}; on "
            f"{', '.join(ms(t) for t in seen['trials_on'])}; 10 % sampled "
            f"{', '.join(ms(t) for t in seen['trials_sampled'])}); {seen['spans_last_trial']} spans exported"
        )


if __name__ == "__main__":
    raise SystemExit(main())
