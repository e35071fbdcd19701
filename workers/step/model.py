"""The model call of a durable run's step: every wrapper around it, listed in one place, in order."""

from __future__ import annotations

from typing import Any

from toolloop.loop.types import Generate
from workers.flow import limiter as flow
from workers.observe.metrics import Metrics, counted
from workers.process.deltas import DeltaStream, streaming
from workers.process.worker_process import WorkerProcess
from workers.protocol.spec import RunSpec


def model_call(
    process: WorkerProcess,
    spec: RunSpec,
    metrics: Metrics | None,
    deltas: DeltaStream | None,
) -> Generate | Any:
    """The `generate` a run's loop calls, built from the inside out:

    1. the provider and its fallbacks: the process's PromptGen for `spec.provider`, moving on to
       `spec.fallback` (toolloop/providers/facade.py), each attempt with its retries and timeouts
       (toolloop/providers/call.py);
    2. metrics: each call counted by the provider that answered (`toolloop_model_calls_total`);
    3. flow control: the worker's rate limits and the run's account, booked per provider attempt
       (workers/flow/limiter.py);
    4. streaming, when the run publishes deltas: the loop's `on_delta` handed down to the provider
       (workers/process/deltas.py);
    5. tracing, outermost: the loop opens a `chat <model>` span around each call it makes
       (toolloop/telemetry.py), a child of the step's span (workers/observe/tracing.py).
    """
    generate = process.generate_for(spec.provider, spec.fallback, stream=spec.stream)
    if metrics is not None:
        generate = counted(generate, spec.provider, metrics)
    generate = flow.wrap_generate(process, generate, spec)
    if deltas is not None:
        return streaming(generate, deltas.interval)
    return generate
