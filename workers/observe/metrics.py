"""Prometheus metrics of one worker process, served on TOOLLOOP_METRICS_PORT (`toolloop worker
--metrics-port`; unset or 0: off, and no metric is counted), bound to TOOLLOOP_METRICS_HOST
(127.0.0.1 unless told otherwise: 0.0.0.0 for a scraper on another host).

Every metric lives in a registry of this process's `Metrics` (not prometheus_client's global one),
created when the worker starts (`WorkerProcess.metrics`, workers/process/worker_process.py). What advance.py
counts comes through its hooks (`step_began`, `work_began`, `committed` ...); the queue depths and
the oldest waiting step's age are read from Redis when the endpoint is scraped (a pipeline of LLEN,
one of LINDEX, nothing in between scrapes).

    toolloop_steps_started_total{kind,queue}     a step's live work began (kind: model, tool)
    toolloop_steps_committed_total{kind,queue}   a step's value was committed
    toolloop_steps_replayed_total{queue}         stored steps a task replayed instead of running
    toolloop_steps_rerun_total{kind,queue}       live work begun by a task delivered more than once
    toolloop_step_seconds{kind,queue}            task begin to commit (histogram)
    toolloop_model_calls_total{provider,status}  model calls: status "ok", "fell_back" (a capacity or
                                                 unavailable error: the next provider was tried) or
                                                 the error's class
    toolloop_model_fallbacks_total{from_provider,to_provider}  calls a fallback provider answered
    toolloop_spend_usd_total                     cost of committed steps
    toolloop_prompt_tokens_total{cache}          committed model calls' prompt tokens: read, write, uncached
    toolloop_completion_tokens_total             their completion tokens
    toolloop_runs_total{status}                  runs this worker ended (done, failed, budget...)
    toolloop_runs_parked_total                   runs parked on a question
    toolloop_leases_lost_total                   steps stopped because their lease was lost
    toolloop_outbox_resent_total                 successors the sweeper sent again
    toolloop_sweeper_redrives_total              runs the sweeper re-drove
    toolloop_children_started_total              child runs `spawn` started (workers/step/children.py)
    toolloop_children_ended_total{status}        child runs this worker ended, by status
    toolloop_schedule_fires_total{outcome}       schedule ticks this worker's sweeper settled: fired,
                                                 skipped, held, missed, failed, taken (another
                                                 worker claimed it), error (workers/runs/scheduler.py)
    toolloop_queue_depth{queue}                  messages waiting (all priorities), read on scrape
    toolloop_queue_oldest_seconds{queue}         how long the oldest of them has waited (0: none),
                                                 read on scrape (workers/observe/queueage.py)
    toolloop_steps_in_flight                     steps this process runs now (its step consumer),
                                                 read on scrape: with the depth, what an autoscaler
                                                 reads (docs/operations.md, "Autoscaling")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from toolloop.loop.tools import call
from toolloop.loop.types import LoopEvent, ModelEvent

log = logging.getLogger("toolloop.workers")

_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    900,
)


def kind_of(key: str) -> str:
    """The kind of a journal key: "model" or "tool" ("" for none)."""
    return key.partition(":")[0]


class Metrics:
    """This process's metrics and the endpoint that serves them."""

    def __init__(
        self,
        depths: Callable[[], dict[str, int]] | None = None,
        in_flight: Callable[[], int] | None = None,
        oldest: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        labels = ("kind", "queue")
        self.started = Counter(
            "toolloop_steps_started",
            "Steps whose live work began",
            labels,
            registry=registry,
        )
        self.committed = Counter(
            "toolloop_steps_committed", "Steps committed", labels, registry=registry
        )
        self.replayed = Counter(
            "toolloop_steps_replayed",
            "Stored steps replayed instead of run",
            ["queue"],
            registry=registry,
        )
        self.rerun = Counter(
            "toolloop_steps_rerun",
            "Live work begun by a task delivered more than once",
            labels,
            registry=registry,
        )
        self.latency = Histogram(
            "toolloop_step_seconds",
            "A step from its task's begin to its commit",
            labels,
            buckets=_BUCKETS,
            registry=registry,
        )
        self.model_calls = Counter(
            "toolloop_model_calls",
            "Model calls by provider and status",
            ["provider", "status"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "toolloop_model_fallbacks",
            "Model calls answered by another provider than the one tried first",
            ["from_provider", "to_provider"],
            registry=registry,
        )
        self.spend = Counter(
            "toolloop_spend_usd", "Cost of committed steps, USD", registry=registry
        )
        self.prompt_tokens = Counter(
            "toolloop_prompt_tokens",
            "Prompt tokens of committed model calls by cache use",
            ["cache"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "toolloop_completion_tokens",
            "Completion tokens of committed model calls",
            registry=registry,
        )
        self.runs = Counter(
            "toolloop_runs",
            "Runs ended by this worker, by status",
            ["status"],
            registry=registry,
        )
        self.parked = Counter(
            "toolloop_runs_parked", "Runs parked on a question", registry=registry
        )
        self.leases_lost = Counter(
            "toolloop_leases_lost", "Steps stopped by a lost lease", registry=registry
        )
        self.resent = Counter(
            "toolloop_outbox_resent",
            "Successors the sweeper sent again",
            registry=registry,
        )
        self.redriven = Counter(
            "toolloop_sweeper_redrives", "Runs the sweeper re-drove", registry=registry
        )
        self.children = Counter(
            "toolloop_children_started", "Child runs spawn started", registry=registry
        )
        self.children_ended = Counter(
            "toolloop_children_ended",
            "Child runs ended by this worker, by status",
            ["status"],
            registry=registry,
        )
        self.schedule_fires = Counter(
            "toolloop_schedule_fires",
            "Schedule ticks settled by this worker's sweeper, by outcome",
            ["outcome"],
            registry=registry,
        )
        if depths is not None:
            registry.register(
                _PerQueue(
                    "toolloop_queue_depth", "Messages waiting on a step queue", depths
                )
            )
        if oldest is not None:
            registry.register(
                _PerQueue(
                    "toolloop_queue_oldest_seconds",
                    "Seconds the oldest message on a step queue has waited",
                    oldest,
                )
            )
        if in_flight is not None:
            registry.register(_InFlight(in_flight))
        self._children: dict[tuple[Any, ...], Any] = {}
        """Bound children by (metric, *labels): `labels()` checks and locks on every call (a few µs);
        a step counts five to nine samples."""

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, bound once per label set in this process."""
        key = (metric, *labels)
        bound = self._children.get(key)
        if bound is None:
            bound = self._children[key] = metric.labels(*labels)
        return bound

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve /metrics on `addr`:`port` (a daemon thread of prometheus_client); the loopback
        interface only unless told otherwise (TOOLLOOP_METRICS_HOST)."""
        start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", addr, port)

    # -- hooks of workers/step/advance.py --------------------------------------------------------------

    def work_began(self, key: str, queue: str, delivered: int) -> None:
        kind = kind_of(key)
        self.child(self.started, kind, queue).inc()
        if delivered > 1:
            self.child(self.rerun, kind, queue).inc()

    def committed_step(
        self,
        key: str,
        queue: str,
        cost_usd: float,
        began: float,
        replayed: int,
        events: Iterable[LoopEvent],
    ) -> None:
        if replayed:
            self.child(self.replayed, queue).inc(replayed)
        if not key:
            return
        kind = kind_of(key)
        self.child(self.committed, kind, queue).inc()
        self.child(self.latency, kind, queue).observe(time.monotonic() - began)
        if cost_usd:
            self.spend.inc(cost_usd)
        for event in events:
            if isinstance(event, ModelEvent):
                usage = event.usage
                self.child(self.prompt_tokens, "read").inc(usage.cached_tokens)
                self.child(self.prompt_tokens, "write").inc(usage.cache_write_tokens)
                uncached = (
                    usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
                )
                self.child(self.prompt_tokens, "uncached").inc(max(0, uncached))
                self.completion_tokens.inc(usage.completion_tokens)

    def model_call(self, provider: str, status: str) -> None:
        self.child(self.model_calls, provider, status).inc()

    def run_ended(self, status: str) -> None:
        self.child(self.runs, status).inc()

    def children_started(self, count: int) -> None:
        self.children.inc(count)

    def child_ended(self, status: str) -> None:
        self.child(self.children_ended, status).inc()

    def swept(self, done: dict[str, int]) -> None:
        self.resent.inc(done.get("resent", 0))
        self.redriven.inc(done.get("redriven", 0))

    def fires(self, done: dict[str, int]) -> None:
        """Schedule ticks settled by one `Scheduler.fire_due`, by outcome."""
        for outcome, count in done.items():
            self.child(self.schedule_fires, outcome).inc(count)


class _InFlight(Collector):
    """toolloop_steps_in_flight, read from the step consumer when scraped."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self) -> Iterable[Any]:
        family = GaugeMetricFamily(
            "toolloop_steps_in_flight", "Steps this worker process runs now"
        )
        family.add_metric([], self.count())
        yield family

    def describe(self) -> Iterable[Any]:
        return [
            GaugeMetricFamily(
                "toolloop_steps_in_flight", "Steps this worker process runs now"
            )
        ]


class _PerQueue(Collector):
    """A gauge per step queue read from Redis when scraped: toolloop_queue_depth, and
    toolloop_queue_oldest_seconds (workers/observe/queueage.py)."""

    def __init__(
        self, name: str, text: str, read: Callable[[], dict[str, Any]]
    ) -> None:
        self.name, self.text, self.read = name, text, read

    def collect(self) -> Iterable[Any]:
        family = GaugeMetricFamily(self.name, self.text, labels=["queue"])
        try:
            values = self.read()
        except Exception as error:  # a scrape must answer even when Redis does not
            log.warning(
                "metrics: %s not read: %s: %s", self.name, type(error).__name__, error
            )
            values = {}
        for queue, value in values.items():
            family.add_metric([queue], value)
        yield family

    def describe(self) -> Iterable[Any]:
        return [GaugeMetricFamily(self.name, self.text, labels=["queue"])]


def counted(generate: Any, provider: str | None, metrics: Metrics) -> Any:
    """`generate` counting each call in toolloop_model_calls_total (provider: the one that answered,
    as `result.meta["provider"]` names it, else the run's)."""

    async def counting(request: Any, signal: Any) -> Any:
        try:
            result = await call(generate, request, signal)
        except BaseException as error:
            metrics.model_call(provider or "default", type(error).__name__)
            raise
        meta = getattr(result, "meta", None) or {}
        answered = str(meta.get("provider") or provider or "default")
        for failed in (
            meta.get("fallback_from") or []
        ):  # providers/facade.py moved on from these
            metrics.model_call(str(failed.get("provider")), "fell_back")
            metrics.fallbacks.labels(str(failed.get("provider")), answered).inc()
        metrics.model_call(answered, "ok")
        return result

    return counting
