"""A span exporter writing JSON lines (TOOLLOOP_TRACES_FILE, workers/observe/tracing.py) and the worker's
default sampler. Needs the OpenTelemetry SDK (`toolloop[otel]`); imported only when tracing is on."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as one JSON line (name, ids, parent, attributes, status, pid),
    written at once; several processes may share the file (each line is one O_APPEND write)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        pid = os.getpid()
        for span in spans:
            ctx = span.get_span_context()
            parent = span.parent
            lines.append(
                orjson.dumps(
                    {
                        "name": span.name,
                        "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else None,
                        "span_id": f"{ctx.span_id:016x}" if ctx is not None else None,
                        "parent_id": f"{parent.span_id:016x}"
                        if parent is not None
                        else None,
                        "start": span.start_time,
                        "end": span.end_time,
                        "status": span.status.status_code.name,
                        "attributes": dict(span.attributes or {}),
                        "pid": pid,
                    },
                    default=str,
                    option=orjson.OPT_APPEND_NEWLINE,
                )
            )
        with self.lock:
            # one write: lines of processes sharing the file never mix
            os.write(self.fd, b"".join(lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self.lock:
            os.close(self.fd)


class EveryRun(Sampler):
    """The worker's default sampler: the SDK's `ParentBased(ALWAYS_ON)` decision (a root or a sampled
    parent: recorded and sampled; a parent not sampled: dropped), made in one call instead of a
    delegation chain (a span costs about 2 µs less)."""

    samples_every_root = True
    """Read by workers/observe/tracing.py: a run's segment without a caller's span needs no decision."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        if not parent.is_valid:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        if not parent.trace_flags.sampled:
            return SamplingResult(Decision.DROP, None, parent.trace_state)
        return SamplingResult(
            Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state
        )

    def get_description(self) -> str:
        return "ParentBased{root:AlwaysOnSampler}"
