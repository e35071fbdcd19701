"""Tracing of durable runs: one trace per run, across its tasks, workers, retries and re-drives.

Each task of a run (a step: `advance`) is one span, `toolloop.step`, whose children are the
library's spans of the live work it did (toolloop/telemetry.py: `chat <model>`, `execute_tool
<name>`). The run's trace context is part of its record: the `traceparent` field of its state hash,
written by the enqueue when the caller has a span (the run's trace is then the caller's), else by
the commit of the run's first step (whose span starts the trace). Every later task, on whichever
worker, reads it with the run's state (RUN_BEGIN) and continues that trace; the successors this
worker sends carry it in their Celery message headers too (`traceparent`, W3C Trace Context), for
any other consumer of the queue.

The tracer provider is set up when the worker starts (`configure`), from the environment:
    OTEL_TRACES_EXPORTER=otlp (or OTEL_EXPORTER_OTLP_ENDPOINT / ..._TRACES_ENDPOINT set)
        spans go to an OTLP/HTTP collector (pip install 'toolloop[otel]'), in batches
    TOOLLOOP_TRACES_FILE=<path>
        every ended span is appended to <path> as one JSON line, at once (a killed process loses
        only the spans still open); for tests and for a look without a collector
With neither, no provider is set and every span is the API's no-op (tests/unit/test_telemetry.py
measures what that costs).
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from toolloop import telemetry

FILE_ENV = "TOOLLOOP_TRACES_FILE"
_PROPAGATOR = TraceContextTextMapPropagator()


def configure() -> bool:
    """Install this process's tracer provider from the environment (see the module docstring);
    False when nothing asks for tracing (the API's no-op stays)."""
    path = os.environ.get(FILE_ENV, "").strip()
    otlp = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "otlp" or any(
        os.environ.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    if not path and not otlp:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        raise RuntimeError(
            "Tracing is asked for (TOOLLOOP_TRACES_FILE or OTEL_EXPORTER_OTLP_*), but the OpenTelemetry "
            "SDK is not installed.\n  pip install 'toolloop[otel]', or unset those variables."
        ) from None
    service = os.environ.get("OTEL_SERVICE_NAME", "").strip() or "toolloop-worker"
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else ParentBased(ALWAYS_ON)
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    if path:
        from workers.spanfile import JsonLinesExporter

        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    if otlp:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError:
            raise RuntimeError(
                "OTLP export is asked for (OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*), but the exporter "
                "is not installed.\n  pip install 'toolloop[otel]'."
            ) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def traceparent(span: Span) -> str:
    """The W3C `traceparent` of `span` ("" for a span that is not valid)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_context(value: str | None) -> Context:
    """The context of a W3C `traceparent` (an empty one, a new trace, for none or a malformed one).
    Parsed here for the common "00-<32 hex>-<16 hex>-<2 hex>" form (the propagator's regex costs
    more than the rest of a step's tracing); anything else goes through the propagator."""
    if not value:
        return Context()
    parts = value.split("-")
    if len(parts) == 4 and parts[0] == "00" and len(parts[1]) == 32 and len(parts[2]) == 16:
        try:
            trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
        except ValueError:
            return Context()
        if trace_id and span_id:
            remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
            return trace.set_span_in_context(NonRecordingSpan(remote))
        return Context()
    return _PROPAGATOR.extract({"traceparent": value})


def current_traceparent() -> str:
    """The `traceparent` of the caller's current span ("" when none is recording)."""
    span = trace.get_current_span()
    return traceparent(span) if span.get_span_context().is_valid else ""


class StepTrace:
    """The span of one task of a run, and the context its live work runs in."""

    def __init__(self, run_id: str, n: int, parent: str | None, task_id: str) -> None:
        self.span = telemetry.tracer().start_span(
            "toolloop.step", context=parent_context(parent),
            attributes={"toolloop.run_id": run_id, "toolloop.step.n": n},
        )  # fmt: skip
        self.context = trace.set_span_in_context(self.span)
        self.recording = self.span.is_recording()
        self.valid = self.span.get_span_context().is_valid
        """False without a provider; True for a sampled-out span too (its trace id is the run's all
        the same, so that a sampler decides once per run, not once per step)."""
        self.new_trace = not parent
        self._traceparent: str | None = None
        """True when this span starts the run's trace: its traceparent goes into the run's record."""

    def enter(self) -> None:
        """Make the span current in the running task (the run's loop, just before its live work).
        Not detached: the loop's task context is this run's alone, and the next step enters its own."""
        if self.recording:
            otel_context.attach(self.context)

    def traceparent(self) -> str:
        if self._traceparent is None:
            self._traceparent = traceparent(self.span)
        return self._traceparent

    def end(self, outcome: str, **attributes: Any) -> None:
        if self.recording:
            self.span.set_attributes({"toolloop.outcome": outcome, **attributes})
        self.span.end()
