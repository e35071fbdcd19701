"""An Anthropic Messages API answer -> our `PromptGenResult`.

content blocks   text -> `text` (joined in order); tool_use -> `tool_calls`; thinking,
                 redacted_thinking and compaction -> `reasoning` (each block kept verbatim, in
                 order; a compaction block's `encrypted_content` is round-tripped as the SDK says)
stop_reason      end_turn, stop_sequence -> stop; tool_use -> tool_calls; max_tokens -> length;
                 refusal -> refusal (meta category, explanation from `stop_details`);
                 pause_turn -> paused; model_context_window_exceeded -> PromptGenError;
                 anything else (missing included) -> other
cut off          a max_tokens answer whose last block is a tool_use: that call's input was cut
                 short; meta["cut_off"] names it (else []), meta["max_tokens"] is the room it had
usage            with `usage.iterations` (a server-side compaction's summary pass, billed outside the
                 top level), every count is the sum over the iterations; else the top level:
                 prompt_tokens = input + cache read + cache write; cached_tokens = cache read;
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

from toolloop.contract import (
    FinishReason,
    PromptGenResult,
    PromptGenUsage,
    ReasoningBlock,
    ToolCall,
)
from toolloop.errors import PromptGenError, ToolArgumentsError
from toolloop.fastjson import valid_text
from toolloop.providers.catalog import ModelPrice, token_cost
from toolloop.providers.common import CacheTtl
from toolloop.providers.cutcost import Cut, Partial

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "refusal",
    "pause_turn": "paused",
}
_REASONING = ("thinking", "redacted_thinking", "compaction")


def parse_message(
    data: Any,
    *,
    price: ModelPrice,
    model: str,
    ttl: CacheTtl = "5m",
    max_tokens: int | None = None,
) -> PromptGenResult:
    """Map a 2xx body. A body that is not a message is a `PromptGenError` naming what is missing.
    `max_tokens`: the answer room the request gave (reported as meta["max_tokens"])."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise PromptGenError(
            "anthropic returned an incomplete message.\n"
            "  Expected a JSON object with a 'content' list (the Messages API answer)."
        )
    stop_reason = data.get("stop_reason")
    if stop_reason == "model_context_window_exceeded":
        raise PromptGenError(
            f"anthropic stopped: the conversation no longer fits the context window of {model!r}.\n"
            "  Shorten the history (fewer or smaller tool results, keep_images lower), or use a model "
            "with a larger context window."
        )
    content: list[Any] = data["content"]
    last = content[-1] if content else None
    cut_block = (
        last
        if stop_reason == "max_tokens"
        and isinstance(last, dict)
        and last.get("type") == "tool_use"
        else None
    )
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningBlock] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block, cut=block is cut_block))
        elif kind in _REASONING:
            reasoning.append(
                ReasoningBlock(provider="anthropic", type=kind, data=block)
            )
    raw_usage = data.get("usage")
    usage_data: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    iterations = usage_data.get("iterations")
    if (
        isinstance(iterations, list)
        and iterations
        and all(isinstance(i, dict) for i in iterations)
    ):
        usage_data = _summed(iterations)
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
    finish = (
        _FINISH.get(stop_reason, "other") if isinstance(stop_reason, str) else "other"
    )
    meta: dict[str, Any] = {
        "provider": "anthropic",
        "model": data.get("model") if isinstance(data.get("model"), str) else model,
        "id": data.get("id"),
        "stop_reason": stop_reason,
        "cost_source": "tokens",
        "partial": finish == "length",
    }
    if isinstance(iterations, list) and iterations:
        meta["iterations"] = [
            dict(item) for item in iterations if isinstance(item, dict)
        ]
    if finish == "refusal":
        details = data.get("stop_details")
        details = details if isinstance(details, dict) else {}
        meta["category"] = _text_or_none(details.get("category"))
        meta["explanation"] = _text_or_none(details.get("explanation"))
    if finish == "length":
        meta["max_tokens"] = max_tokens
        meta["cut_off"] = [calls[-1].id] if cut_block is not None and calls else []
    return PromptGenResult(
        text="".join(texts),
        cost_usd=cost,
        tool_calls=calls,
        finish_reason=finish,
        usage=usage,
        meta=meta,
        reasoning=reasoning or None,
    )


def cut_cost(
    partial: Partial, *, price: ModelPrice, model: str, ttl: CacheTtl = "5m"
) -> Cut:
    """A streamed attempt cut mid-answer, priced as an answer with the usage its message_start
    reported and the larger of its reported output and the estimate of what it received
    (toolloop/providers/cutcost.py)."""
    usage = dict(partial.usage or {})
    output, source = partial.output_tokens(_count(usage, "output_tokens") or 0)
    priced = parse_message(
        {"content": [], "usage": {**usage, "output_tokens": output}},
        price=price,
        model=model,
        ttl=ttl,
    )
    return Cut("anthropic", priced.cost_usd, priced.usage, source, "tokens")


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tool_call(block: dict[str, Any], cut: bool = False) -> ToolCall:
    """A tool_use block as a call; `cut`: its input was cut at max_tokens (never run: kept as sent,
    or {} when it is not JSON)."""
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
                if cut:
                    value = {}
                else:
                    raise ToolArgumentsError(name, value) from None
    return ToolCall(id=call_id, name=name, input={} if value is None else value)


_SUMMED = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
_SPLIT = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")


def _summed(iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """The usage of an answer with `usage.iterations` (the SDK's `BetaIterationsUsage`: a server-side
    compaction's summary pass is an iteration of its own, billed outside the top-level counts): every
    count summed over the iterations, the cache-write split too when each iteration reports one."""
    summed: dict[str, Any] = {
        key: sum(_count(item, key) or 0 for item in iterations) for key in _SUMMED
    }
    splits = [item.get("cache_creation") for item in iterations]
    if all(isinstance(split, dict) for split in splits):
        summed["cache_creation"] = {
            key: sum(
                _count(split, key) or 0 for split in splits if isinstance(split, dict)
            )
            for key in _SPLIT
        }
    return summed


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
    ):
        return None
    return max(int(value), 0)
