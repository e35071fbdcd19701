"""The model call of a durable run's step: every wrapper around it, listed in one place, in order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest
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


def model_supports(
    process: WorkerProcess, spec: RunSpec
) -> Callable[[str, str], bool] | None:
    """What the run's model has on the head of its provider chain (`PromptGen.supports`, from the
    model catalogue): how a context policy compacts (docs/context.md)."""
    asks = getattr(process.prompt_gen, "supports", None)
    if not callable(asks):
        return None

    def supports(feature: str, model: str) -> bool:
        return bool(asks(feature, model, provider=spec.provider))

    return supports


def model_count_tokens(
    process: WorkerProcess, spec: RunSpec
) -> Callable[[PromptGenRequest, AbortSignal], Awaitable[int | None]] | None:
    """The provider's token count of a request (`PromptGen.count_tokens`, the run's provider), asked
    by a context policy near its threshold (docs/context.md)."""
    counts = getattr(process.prompt_gen, "count_tokens", None)
    if not callable(counts):
        return None

    async def count_tokens(
        request: PromptGenRequest, signal: AbortSignal
    ) -> int | None:
        found = await counts(request, signal=signal, provider=spec.provider)
        return None if found is None else int(found)

    return count_tokens
