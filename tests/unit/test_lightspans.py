"""The worker's light tracer provider (workers/observe/lightspans.py): its spans reach the SDK's span
processors and exporters as the SDK's ReadableSpans (resource, scope, parent, attributes, status),
sampled as the parent was, within the span limits, their attributes cleaned as the SDK cleans
them, and nest other instrumentation's spans; with the batch processor they are made ReadableSpans
on its thread, not the caller's; `configure` takes the environment's sampler. The provider is used
without being made the global one (tests/unit/test_telemetry.py sets the SDK's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)

from workers.observe.lightspans import LightProvider, Materialize
from workers.observe.spanfile import EveryRun

RESOURCE = Resource.create({"service.name": "toolloop-worker"})


def provider_with(
    memory: InMemorySpanExporter,
    sampler: Sampler | None = None,
    limits: SpanLimits | None = None,
) -> LightProvider:
    processor = SimpleSpanProcessor(Materialize(memory, RESOURCE, limits))
    return LightProvider(sampler or EveryRun(), RESOURCE, [processor])


def segment(sampled: bool = True) -> Context:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return trace.set_span_in_context(
        NonRecordingSpan(SpanContext(7, 9, is_remote=True, trace_flags=flags))
    )


def test_a_span_reaches_the_sdks_exporter_as_a_readable_span() -> None:
    memory = InMemorySpanExporter()
    tracer = provider_with(memory).get_tracer("toolloop", "1.0")
    attributes = {"gen_ai.operation.name": "chat", "toolloop.step": "model:1"}
    span = tracer.start_span(
        "chat m", context=segment(), kind=SpanKind.CLIENT, attributes=attributes
    )
    assert span.is_recording()
    span.set_attributes(
        {"gen_ai.usage.input_tokens": 1500, "gen_ai.response.finish_reasons": ("stop",)}
    )
    span.set_attribute("toolloop.fallback_from", ["anthropic"])
    assert memory.get_finished_spans() == ()  # nothing before its end
    span.end()
    span.set_attribute("late", 1)  # an ended span takes nothing more
    (done,) = memory.get_finished_spans()
    assert isinstance(done, ReadableSpan)
    assert done.name == "chat m" and done.kind is SpanKind.CLIENT
    assert done.context.trace_id == 7 and done.context.trace_flags.sampled
    assert done.parent is not None and done.parent.span_id == 9
    assert done.resource.attributes["service.name"] == "toolloop-worker"
    assert (
        done.instrumentation_scope is not None
        and done.instrumentation_scope.name == "toolloop"
    )
    assert dict(done.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "toolloop.step": "model:1",
        "gen_ai.usage.input_tokens": 1500,
        "gen_ai.response.finish_reasons": ("stop",),
        "toolloop.fallback_from": ("anthropic",),
    }
    assert (
        done.start_time is not None
        and done.end_time is not None
        and done.start_time <= done.end_time
    )
    assert done.status.status_code is StatusCode.UNSET


def test_sampling_follows_the_parent_and_asks_any_other_sampler() -> None:
    memory = InMemorySpanExporter()
    tracer = provider_with(memory).get_tracer("toolloop")
    quiet = tracer.start_span("chat m", context=segment(sampled=False))
    assert not quiet.is_recording() and quiet.get_span_context().trace_id == 7
    quiet.end()
    tracer.start_span("root").end()  # no parent: the worker's sampler samples a root
    assert [s.name for s in memory.get_finished_spans()] == ["root"]

    memory.clear()
    parent_based = provider_with(memory, ParentBased(ALWAYS_OFF)).get_tracer("t")
    parent_based.start_span("root").end()  # dropped: its root sampler says so
    parent_based.start_span(
        "child", context=segment()
    ).end()  # a sampled parent's child: sampled
    assert [s.name for s in memory.get_finished_spans()] == ["child"]

    memory.clear()
    # not parent-based: asked
    never = provider_with(memory, TraceIdRatioBased(0.0)).get_tracer("t")
    never.start_span("child", context=segment()).end()
    assert memory.get_finished_spans() == ()


def test_other_instrumentations_spans_nest_under_the_current_span() -> None:
    memory = InMemorySpanExporter()
    provider = provider_with(memory)
    chat = provider.get_tracer("toolloop").start_span("chat m", context=segment())
    http_client = provider.get_tracer("opentelemetry.instrumentation.httpx")
    with (
        trace.use_span(chat, end_on_exit=True),
        http_client.start_as_current_span("POST") as http,
    ):
        assert http.is_recording()
    post, done = memory.get_finished_spans()
    assert post.parent is not None and post.parent.span_id == done.context.span_id
    assert post.context.trace_id == done.context.trace_id == 7
    assert post.instrumentation_scope is not None
    assert post.instrumentation_scope.name == "opentelemetry.instrumentation.httpx"


def test_an_error_is_the_sdks_exception_event_and_status() -> None:
    memory = InMemorySpanExporter()
    tracer = provider_with(memory).get_tracer("toolloop")
    with (
        pytest.raises(ValueError),
        tracer.start_as_current_span("execute_tool slow", context=segment()),
    ):
        raise ValueError("no frame 3")
    (done,) = memory.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert done.status.description == "ValueError: no frame 3"
    (event,) = done.events
    assert event.name == "exception"
    assert (
        event.attributes is not None
        and event.attributes["exception.type"] == "ValueError"
    )
    assert "no frame 3" in str(event.attributes["exception.stacktrace"])


def test_the_span_limits_apply_and_attributes_are_cleaned_as_the_sdk_does() -> None:
    memory = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=3, max_span_attribute_length=4)
    tracer = provider_with(memory, limits=limits).get_tracer("toolloop")
    span = tracer.start_span(
        "chat m", context=segment(), attributes={"a": "abcdefgh", "b": 1}
    )
    span.set_attributes({"c": ("long text", "x"), "d": 2.5})
    span.end()
    (done,) = memory.get_finished_spans()
    # the oldest dropped, cut
    assert dict(done.attributes or {}) == {
        "b": 1,
        "c": ("long", "x"),
        "d": 2.5,
    }
    assert done.dropped_attributes == 1

    memory.clear()
    unlimited = provider_with(memory).get_tracer("toolloop")
    span = unlimited.start_span("chat m", context=segment(), attributes={"ok": "yes"})
    span.set_attribute("", "no key")
    span.set_attribute("mixed", [1, "a"])
    span.end()
    (done,) = memory.get_finished_spans()
    # cleaned as the SDK cleans
    assert dict(done.attributes or {}) == {
        "ok": "yes",
        "mixed": (1, "a"),
    }


class ThreadOf(SpanExporter):
    """Notes the thread each batch is exported from."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.names: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.threads.append(threading.get_ident())
        self.names += [span.name for span in spans]
        return SpanExportResult.SUCCESS


def test_batched_spans_are_made_readable_on_the_processors_thread() -> None:
    seen = ThreadOf()
    processor = BatchSpanProcessor(
        Materialize(seen, RESOURCE), schedule_delay_millis=60_000
    )
    tracer = LightProvider(EveryRun(), RESOURCE, [processor]).get_tracer("toolloop")
    for n in range(3):
        tracer.start_span(f"chat {n}", context=segment()).end()
    assert seen.names == []  # queued: nothing built nor exported on this thread
    processor.shutdown()  # type: ignore[no-untyped-call]  # its thread exports what is queued, then stops
    assert sorted(seen.names) == ["chat 0", "chat 1", "chat 2"]
    assert threading.get_ident() not in seen.threads


def test_the_workers_provider_takes_the_environments_sampler(tmp_path: Path) -> None:
    """`configure` with OTEL_TRACES_SAMPLER=parentbased_traceidratio at ratio 0: a run without a
    caller's span is sampled out (its segment and its chat span alike); a run whose caller's span
    was sampled is traced, its chat span and its segment's span in the file."""
    code = """
from opentelemetry import trace
from toolloop import telemetry
from toolloop.contract import PromptGenRequest
from workers.observe import tracing
assert tracing.configure()
request = PromptGenRequest(prompt="", model="m")
for state in ({}, {"traceparent": f"00-{7:032x}-{9:016x}-01"}):
    step = tracing.StepTrace("run-a", 1, state, "task-1")
    step.enter()
    with telemetry.chat_span(request, "model:1") as span:
        print(span.is_recording())
    step.end("stop")
trace.get_tracer_provider().force_flush()
"""
    out = tmp_path / "spans.jsonl"
    env = {
        **os.environ,
        "TOOLLOOP_TRACES_FILE": str(out),
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["name"] for s in spans] == ["chat m", "toolloop.run"]
    assert {s["trace_id"] for s in spans} == {f"{7:032x}"}
    assert (
        spans[1]["parent_id"] == f"{9:016x}"
        and spans[0]["parent_id"] == spans[1]["span_id"]
    )
