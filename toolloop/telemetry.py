"""OpenTelemetry spans of the loop's live work, after the GenAI semantic conventions.

`run_tool_loop` opens a span around every model call it makes (`chat <model>`) and every tool it runs
(`execute_tool <name>`), as children of whatever span is current: the worker's step span
(workers/tracing.py), or the caller's own. Replayed steps run nothing and open no span, so a run that
a crash made replay has still one span per model call and per tool execution that happened.

Only `opentelemetry-api` is needed. With no tracer provider configured (the SDK absent or not set up)
the API hands out non-recording spans: a span costs one no-op object and no attribute is computed
(`span.is_recording()` guards them). Prompts and outputs go into spans only when the operator opts in
with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (the convention's switch); request
headers, keys and tool inputs otherwise are never recorded.

Attributes of a chat span: gen_ai.operation.name "chat", gen_ai.provider.name, gen_ai.request.model,
gen_ai.response.model, gen_ai.usage.input_tokens (cached included) / output_tokens,
gen_ai.usage.cache_read.input_tokens, gen_ai.usage.cache_creation.input_tokens,
gen_ai.response.finish_reasons, toolloop.cost_usd, toolloop.step (the journal key).
Of a tool span: gen_ai.operation.name "execute_tool", gen_ai.tool.name, gen_ai.tool.call.id,
toolloop.cost_usd, toolloop.step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from toolloop.contract import PromptGenRequest, PromptGenResult

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
TRACER_NAME = "toolloop"

# The GenAI semantic conventions' names (gen_ai.* are experimental in the spec: kept in one place).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
COST = "toolloop.cost_usd"
STEP = "toolloop.step"


def capture_content() -> bool:
    """True when the operator opted in to prompts and outputs in spans (read per call: cheap)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def tracer() -> trace.Tracer:
    """The toolloop tracer of the current global provider (a proxy until one is set: no-op)."""
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def chat_span(request: PromptGenRequest, step: str) -> Iterator[Span]:
    """A span around one model call; `chat_result` fills in what came back."""
    with tracer().start_as_current_span(
        f"chat {request.model}", kind=SpanKind.CLIENT, record_exception=True
    ) as span:
        if span.is_recording():
            span.set_attributes({OPERATION: "chat", REQUEST_MODEL: request.model, STEP: step})
            if capture_content():
                messages = [m.model_dump(mode="json") for m in request.messages or []]
                span.set_attribute(INPUT_MESSAGES, json.dumps(messages, ensure_ascii=False))
        yield span


def chat_result(span: Span, request: PromptGenRequest, result: PromptGenResult) -> None:
    """The response attributes of a chat span (usage, cache tokens, cost, finish reason)."""
    if not span.is_recording():
        return
    meta: dict[str, Any] = result.meta or {}
    usage = result.usage
    attributes: dict[str, Any] = {
        RESPONSE_MODEL: str(meta.get("model") or request.model),
        INPUT_TOKENS: usage.prompt_tokens,
        OUTPUT_TOKENS: usage.completion_tokens,
        CACHE_READ: usage.cached_tokens,
        CACHE_CREATION: usage.cache_write_tokens,
        FINISH_REASONS: [result.finish_reason],
        COST: result.cost_usd,
    }
    if meta.get("provider"):
        attributes[PROVIDER] = str(meta["provider"])
    if capture_content():
        output = {"text": result.text, "tool_calls": [c.model_dump(mode="json") for c in result.tool_calls]}
        attributes[OUTPUT_MESSAGES] = json.dumps(output, ensure_ascii=False)
    span.set_attributes(attributes)


@contextmanager
def tool_span(name: str, call_id: str, step: str) -> Iterator[Span]:
    """A span around one tool execution (a one-phase run, a two-phase start or wait)."""
    with tracer().start_as_current_span(
        f"execute_tool {name}", kind=SpanKind.INTERNAL, record_exception=True
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {OPERATION: "execute_tool", TOOL_NAME: name, TOOL_CALL_ID: call_id, STEP: step}
            )
        yield span


def tool_result(span: Span, cost_usd: float) -> None:
    if span.is_recording():
        span.set_attribute(COST, cost_usd)
