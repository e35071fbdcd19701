"""The worker's tracer provider: light recording spans, exported by the SDK's own span processors
and exporters. Needs the OpenTelemetry SDK (`toolloop[otel]`); imported only when tracing is on
(workers/observe/tracing.py, `configure`).

Why not the SDK's `TracerProvider`: its span costs 25-50 µs of the step's CPU (a sampler chain,
an id generator, every attribute validated under a lock as it is set, the processors' hooks under
another lock), a durable step about 500 µs, and a worker makes one span per step. Here a span is a
small object: started with the parent's sampling decision (parent-based, as the worker's default
sampler and the SDK's `parentbased_*` ones decide; any other sampler is asked), attributes a plain
dict while it runs. When it ends it goes to the same span processors as before (the SDK's
`BatchSpanProcessor`, or `SimpleSpanProcessor` for the JSON-lines file written at once), whose
exporter (`Materialize`) turns it into the SDK's `ReadableSpan`, with the provider's resource and
the span limits (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT, OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT... as
the SDK reads them), there: in the batch processor's thread, off the step's, and hands the batch
to the real exporter (OTLP, the file), which encodes it as it would the SDK's own spans.

What the SDK provider has and this one has not: span processors' `on_start` (neither of the two
used here does anything there), `add_span_processor` for code running in the worker (an exporter is
chosen by the environment, `configure`), the SDK's per-span validation warnings (a value that is not
a valid attribute is dropped all the same, when the span is exported). Spans of other
instrumentation in the worker process (an HTTP client's) are made by this provider too, and nest
under the current span as usual.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Iterator, Mapping, Sequence
from time import time_ns
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util import types
from opentelemetry.util._decorator import _agnosticcontextmanager

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_PLAIN = (str, int, float, bool)


class LightProvider(trace_api.TracerProvider):
    """The worker's provider: `sampler` (read by workers/observe/tracing.py), the span processors every
    sampled span goes to when it ends, and the resource and limits `Materialize` applies."""

    def __init__(
        self, sampler: Sampler, resource: Resource, processors: Sequence[SpanProcessor]
    ) -> None:
        self.sampler = sampler
        self.parent_based = isinstance(sampler, ParentBased) or getattr(
            sampler, "samples_every_root", False
        )
        """A sampled parent's child is sampled and an unsampled one's is not (the SDK's ParentBased
        with its default delegates, as every `parentbased_*` OTEL_TRACES_SAMPLER makes it, and the
        worker's EveryRun): a child's decision is its parent's flag, without asking the sampler."""
        self.resource = resource
        self.processors = tuple(processors)
        self.segments = LightTracer(self, InstrumentationScope("toolloop"))
        """The tracer of the run segments' spans (`segment_span`), in the loop's scope (`toolloop`)."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes | None = None,
    ) -> LightTracer:
        name, version = instrumenting_module_name, instrumenting_library_version
        return LightTracer(
            self, InstrumentationScope(name, version, schema_url, attributes)
        )

    def segment_span(
        self,
        name: str,
        ids: tuple[int, int],
        parent: Context,
        start_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        """Export a span with the ids given (a run segment's, derived from its run:
        workers/observe/tracing.py),
        child of `parent`'s span (a caller's), from `start_ns` to now; the caller decided it is sampled."""
        remote = trace_api.get_current_span(parent).get_span_context()
        state = remote.trace_state if remote.is_valid else None
        context = SpanContext(ids[0], ids[1], False, _SAMPLED, state)
        span = LightSpan(
            self.segments,
            name,
            context,
            remote if remote.is_valid else None,
            SpanKind.INTERNAL,
            attributes,
            start_ns,
        )
        span.end()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(
            processor.force_flush(timeout_millis) for processor in self.processors
        )

    def shutdown(self) -> None:
        for processor in self.processors:
            processor.shutdown()


class LightTracer(trace_api.Tracer):
    def __init__(self, provider: LightProvider, scope: InstrumentationScope) -> None:
        self.provider = provider
        self.scope = scope
        self.processors = provider.processors

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: trace_api._Links = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        parent = trace_api.get_current_span(context).get_span_context()
        span_id = random.getrandbits(64) or 1
        if parent.is_valid:
            trace_id, state = parent.trace_id, parent.trace_state
            if self.provider.parent_based:
                sampled = parent.trace_flags.sampled
            else:
                sampled = self._decide(context, trace_id, name, kind, attributes, links)
        else:
            trace_id, state = random.getrandbits(128) or 1, None
            sampled = self._decide(context, trace_id, name, kind, attributes, links)
        if not sampled:  # dropped (the SDK's processors export only sampled spans: so is a record-only one)
            flags = TraceFlags(TraceFlags.DEFAULT)
            return trace_api.NonRecordingSpan(
                SpanContext(trace_id, span_id, False, flags, state)
            )
        own = SpanContext(trace_id, span_id, False, _SAMPLED, state)
        span = LightSpan(
            self,
            name,
            own,
            parent if parent.is_valid else None,
            kind,
            dict(attributes) if attributes else {},
            start_time or time_ns(),
        )
        if links:
            span.links = [Link(link.context, link.attributes) for link in links]
        return span

    def _decide(
        self,
        context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind,
        attributes: types.Attributes,
        links: trace_api._Links,
    ) -> bool:
        decision = self.provider.sampler.should_sample(
            context, trace_id, name, kind, attributes, links
        )
        return decision.decision is Decision.RECORD_AND_SAMPLE

    @_agnosticcontextmanager  # the API's own tracers' (a context manager usable as a decorator)
    def start_as_current_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: trace_api._Links = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace_api.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


class LightSpan(trace_api.Span):
    """A sampled span while it runs, and what the span processors queue once it ended (`Materialize`
    makes the SDK's ReadableSpan of it for the exporter)."""

    __slots__ = (
        "attributes",
        "context",
        "end_time",
        "events",
        "kind",
        "links",
        "name",
        "parent",
        "start_time",
        "status",
        "tracer",
    )

    def __init__(
        self,
        tracer: LightTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        start_time: int,
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.events: list[Event] = []
        self.links: list[Link] = []
        self.status = _UNSET
        self.start_time = start_time
        self.end_time: int | None = None

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self.end_time is None:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self.end_time is None:
            self.attributes.update(attributes)

    def add_event(
        self,
        name: str,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
    ) -> None:
        if self.end_time is None:
            self.events.append(
                Event(name, dict(attributes or {}), timestamp or time_ns())
            )

    def add_link(
        self, context: SpanContext, attributes: types.Attributes = None
    ) -> None:
        if self.end_time is None and context.is_valid:
            self.links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(
        self, status: Status | StatusCode, description: str | None = None
    ) -> None:
        """As the SDK's span: an OK status stays, UNSET is never set."""
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self.status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """The SDK's `exception` event (type, message, stack trace, escaped)."""
        kind = type(exception)
        module = kind.__module__
        qualname = (
            kind.__qualname__
            if module in ("", "builtins")
            else f"{module}.{kind.__qualname__}"
        )
        event: dict[str, Any] = {
            "exception.type": qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        self.add_event("exception", {**event, **(attributes or {})}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time or time_ns()
        for processor in self.tracer.processors:
            processor.on_end(self)  # type: ignore[arg-type]  # Materialize reads it, on the processor's side


class Materialize(SpanExporter):
    """The exporter the span processors are given: each ended `LightSpan` of a batch made the SDK's
    `ReadableSpan` (the provider's resource, the span's scope, the span limits applied), then the
    batch handed to `exporter`."""

    def __init__(
        self,
        exporter: SpanExporter,
        resource: Resource,
        limits: SpanLimits | None = None,
    ) -> None:
        self.exporter = exporter
        self.resource = resource
        self.limits = limits or SpanLimits()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([self.readable(span) for span in spans])  # type: ignore[arg-type]

    def readable(self, span: LightSpan) -> ReadableSpan:
        limits = self.limits
        events: Sequence[Event] = span.events
        if events:
            events = BoundedList.from_seq(
                limits.max_events, [self.event(event) for event in events]
            )
        links: Sequence[Link] = span.links
        if links:
            links = BoundedList.from_seq(limits.max_links, links)
        return ReadableSpan(
            span.name,
            span.context,
            span.parent,
            self.resource,
            self.attributes(span.attributes),
            events,
            links,
            span.kind,
            None,
            span.status,
            span.start_time,
            span.end_time,
            span.tracer.scope,
        )

    def attributes(self, attributes: dict[str, Any]) -> Mapping[str, Any]:
        """The span's attributes as they are when all are valid and within the limits (the loop's are:
        strings, numbers, a tuple of strings), else the SDK's BoundedAttributes of them (invalid
        values dropped, the oldest past the count limit, strings cut at the length limit)."""
        limits = self.limits
        count, length = limits.max_span_attributes, limits.max_span_attribute_length
        within = count is None or len(attributes) <= count
        if within and length is None and all(map(_plain, attributes.items())):
            return attributes
        return BoundedAttributes(
            count, attributes, immutable=True, max_value_len=length
        )

    def event(self, event: Event) -> Event:
        limits = self.limits
        count, length = limits.max_event_attributes, limits.max_attribute_length
        bounded = BoundedAttributes(
            count, event.attributes, immutable=True, max_value_len=length
        )
        return Event(event.name, bounded, event.timestamp)

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def _plain(item: tuple[Any, Any]) -> bool:
    """A valid attribute that needs no cleaning: a non-empty string key, a string, number or bool
    value, or a tuple of strings."""
    key, value = item
    if type(key) is not str or not key:
        return False
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind is tuple:
        return all(type(part) is str for part in value)
    return False
