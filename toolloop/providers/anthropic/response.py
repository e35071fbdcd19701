"""An Anthropic Messages API answer -> our `PromptGenResult`.

content blocks   text -> `text` (joined in order); tool_use -> `tool_calls`; thinking ignored
stop_reason      end_turn, stop_sequence -> stop; tool_use -> tool_calls; max_tokens -> length;
                 anything else (refusal, pause_turn, missing) -> other
usage            prompt_tokens = input + cache read + cache write; cached_tokens = cache read;
                 cache_write_tokens = cache write; cached_read/write_tokens only when reported;
                 cache_write_5m/1h_tokens from `usage.cache_creation.ephemeral_5m/1h_input_tokens`
                 (the SDK's `CacheCreation`), else every write at the request's TTL
cost             Anthropic reports no cost: tokens x the model's catalogue price, cache reads,
                 5-minute and 1-hour writes each at their own rate; meta["cost_source"] = "tokens"
"""

from __future__ import annotations

import json
import math
from typing import Any

from toolloop.contract import FinishReason, PromptGenResult, PromptGenUsage, ToolCall
from toolloop.errors import PromptGenError, ToolArgumentsError
from toolloop.providers.catalog import ModelPrice, token_cost
from toolloop.providers.common import CacheTtl
from toolloop.providers.http import valid_text

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


def parse_message(data: Any, *, price: ModelPrice, model: str, ttl: CacheTtl = "5m") -> PromptGenResult:
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
    split = usage_data.get("cache_creation")
    if isinstance(split, dict):
        write_5m = _count(split, "ephemeral_5m_input_tokens") or 0
        write_1h = _count(split, "ephemeral_1h_input_tokens") or 0
    else:
        write_5m, write_1h = (0, write or 0) if ttl == "1h" else (write or 0, 0)
    usage = PromptGenUsage(
        prompt_tokens=uncached + (read or 0) + (write or 0),
        completion_tokens=output,
        cached_tokens=read or 0,
        cache_write_tokens=write or 0,
        cached_read_tokens=read,
        cached_write_tokens=write,
        cache_write_5m_tokens=write_5m if write is not None else None,
        cache_write_1h_tokens=write_1h if write is not None else None,
    )
    cost = token_cost(
        price,
        input=uncached,
        output=output,
        cache_read=read or 0,
        cache_write=write_5m,
        cache_write_1h=write_1h,
    )
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
