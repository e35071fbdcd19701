"""A span exporter writing JSON lines (TOOLLOOP_TRACES_FILE, workers/tracing.py). Needs the
OpenTelemetry SDK (`toolloop[otel]`); imported only when that variable is set."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as one JSON line (name, ids, parent, attributes, status, pid),
    written at once; several processes may share the file (each line is one O_APPEND write)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            parent = span.parent
            lines.append(json.dumps({
                "name": span.name,
                "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else None,
                "span_id": f"{ctx.span_id:016x}" if ctx is not None else None,
                "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
                "start": span.start_time, "end": span.end_time,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
                "pid": os.getpid(),
            }, default=str))  # fmt: skip
        with self.lock, open(self.path, "a", encoding="utf-8") as file:
            file.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS
