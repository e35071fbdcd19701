"""A span exporter writing JSON lines (TOOLLOOP_TRACES_FILE, workers/tracing.py). Needs the
OpenTelemetry SDK (`toolloop[otel]`); imported only when that variable is set."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as one JSON line (name, ids, parent, attributes, status, pid),
    written at once; several processes may share the file (each line is one O_APPEND write)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            parent = span.parent
            lines.append(orjson.dumps({
                "name": span.name,
                "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else None,
                "span_id": f"{ctx.span_id:016x}" if ctx is not None else None,
                "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
                "start": span.start_time, "end": span.end_time,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
                "pid": os.getpid(),
            }, default=str, option=orjson.OPT_APPEND_NEWLINE))  # fmt: skip
        with self.lock:
            os.write(self.fd, b"".join(lines))  # one write: lines of processes sharing the file never mix
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self.lock:
            os.close(self.fd)
