"""The durable-run figures of bench/durable.py, on a real `workers.app` worker and a private server.

- `per_step`: one run at a time with the zero-latency scripted model of `_durable_agent` (N model
  steps, N-1 tool steps); seconds per step = (last commit - enqueue) / steps, from the run's own
  `created` and `touched` timestamps (one host's clock).
- `in_flight`: R runs at once whose model is the provider simulator over real HTTP at 1 s latency
  (providers.from_env, as in production). All runs are enqueued while the worker consumes only
  `tools,control`; the clock starts when it is told to consume `llm` too. Ideal wall time is
  (model turns x latency); "of ideal" = ideal / measured.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _procs import Worker, env_with

from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys

TOOLSET = "durable"
"""The benchmark's toolset, registered for its workers and clients as `durable=_durable_agent:TOOLS`."""
REGISTRY = {"TOOLLOOP_TOOLSETS": f"{TOOLSET}=_durable_agent:TOOLS"}
AGENT = {"TOOLLOOP_PROMPT_GEN": "_durable_agent:make_generate", **REGISTRY}


def run_spec(turns: int, **extra: Any) -> dict[str, Any]:
    user = {"role": "user", "content": "Review the rough cut, shot by shot."}
    system = f"You review storyboards. turns={turns}"
    return {
        "model": "claude-sonnet-5-5",
        "system": system,
        "toolset": TOOLSET,
        "max_steps": turns + 1,
        "budget_usd": 100.0,
        "messages": [user],
        **extra,
    }


def wait_all(client: Client, run_ids: list[str], timeout: float) -> list[Any]:
    """The statuses of `run_ids` once none is queued or running. Polls every status in one pipelined
    round trip twice a second, so the benchmark itself takes little CPU from the worker it measures."""
    deadline = time.monotonic() + timeout
    while True:
        pipe = client.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(keys.state(run_id), "status")
        pending = sum(status in ("queued", "running") for status in pipe.execute())
        if not pending:
            return [client.status(run_id) for run_id in run_ids]
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{pending} of {len(run_ids)} runs still running after {timeout:.0f} s"
            )
        time.sleep(0.5 if len(run_ids) > 1 else 0.05)


def step_worker(
    mode: str,
    pool: tuple[str, int],
    env: dict[str, str],
    log: Path,
    held: tuple[str, ...] = (),
) -> Worker:
    """A `workers.app` worker whose steps run on the step consumer (`mode` "consumer", the production
    default) or as Celery tasks in its pool ("celery"); `held` step queues are left out until the
    bench adds them (`start_queue`)."""
    steps = [q for q in ("llm", "tools") if q not in held]
    if mode == "consumer":
        extra = ["--step-queues", ",".join(steps), "--steps-in-flight", str(pool[1])]
        return Worker(
            "workers.app",
            pool=pool[0],
            concurrency=8,
            queues=["control"],
            env=env,
            log=log,
            extra=extra,
        )
    return Worker(
        "workers.app",
        pool=pool[0],
        concurrency=pool[1],
        queues=[*steps, "control"],
        env=env,
        log=log,
        extra=["--step-queues", "none"],
    )


def start_queue(client: Client, mode: str, workers: list[Worker], queue: str) -> None:
    names = [worker.name for worker in workers]
    if mode == "consumer":
        client.celery.control.broadcast(
            "add_step_queue",
            arguments={"queue": queue},
            destination=names,
            reply=True,
            timeout=10,
        )
    else:
        client.celery.control.add_consumer(
            queue, destination=names, reply=True, timeout=10
        )


def per_step(
    url: str, tmp: Path, pool: tuple[str, int], turns: int, trials: int, mode: str
) -> dict[str, Any]:
    env = env_with(REDIS_URL=url, **AGENT)
    worker = step_worker(mode, pool, env, tmp / f"durable-worker-{mode}.log")
    client = Client(url, toolsets=[TOOLSET])
    steps = 2 * turns - 1
    per: list[float] = []
    try:
        worker.start(client.celery)
        for trial in range(
            trials + 1
        ):  # the first run warms the worker up and is not counted
            run_id = client.enqueue(run_spec(turns))
            (status,) = wait_all(client, [run_id], timeout=120)
            if status.status != "done":
                raise RuntimeError(
                    f"bench run ended {status.status}: {status.error_message}"
                )
            if trial:
                per.append((status.updated_at - status.created_at) / steps)
    finally:
        worker.stop()
        client.close()
    return {"per_step_s": statistics.median(per), "trials": per, "steps": steps}


def sim_script(turns: int, answer_tokens: int = 0) -> list[dict[str, Any]]:
    """The simulator's answers: a `note` call on each of the first turns - 1 turns, then the end;
    each text `answer_tokens` 4-character pieces longer (a streamed answer's length)."""
    more = " ok." * answer_tokens
    note = [{"name": "note", "input": {"shot": 1, "text": "ok"}}]
    calls = [
        {
            "text": f"Shot {n}.{more}",
            "tool_calls": [{**note[0], "input": {"shot": n, "text": "ok"}}],
        }
        for n in range(1, turns)
    ]
    return [*calls, {"text": f"Reviewed.{more}"}]


def sim_env(url: str, sim: SimServer) -> dict[str, str]:
    """A worker's environment whose model is the anthropic provider pointed at `sim`."""
    return env_with(
        REDIS_URL=url,
        **REGISTRY,
        ANTHROPIC_BASE_URL=sim.base_url,
        ANTHROPIC_API_KEY="sim-key",
        TOOLLOOP_PROMPT_GEN="",
    )


def in_flight(
    url: str,
    tmp: Path,
    runs: int,
    turns: int,
    latency: float,
    processes: int = 1,
    mode: str = "consumer",
    extra_env: dict[str, str] | None = None,
    spec_extra: dict[str, Any] | None = None,
    answer_tokens: int = 0,
    tokens_per_s: float | None = None,
    settle: float = 0.0,
) -> dict[str, Any]:
    """`spec_extra`: more RunSpec fields (`stream`); `answer_tokens`: ~tokens of text added to every
    answer; `tokens_per_s`: the simulator's rate for streamed answers. `settle`: seconds the
    worker's CPU keeps being counted after the last run ended (work its threads finish then, such
    as a span processor's last batch)."""
    sim_kwargs = {} if tokens_per_s is None else {"tokens_per_s": tokens_per_s}
    with SimServer(
        sim_script(turns, answer_tokens), latency_s=latency, **sim_kwargs
    ) as sim:
        env = {**sim_env(url, sim), **(extra_env or {})}
        slots = -(-runs // processes)
        workers = [
            step_worker(
                mode,
                ("threads", slots),
                env,
                tmp / f"in-flight-worker-{mode}-{i}.log",
                held=("llm",),
            )
            for i in range(processes)
        ]
        client = Client(url, toolsets=[TOOLSET])
        try:
            for worker in workers:
                worker.start(client.celery)
            run_ids = [
                client.enqueue(
                    run_spec(turns, provider="anthropic", **(spec_extra or {}))
                )
                for _ in range(runs)
            ]
            cpu0 = sum(worker.cpu_seconds() for worker in workers)
            own0 = time.process_time()
            start = time.time()
            start_queue(client, mode, workers, "llm")
            profiler = workers[0].spy(turns * latency * 3)
            statuses = wait_all(
                client, run_ids, timeout=60 + 30 * turns * latency * max(1, runs / 50)
            )
            time.sleep(settle)
            cpu = sum(worker.cpu_seconds() for worker in workers) - cpu0
            own = time.process_time() - own0
            rss = sum(worker.pid_rss_mb() for worker in workers)
            if profiler:
                profiler.wait(timeout=120)
        finally:
            for worker in workers:
                worker.stop()
            client.close()
        requests = sim.stats()["requests"]
    done = [s for s in statuses if s.status == "done"]
    wall = max(s.updated_at for s in statuses) - start
    return {
        "runs": runs,
        "done": len(done),
        "wall_s": wall,
        "ideal_s": turns * latency,
        "cpu_s": cpu,
        "rss_mb": rss,
        "model_calls": requests,
        "tasks": runs * (2 * turns - 1),
        "processes": processes,
        "mode": mode,
        "sim_cpu_s": own,
    }


def streamed(
    url: str,
    tmp: Path,
    runs: int,
    turns: int,
    latency: float,
    trials: int,
    tokens: int,
    rate: float,
) -> dict[str, Any]:
    """Worker CPU per step with `stream` off, then on (the same simulator answers, `tokens` long,
    streamed at `rate` tokens/s when asked to), alternating, `trials` pairs; the medians."""
    off: list[float] = []
    on: list[float] = []
    spy = os.environ.get("BENCH_PYSPY")
    for _ in range(trials):
        for where, stream in ((off, False), (on, True)):
            if spy:  # one profile per side: <file>.off, <file>.on (the last trial's)
                os.environ["BENCH_PYSPY"] = f"{spy}.{'on' if stream else 'off'}"
            got = in_flight(
                url,
                tmp,
                runs,
                turns,
                latency,
                spec_extra={"stream": stream},
                answer_tokens=tokens,
                tokens_per_s=rate,
            )
            if got["done"] != runs:
                raise RuntimeError(
                    f"streaming bench: {got['done']}/{runs} runs done (stream={stream})"
                )
            where.append(got["cpu_s"] / got["tasks"])
    if spy:
        os.environ["BENCH_PYSPY"] = spy
    per_off, per_on = statistics.median(off), statistics.median(on)
    return {
        "runs": runs,
        "turns": turns,
        "tokens": tokens,
        "rate": rate,
        "off_cpu_per_step_s": per_off,
        "on_cpu_per_step_s": per_on,
        "ratio": per_on / per_off,
        "trials_off": off,
        "trials_on": on,
    }


def observed(
    url: str, tmp: Path, runs: int, turns: int, latency: float, trials: int
) -> dict[str, Any]:
    """Worker CPU per step with tracing and metrics off, then on (TOOLLOOP_TRACES_FILE with
    TOOLLOOP_TRACES_FILE_BATCH=1: every span sampled, queued by the OpenTelemetry SDK's
    BatchSpanProcessor and encoded as JSON lines by its exporter on the processor's thread, in the
    worker process, so counted, the last batch too (`_SETTLE`); TOOLLOOP_METRICS_PORT: the
    Prometheus endpoint, scraped once a second as Prometheus would), alternating, `trials` pairs;
    the medians."""
    off: list[float] = []
    on: list[float] = []
    sampled: list[float] = []
    spans = 0
    ratio_sampler = {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    }
    for trial in range(trials):
        got = in_flight(url, tmp, runs, turns, latency, settle=_SETTLE)
        off.append(got["cpu_s"] / got["tasks"])
        for where, sampler in ((on, {}), (sampled, ratio_sampler)):
            traces = tmp / f"observe-spans-{trial}-{len(sampler)}.jsonl"
            port = _free_port()
            scraper = _Scraper(port)
            extra = {
                "TOOLLOOP_TRACES_FILE": str(traces),
                "TOOLLOOP_TRACES_FILE_BATCH": "1",
                "OTEL_BSP_SCHEDULE_DELAY": str(_BATCH_DELAY_MS),
                "TOOLLOOP_METRICS_PORT": str(port),
                **sampler,
            }
            try:
                got = in_flight(
                    url, tmp, runs, turns, latency, extra_env=extra, settle=_SETTLE
                )
            finally:
                scraper.stop()
            if got["done"] != runs or not scraper.scrapes:
                raise RuntimeError(
                    f"observed bench: {got['done']}/{runs} runs done, {scraper.scrapes} scrapes"
                )
            where.append(got["cpu_s"] / got["tasks"])
            if not sampler:
                spans = len(traces.read_text().splitlines())
    per_off, per_on, per_sampled = (
        statistics.median(off),
        statistics.median(on),
        statistics.median(sampled),
    )
    return {
        "runs": runs,
        "turns": turns,
        "off_cpu_per_step_s": per_off,
        "on_cpu_per_step_s": per_on,
        "ratio": per_on / per_off,
        "trials_off": off,
        "trials_on": on,
        "sampled_cpu_per_step_s": per_sampled,
        "sampled_ratio": per_sampled / per_off,
        "trials_sampled": sampled,
        "spans_last_trial": spans,
    }


_BATCH_DELAY_MS = 200
"""The span processor's export interval in the on trials (the SDK's default is 5 s)..."""
_SETTLE = 2 * _BATCH_DELAY_MS / 1000
"""...and the CPU counted that long past the last run, off and on alike: every span's export falls
inside the measurement (the last batch included), not in the worker's shutdown."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Scraper:
    """GET /metrics once a second in a thread (the scrape's CPU is the worker's: it is counted)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.scrapes = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.done.wait(1.0):
            try:
                urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/metrics", timeout=5
                ).read()
                self.scrapes += 1
            except OSError:
                pass  # the worker is not up yet

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


def steady(
    url: str, tmp: Path, runs: int, turns: int, latency: float, mode: str = "consumer"
) -> dict[str, Any]:
    """`runs` runs kept in flight: enqueued evenly over one model latency while the worker runs (an
    open system, as a web backend feeds it, not a burst that starts every run in the same
    millisecond), `turns` model turns each (a tool step between two). Throughput = model calls
    committed per second while every run is in flight (from the moment the last run's first model
    step committed to the moment the first run finished), against the ideal `runs / latency`."""

    with SimServer(sim_script(turns), latency_s=latency) as sim:
        env = sim_env(url, sim)
        worker = step_worker(
            mode, ("threads", runs), env, tmp / f"steady-worker-{mode}.log"
        )
        client = Client(url, toolsets=[TOOLSET])
        try:
            worker.start(client.celery)
            profiler = worker.spy(turns * latency)
            cpu0 = worker.cpu_seconds()
            start = time.time()
            run_ids = []
            for i in range(runs):
                time.sleep(max(0.0, start + i * latency / runs - time.time()))
                run_ids.append(client.enqueue(run_spec(turns, provider="anthropic")))
            statuses = wait_all(
                client, run_ids, timeout=120 + 30 * turns * latency * max(1, runs / 50)
            )
            cpu = worker.cpu_seconds() - cpu0
            if profiler:
                profiler.wait(timeout=120)
            models: list[list[float]] = []
            for run_id in run_ids:
                events = client.redis.xrange(keys.events(run_id))
                models.append(
                    [
                        int(str(eid).split("-")[0]) / 1000
                        for eid, f in events
                        if f["kind"] == "model"
                    ]
                )
        finally:
            worker.stop()
            client.close()
    done = [s for s in statuses if s.status == "done"]
    begin = max(times[0] for times in models)
    end = min(s.updated_at for s in statuses)
    committed = sum(begin < t <= end for times in models for t in times)
    window = max(end - begin, 1e-9)
    return {
        "runs": runs,
        "done": len(done),
        "turns": turns,
        "window_s": window,
        "model_calls_s": committed / window,
        "ideal_calls_s": runs / latency,
        "cpu_s": cpu,
        "tasks": runs * (2 * turns - 1),
        "mode": mode,
        "wall_s": max(s.updated_at for s in statuses) - start,
    }
