"""The loop's OpenTelemetry spans (toolloop/telemetry.py): one `chat` span per model call and one
`execute_tool` span per tool execution, with the GenAI semantic-convention attributes; none for a
replayed step; content only with the opt-in switch; the API's no-op without a provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.loop_kit import read_frame, render, run
from toolloop import MemoryJournal, telemetry
from toolloop.contract import PromptGenUsage
from toolloop.testing import ScriptedModel, call, reply

SECRET = "sk-ant-api03-do-not-record"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The process's tracer provider (set once: the API refuses a second), with an in-memory exporter."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv(telemetry.CAPTURE_CONTENT_ENV, raising=False)
    exporter.clear()
    yield exporter
    exporter.clear()


def script() -> ScriptedModel:
    usage = PromptGenUsage(
        prompt_tokens=1500,
        completion_tokens=40,
        cached_tokens=1200,
        cache_write_tokens=200,
    )
    return ScriptedModel(
        [
            reply(
                tool_calls=[
                    call("read_frame", {"shot": 3}, id="c1"),
                    call("render", {"shot": 3}, id="c2"),
                ],
                cost_usd=0.002,
                usage=usage,
            ),
            reply(
                f"Shot 3 is fine. {SECRET}",
                cost_usd=0.001,
                usage=PromptGenUsage(
                    prompt_tokens=1600, completion_tokens=9, cached_tokens=1400
                ),
            ),
        ]
    )


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_one_span_per_model_call_and_tool_execution(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("caller") as parent:
        result, _ = await run(script(), tools=[read_frame(cost=0.01), render()])
    assert result.stopped_by == "done"
    finished = [s for s in spans.get_finished_spans() if s.name != "caller"]
    assert [s.name for s in finished] == [
        "chat test-model",
        "execute_tool read_frame",
        "execute_tool render",
        "execute_tool render",
        "chat test-model",
    ]
    assert {s.context.trace_id for s in finished} == {
        parent.get_span_context().trace_id
    }
    assert {s.parent.span_id for s in finished if s.parent} == {
        parent.get_span_context().span_id
    }
    first = attributes(finished[0])
    assert first == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "test-model",
        "gen_ai.response.model": "test-model",
        "toolloop.step": "model:1",
        "gen_ai.usage.input_tokens": 1500,
        "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": 1200,
        "gen_ai.usage.cache_creation.input_tokens": 200,
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "toolloop.cost_usd": 0.002,
    }
    assert attributes(finished[4])["gen_ai.usage.cache_read.input_tokens"] == 1400
    assert attributes(finished[4])["gen_ai.response.finish_reasons"] == ("stop",)
    tool = attributes(finished[1])
    assert tool == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "read_frame",
        "gen_ai.tool.call.id": "c1",
        "toolloop.step": "tool:c1",
        "toolloop.cost_usd": 0.01,
    }
    assert [attributes(s)["toolloop.step"] for s in finished[2:4]] == [
        "tool:c2:start",
        "tool:c2:wait",
    ]
    # no content by default
    assert SECRET not in json.dumps([attributes(s) for s in finished], default=str)


async def test_a_replayed_step_opens_no_span(spans: InMemorySpanExporter) -> None:
    journal = MemoryJournal()
    await run(script(), journal, tools=[read_frame(), render()])
    spans.clear()
    # everything replays
    await run(ScriptedModel([]), journal, tools=[read_frame(), render()])
    assert spans.get_finished_spans() == ()


async def test_content_only_with_the_opt_in_switch(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT_ENV, "true")
    await run(script(), tools=[read_frame(), render()])
    last = attributes(spans.get_finished_spans()[-1])
    assert SECRET in str(last["gen_ai.output.messages"])
    assert "Review shot 3." in str(last["gen_ai.input.messages"])


def test_without_a_provider_spans_are_the_apis_no_op() -> None:
    """In a fresh process (no provider set): the span is non-recording and nothing is computed; the
    figure printed is what one chat span costs then (docs/operations.md quotes it)."""
    code = """
import time
from toolloop import telemetry
from toolloop.contract import PromptGenRequest
request = PromptGenRequest(prompt="", model="m")
with telemetry.chat_span(request, "model:1") as span:
    assert not span.is_recording(), span
n = 20000
began = time.perf_counter()
for _ in range(n):
    with telemetry.chat_span(request, "model:1") as span:
        pass
print((time.perf_counter() - began) / n * 1e6)
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    per_span_us = float(out.stdout.strip())
    # a few µs on a loaded 2-core box; a model call takes ms
    assert per_span_us < 50, per_span_us


async def test_a_fallback_between_providers_is_a_span_attribute_and_a_metric(
    spans: InMemorySpanExporter,
) -> None:
    from toolloop.contract import PromptGenResult
    from workers.observe.metrics import Metrics, counted

    switched = PromptGenResult(
        text="Fine.",
        meta={
            "provider": "fal",
            "fallback_from": [{"provider": "anthropic", "reason": "529"}],
        },
    )
    metrics = Metrics()
    result, _ = await run(counted(ScriptedModel([switched]), "anthropic", metrics))
    assert result.stopped_by == "done"
    (chat,) = spans.get_finished_spans()
    assert attributes(chat)["gen_ai.provider.name"] == "fal"
    assert attributes(chat)["toolloop.fallback_from"] == ("anthropic",)
    value = metrics.registry.get_sample_value
    assert (
        value(
            "toolloop_model_calls_total",
            {"provider": "anthropic", "status": "fell_back"},
        )
        == 1
    )
    assert value("toolloop_model_calls_total", {"provider": "fal", "status": "ok"}) == 1
    assert (
        value(
            "toolloop_model_fallbacks_total",
            {"from_provider": "anthropic", "to_provider": "fal"},
        )
        == 1
    )


def test_a_run_segment_span_has_ids_derived_from_the_run(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """workers/observe/tracing.py: every task of a segment finds the same parent from the run id alone; the
    task whose commit ends the segment exports its span (the worker's provider, `configure`), from
    the segment's recorded start; a caller's sampled-out trace stays sampled out."""
    from workers.observe.tracing import StepTrace, segment_ids

    trace_id, span_id = segment_ids("run-a", 1)
    assert segment_ids("run-a", 1) == (trace_id, span_id) != segment_ids("run-b", 1)
    step = StepTrace("run-a", 4, {"segment": "1", "trace_start": "1:1000"}, "task-1")
    assert step.traceparent() == f"00-{trace_id:032x}-{span_id:016x}-01"
    assert step.record() == {}  # the segment's start is recorded already
    assert (
        StepTrace("run-a", 4, {"segment": "2"}, "t")
        .record()["trace_start"]
        .startswith("2:")
    )
    step.end("next")
    # the test's provider is not the worker's: the ids are not its to give
    step.end("stop")
    assert spans.get_finished_spans() == ()
    caller = f"00-{7:032x}-{9:016x}-00"  # a caller's span, sampled out
    quiet = StepTrace("run-a", 1, {"traceparent": caller}, "t")
    assert not quiet.recording and quiet.traceparent().startswith(f"00-{7:032x}-")
    assert quiet.traceparent().endswith("-00")

    code = """
from opentelemetry import trace
from workers.observe import tracing
assert tracing.configure()
step = tracing.StepTrace("run-a", 4, {"segment": "1", "trace_start": "1:1000"}, "task-1")
step.end("next")
step.end("stop")
trace.get_tracer_provider().force_flush()
"""
    out = tmp_path / "spans.jsonl"
    env = {**os.environ, "TOOLLOOP_TRACES_FILE": str(out)}
    subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    (segment,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (
        segment["name"] == "toolloop.run"
        and segment["parent_id"] is None
        and segment["start"] == 1000
    )
    assert (segment["trace_id"], segment["span_id"]) == (
        f"{trace_id:032x}",
        f"{span_id:016x}",
    )
    assert segment["attributes"]["toolloop.outcome"] == "stop"
