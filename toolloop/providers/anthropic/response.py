"""An Anthropic Messages API answer -> our `PromptGenResult`.

content blocks   text -> `text` (joined in order); tool_use -> `tool_calls`; thinking ignored
stop_reason      end_turn, stop_sequence -> stop; tool_use -> tool_calls; max_tokens -> length;
                 anything else (refusal, pause_turn, missing) -> other
usage            prompt_tokens = input + cache read + cache write; cached_tokens = cache read;
                 cache_write_tokens = cache write; cached_read/write_tokens only when reported
cost             Anthropic reports no cost: tokens x the model's price row, cache reads and
                 writes at their own rates; meta["cost_source"] = "tokens"
"""

from __future__ import annotations

import json
import math
from typing import Any

from toolloop.contract import FinishReason, PromptGenResult, PromptGenUsage, ToolCall
from toolloop.errors import PromptGenError, ToolArgumentsError
from toolloop.providers.http import valid_text
from toolloop.providers.prices import ModelPrice, token_cost

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


def parse_message(data: Any, *, price: ModelPrice, model: str) -> PromptGenResult:
    """Map a 2xx body. A body that is not a message is a `PromptGenError` naming what is missing."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise PromptGenError(
            "anthropic returned an incomplete message.\n"
            "  Expected a JSON object with a 'content' list (the Messages API answer)."
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in data["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block))
    raw_usage = data.get("usage")
    usage_data: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    uncached = _count(usage_data, "input_tokens") or 0
    output = _count(usage_data, "output_tokens") or 0
    read = _count(usage_data, "cache_read_input_tokens")
    write = _count(usage_data, "cache_creation_input_tokens")
    usage = PromptGenUsage(
        prompt_tokens=uncached + (read or 0) + (write or 0),
        completion_tokens=output,
        cached_tokens=read or 0,
        cache_write_tokens=write or 0,
        cached_read_tokens=read,
        cached_write_tokens=write,
    )
    cost = token_cost(price, input=uncached, output=output, cache_read=read or 0, cache_write=write or 0)
    stop_reason = data.get("stop_reason")
    finish = _FINISH.get(stop_reason, "other") if isinstance(stop_reason, str) else "other"
    return PromptGenResult(
        text="".join(texts),
        cost_usd=cost,
        tool_calls=calls,
        finish_reason=finish,
        usage=usage,
        meta={
            "provider": "anthropic",
            "model": data.get("model") if isinstance(data.get("model"), str) else model,
            "id": data.get("id"),
            "stop_reason": stop_reason,
            "cost_source": "tokens",
            "partial": finish == "length",
        },
    )


def _tool_call(block: dict[str, Any]) -> ToolCall:
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise PromptGenError(
            "anthropic returned an incomplete tool call.\n  Expected 'id' and 'name' on every tool_use block."
        )
    value = block.get("input")
    if isinstance(value, str):
        # The API sends parsed JSON; a string here is arguments text that may not be JSON.
        if not value.strip():
            value = {}
        else:
            try:
                value = valid_text(json.loads(value))
            except ValueError:
                raise ToolArgumentsError(name, value) from None
    return ToolCall(id=call_id, name=name, input={} if value is None else value)


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return max(int(value), 0)
