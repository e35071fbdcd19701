"""Tracing of durable runs: one trace per run, across its tasks, workers, retries and re-drives.

Each segment of a run (its steps from the enqueue, or from an answer, to its end or its next
question) is one span, `toolloop.run`, whose children are the library's spans of the live work
each task did (toolloop/telemetry.py: `chat <model>`, `execute_tool <name>`). Its ids are derived
from the run id (`segment_ids`), so every task, on whichever worker, after a kill or a re-drive,
parents its work to the same span with nothing to look up; the trace id is the caller's when
`Client.enqueue` ran inside a span (the `traceparent` field of the run's state hash). The task
whose commit ends the segment exports the segment's span, from the segment's start to then. The
successors a worker sends carry the segment span's context in their Celery message headers too
(`traceparent`, W3C Trace Context), for any other consumer of the queue.

The tracer provider is set up when the worker starts (`configure`), from the environment; it is
the worker's light one (workers/observe/lightspans.py: a span a small object while it runs, made the SDK's
ReadableSpan in the exporter's call, by the span processor's thread when batched), whose ended
spans go to the SDK's span processors and exporters:
    OTEL_TRACES_EXPORTER=otlp (or OTEL_EXPORTER_OTLP_ENDPOINT / ..._TRACES_ENDPOINT set)
        spans go to an OTLP/HTTP collector (pip install 'toolloop[otel]'), in batches
    TOOLLOOP_TRACES_FILE=<path>
        every ended span is appended to <path> as one JSON line, at once (a killed process loses
        only the spans still open); for tests and for a look without a collector
    TOOLLOOP_TRACES_FILE_BATCH=1
        the same file through the SDK's BatchSpanProcessor instead: spans queued and written in
        batches by its thread, off the steps' (OTEL_BSP_* apply; a killed process loses its queue)
With neither, no provider is set and every span is the API's no-op (tests/unit/test_telemetry.py
measures what that costs).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

FILE_ENV = "TOOLLOOP_TRACES_FILE"
FILE_BATCH_ENV = "TOOLLOOP_TRACES_FILE_BATCH"
_PROPAGATOR = TraceContextTextMapPropagator()


def configure() -> bool:
    """Install this process's tracer provider from the environment (see the module docstring);
    False when nothing asks for tracing (the API's no-op stays)."""
    path = os.environ.get(FILE_ENV, "").strip()
    otlp = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "otlp" or any(
        os.environ.get(name, "").strip()
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )
    if not path and not otlp:
        return False
    try:  # the SDK is optional (toolloop[otel]): imported only when tracing is asked for
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SimpleSpanProcessor,
        )
        from opentelemetry.sdk.trace.sampling import Sampler
    except ImportError:
        raise RuntimeError(
            "Tracing is asked for (TOOLLOOP_TRACES_FILE or OTEL_EXPORTER_OTLP_*), but the OpenTelemetry "
            "SDK is not installed.\n  pip install 'toolloop[otel]', or unset those variables."
        ) from None
    service = os.environ.get("OTEL_SERVICE_NAME", "").strip() or "toolloop-worker"
    # these two import the SDK (optional)
    from workers.observe.lightspans import (
        LightProvider,
        Materialize,
    )
    from workers.observe.spanfile import EveryRun, JsonLinesExporter

    resource = Resource.create({"service.name": service})
    sampler: Sampler = EveryRun()
    if os.environ.get(
        "OTEL_TRACES_SAMPLER"
    ):  # the SDK's sampler of it: its provider reads the variables
        sampler = TracerProvider(shutdown_on_exit=False).sampler
    processors: list[SpanProcessor] = []
    if path:
        batched = os.environ.get(FILE_BATCH_ENV, "").strip().lower() in (
            "1",
            "true",
            "yes",
        )
        processor = BatchSpanProcessor if batched else SimpleSpanProcessor
        processors.append(processor(Materialize(JsonLinesExporter(path), resource)))
    if otlp:
        try:  # the exporter is optional (toolloop[otel])
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError:
            raise RuntimeError(
                "OTLP export is asked for (OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*), but the exporter "
                "is not installed.\n  pip install 'toolloop[otel]'."
            ) from None
        processors.append(BatchSpanProcessor(Materialize(OTLPSpanExporter(), resource)))
    provider = LightProvider(sampler, resource, processors)
    # the batch processors' last spans, as the SDK's provider does
    atexit.register(provider.shutdown)
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
    if (
        len(parts) == 4
        and parts[0] == "00"
        and len(parts[1]) == 32
        and len(parts[2]) == 16
    ):
        try:
            trace_id, span_id, flags = (
                int(parts[1], 16),
                int(parts[2], 16),
                int(parts[3], 16),
            )
        except ValueError:
            return Context()
        if trace_id and span_id:
            remote = SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1)
            )
            return trace.set_span_in_context(NonRecordingSpan(remote))
        return Context()
    return _PROPAGATOR.extract({"traceparent": value})


def current_traceparent() -> str:
    """The `traceparent` of the caller's current span ("" when none is recording)."""
    span = trace.get_current_span()
    return traceparent(span) if span.get_span_context().is_valid else ""


SEGMENT_SPAN = "toolloop.run"
_ROOT = Context()
"""The empty context (immutable): a segment span's parent when no caller's span holds the run."""
SEGMENT_ENDS = frozenset(("stop", "fail", "park"))
"""Outcomes of a step whose commit ends its run's segment (finished, failed, or parked on a question)."""


def segment_ids(run_id: str, segment: int) -> tuple[int, int]:
    """The trace id of `run_id` when no caller's span holds it, and the span id of its segment
    `segment`: derived from the run id, so that every worker, retry and re-drive of the run finds
    the same ones with nothing stored (and an operator finds a run's trace from its id)."""
    digest = hashlib.blake2b(run_id.encode(), digest_size=24).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    return trace_id, (
        (int.from_bytes(digest[16:], "big") + segment) & 0xFFFF_FFFF_FFFF_FFFF
    ) or 1


class StepTrace:
    """The trace context of one task of a run: its segment's span (`toolloop.run`), as the parent of
    the live work's spans (toolloop/telemetry.py: one `chat` or `execute_tool` span per task), and
    that span itself, exported by the task whose commit ends the segment.

    The segment span's ids are derived from the run (`segment_ids`; the trace id is the caller's
    when `Client.enqueue` ran inside a span, the `traceparent` of the run's record); its start is
    the run's `created` for segment 0, else `trace_start`, written by the segment's first commit.
    Nothing else is made per task: a step costs half a millisecond, and every µs of it counts."""

    def __init__(
        self, run_id: str, n: int, state: dict[str, str], task_id: str
    ) -> None:
        self.run_id = run_id
        self.n = n
        self.segment = int(state.get("segment", 0))
        self.state = state
        self._traceparent = ""
        self.began_ns = time.time_ns()
        provider = trace.get_tracer_provider()
        sampler = getattr(provider, "sampler", None)
        self.valid = sampler is not None
        """False without the SDK's provider (every span the API's no-op); True for a sampled-out run
        too (its trace id is the run's all the same, so that a sampler decides once per run)."""
        self.recording = False
        if sampler is None:
            return
        caller = state.get("traceparent")
        self.caller = parent_context(caller) if caller else _ROOT
        trace_id, span_id = segment_ids(run_id, self.segment)
        if caller:
            parent = trace.get_current_span(self.caller).get_span_context()
            trace_id = parent.trace_id if parent.is_valid else trace_id
        if caller or not getattr(sampler, "samples_every_root", False):
            self.recording = sampler.should_sample(
                self.caller, trace_id, SEGMENT_SPAN
            ).decision.is_sampled()
        else:  # the worker's default sampler (workers/observe/spanfile.py, EveryRun): a root is sampled
            self.recording = True
        self.ids = (trace_id, span_id)
        flags = TraceFlags(TraceFlags.SAMPLED if self.recording else TraceFlags.DEFAULT)
        segment = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
        self.context = trace.set_span_in_context(NonRecordingSpan(segment))
        self._traceparent = f"00-{trace_id:032x}-{span_id:016x}-{int(flags):02x}"

    def enter(self) -> None:
        """Make the segment's span the current parent in the running task (the run's loop, just
        before its live work). Not detached: the loop's task context is this run's alone, and the
        next step enters its own."""
        if self.valid:
            otel_context.attach(self.context)

    def traceparent(self) -> str:
        """The W3C `traceparent` of the run's segment span (for successors' message headers)."""
        return self._traceparent

    def record(self) -> dict[str, str]:
        """What the run's record keeps for its trace: `trace_start`, the segment's start (ns), from
        its first commit on (segment 0 starts at the run's `created`)."""
        if not self.valid or self.segment == 0:
            return {}
        if self.state.get("trace_start", "").startswith(f"{self.segment}:"):
            return {}
        return {"trace_start": f"{self.segment}:{self.began_ns}"}

    def start_ns(self) -> int:
        if self.segment == 0 and self.state.get("created"):
            return int(float(self.state["created"]) * 1e9)
        segment, _, at = self.state.get("trace_start", "").partition(":")
        return int(at) if segment == str(self.segment) and at else self.began_ns

    def end(self, outcome: str, **attributes: Any) -> None:
        """At the end of the task: the segment's span, when this task's commit ended the segment."""
        if not self.recording or outcome not in SEGMENT_ENDS:
            return
        segment_span = getattr(trace.get_tracer_provider(), "segment_span", None)
        if (
            segment_span is None
        ):  # not the worker's provider (`configure`): the ids are not ours to give
            return
        attributes = {
            "toolloop.run_id": self.run_id,
            "toolloop.segment": self.segment,
            "toolloop.step.n": self.n,
            "toolloop.outcome": outcome,
            **attributes,
        }
        if self.state.get(
            "parent"
        ):  # a child run (workers/step/children.py): its span is under its parent's
            attributes["toolloop.parent_run_id"] = self.state["parent"]
        segment_span(SEGMENT_SPAN, self.ids, self.caller, self.start_ns(), attributes)
