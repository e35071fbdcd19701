"""OpenTelemetry spans of the loop's live work, after the GenAI semantic conventions.

`run_tool_loop` opens a span around every model call it makes (`chat <model>`) and every tool it runs
(`execute_tool <name>`), as children of whatever span is current: the worker's step span
(workers/observe/tracing.py), or the caller's own. Replayed steps run nothing and open no span, so a run that
a crash made replay has still one span per model call and per tool execution that happened.

Only `opentelemetry-api` is needed. With no tracer provider configured (the SDK absent or not set up)
the API hands out non-recording spans: a span costs one no-op object and no attribute is computed
(`span.is_recording()` guards them). Prompts and outputs go into spans only when the operator opts in
with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (the convention's switch); request
headers, keys and tool inputs otherwise are never recorded.

Attributes of a chat span: gen_ai.operation.name "chat", gen_ai.provider.name, gen_ai.request.model,
gen_ai.response.model, gen_ai.usage.input_tokens (cached included) / output_tokens,
gen_ai.usage.cache_read.input_tokens, gen_ai.usage.cache_creation.input_tokens,
gen_ai.response.finish_reasons, toolloop.cost_usd, toolloop.step (the journal key), and after a
fallback between providers toolloop.fallback_from (the providers that failed first, in order).
Of a tool span: gen_ai.operation.name "execute_tool", gen_ai.tool.name, gen_ai.tool.call.id,
toolloop.cost_usd, toolloop.step.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

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
FALLBACK_FROM = "toolloop.fallback_from"
STEP = "toolloop.step"


def capture_content() -> bool:
    """True when the operator opted in to prompts and outputs in spans (read per call: cheap)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in (
        "1",
        "true",
        "yes",
    )


_TRACER = trace.get_tracer(TRACER_NAME)
"""The API's proxy tracer: it follows the global provider once one is set (the usual library idiom;
`trace.get_tracer` per call would build a tracer each time, ~25 µs)."""


def tracer() -> trace.Tracer:
    """The toolloop tracer of the current global provider (no-op until one is set)."""
    return _TRACER


class _Scope:
    """`span` current while the block runs (its children nest under it), ended after; an error
    ending the block is recorded on it. A plain class, not `@contextmanager` nor
    `start_as_current_span` (two generator context managers more): this is every step's hot path.
    A non-recording span (no provider) is neither made current nor ended (there is nothing to end)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.token: object = None

    def __enter__(self) -> Span:
        if self.span.is_recording():
            self.token = context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> None:
        if self.token is None:
            return
        context.detach(self.token)  # type: ignore[arg-type]
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(
                Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )
        self.span.end()


def chat_span(request: PromptGenRequest, step: str) -> AbstractContextManager[Span]:
    """A span around one model call (its request attributes given at its start, in one mapping);
    `chat_result` fills in what came back (and the content, when captured: the switch is read once
    per call, there; an environment lookup of an unset variable raises and catches a KeyError)."""
    span = _TRACER.start_span(
        f"chat {request.model}",
        kind=SpanKind.CLIENT,
        attributes={OPERATION: "chat", REQUEST_MODEL: request.model, STEP: step},
    )
    return _Scope(span)


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
        FINISH_REASONS: (result.finish_reason,),
        COST: result.cost_usd,
    }
    if meta.get("provider"):
        attributes[PROVIDER] = str(meta["provider"])
    if meta.get(
        "fallback_from"
    ):  # a capacity/unavailable switch between providers (providers/facade.py)
        attributes[FALLBACK_FROM] = [
            str(f.get("provider")) for f in meta["fallback_from"]
        ]
    if capture_content():
        messages = [m.model_dump(mode="json") for m in request.messages or []]
        attributes[INPUT_MESSAGES] = json.dumps(messages, ensure_ascii=False)
        output = {
            "text": result.text,
            "tool_calls": [c.model_dump(mode="json") for c in result.tool_calls],
        }
        attributes[OUTPUT_MESSAGES] = json.dumps(output, ensure_ascii=False)
    span.set_attributes(attributes)


def tool_span(name: str, call_id: str, step: str) -> AbstractContextManager[Span]:
    """A span around one tool execution (a one-phase run, a two-phase start or wait)."""
    span = _TRACER.start_span(
        f"execute_tool {name}",
        kind=SpanKind.INTERNAL,
        attributes={
            OPERATION: "execute_tool",
            TOOL_NAME: name,
            TOOL_CALL_ID: call_id,
            STEP: step,
        },
    )
    return _Scope(span)


def tool_result(span: Span, cost_usd: float) -> None:
    if span.is_recording():
        span.set_attribute(COST, cost_usd)
