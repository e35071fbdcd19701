"""An OpenAI chat-completions answer -> our `PromptGenResult`: the one parser of that shape, for
every provider that answers it (`openai`, toolloop/providers/oneturn.py; fal's router,
toolloop/providers/fal/, whose streamed chunks are put back into this shape first: fal/stream.py).

text          choices[0].message.content; null is "" when the turn has tool calls or the
              finish reason is tool_calls/length, else an incomplete-result error
tool calls    id and function.name required; arguments missing/null/"" -> {}; a non-string
              is kept; a string is parsed, and text that is not JSON -> ToolArgumentsError
finish        stop, tool_calls, length as sent; content_filter -> refusal (meta category None,
              explanation says the content filter stopped it); anything else -> other
reasoning     choices[0].message.reasoning_details: one ReasoningBlock per entry (type
              "reasoning_details", the entry verbatim); without details, a non-empty
              `reasoning` text is one block of type "reasoning"
cut off       a length answer with tool calls: its last call is taken as cut off (meta
              "cut_off"; arguments that are not JSON there are no error); meta "max_tokens" is
              the room the request gave
usage         cached = cache_read_input_tokens, else prompt_tokens_details.cached_tokens;
              cache write = cache_creation_input_tokens, else prompt_tokens_details.cache_write_tokens
cost          usage.cost when a finite number >= 0 (cost_source "usage"); else tokens x price
              with cache reads and writes (at the request's TTL) at their own rates
              ("tokens"); else the character estimate of input and answer ("chars")
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
from toolloop.providers.common import CacheTtl, estimate_tokens


def parse_completion(
    data: Any,
    *,
    price: ModelPrice,
    model: str,
    input_text: str,
    provider: str,
    ttl: CacheTtl = "5m",
    max_tokens: int | None = None,
) -> PromptGenResult:
    """Map a 2xx body; `provider` names who answered; `input_text` feeds the character cost rule
    when no usage is reported. The shape does not split cache writes by TTL: every write is
    counted at the request's `ttl`. `max_tokens`: the answer room the request gave (None: not
    known)."""
    if not isinstance(data, dict):
        data = {}
    _raise_body_error(data, provider)
    choices = data.get("choices")
    choice = (
        choices[0]
        if isinstance(choices, list) and choices and isinstance(choices[0], dict)
        else {}
    )
    raw_message = choice.get("message")
    message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
    raw_finish = choice.get("finish_reason")
    finish: FinishReason = (
        raw_finish if raw_finish in ("stop", "tool_calls", "length") else "other"
    )
    if raw_finish == "content_filter":
        finish = "refusal"
    raw_calls = message.get("tool_calls")
    items = raw_calls if isinstance(raw_calls, list) else []
    cut = finish == "length" and bool(items)
    calls = [
        _tool_call(item, provider, cut and i == len(items) - 1)
        for i, item in enumerate(items)
    ]
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif calls or finish in ("tool_calls", "length"):
        text = ""
    else:
        raise PromptGenError(
            f"{provider} returned an incomplete LLM result.\n"
            "  Expected choices[0].message.content in the response."
        )
    raw_usage = data.get("usage")
    usage_data: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    details = usage_data.get("prompt_tokens_details")
    detail_data: dict[str, Any] = details if isinstance(details, dict) else {}
    prompt = token_count(usage_data, "prompt_tokens")
    completion = token_count(usage_data, "completion_tokens")
    read = _first(
        token_count(usage_data, "cache_read_input_tokens"),
        token_count(detail_data, "cached_tokens"),
    )
    write = _first(
        token_count(usage_data, "cache_creation_input_tokens"),
        token_count(detail_data, "cache_write_tokens"),
    )
    usage = PromptGenUsage(
        prompt_tokens=prompt or 0,
        completion_tokens=completion or 0,
        cached_tokens=read or 0,
        cache_write_tokens=write or 0,
        cached_read_tokens=read,
        cached_write_tokens=write,
        cache_write_5m_tokens=None if write is None or ttl == "1h" else write,
        cache_write_1h_tokens=None if write is None or ttl == "5m" else write,
    )
    reported = usage_data.get("cost")
    if (
        isinstance(reported, int | float)
        and not isinstance(reported, bool)
        and math.isfinite(reported)
    ):
        cost, source = (
            (round(float(reported), 10), "usage") if reported >= 0 else (0.0, "")
        )
    else:
        cost, source = 0.0, ""
    if not source and prompt is not None and completion is not None:
        uncached = max(prompt - (read or 0) - (write or 0), 0)
        writes = {"cache_write_1h" if ttl == "1h" else "cache_write": write or 0}
        cost = token_cost(
            price, input=uncached, output=completion, cache_read=read or 0, **writes
        )
        source = "tokens"
    elif not source:
        answer = text + "".join(json.dumps(c.input) for c in calls)
        cost = token_cost(
            price, input=estimate_tokens(input_text), output=estimate_tokens(answer)
        )
        source = "chars"
    meta: dict[str, Any] = {
        "provider": provider,
        "model": data.get("model") if isinstance(data.get("model"), str) else model,
        "upstream_provider": data.get("provider"),
        "finish_reason": raw_finish,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cost_source": source,
        "partial": finish == "length",
    }
    if finish == "refusal":
        meta["category"] = None
        meta["explanation"] = (
            f"{provider} stopped the answer with finish_reason content_filter "
            f"(upstream: {choice.get('native_finish_reason') or 'not given'})."
        )
    if finish == "length":
        meta["max_tokens"] = max_tokens
        meta["cut_off"] = [calls[-1].id] if cut else []
    return PromptGenResult(
        text=text,
        cost_usd=cost,
        tool_calls=calls,
        finish_reason=finish,
        usage=usage,
        meta=meta,
        reasoning=_reasoning(message, provider),
    )


def _reasoning(message: dict[str, Any], provider: str) -> list[ReasoningBlock] | None:
    details = message.get("reasoning_details")
    if isinstance(details, list) and details:
        entries = [entry for entry in details if isinstance(entry, dict)]
        return [
            ReasoningBlock(provider=provider, type="reasoning_details", data=e)
            for e in entries
        ] or None
    text = message.get("reasoning")
    if isinstance(text, str) and text:
        return [
            ReasoningBlock(
                provider=provider, type="reasoning", data={"reasoning": text}
            )
        ]
    return None


def _raise_body_error(data: dict[str, Any], provider: str) -> None:
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message.strip():
        return
    text = " ".join(message.split())
    text = text if len(text) <= 300 else text[:300] + "..."
    if "content_policy" in text:
        raise PromptGenError(
            f"{provider} flagged the LLM request (content policy): {text}\n"
            "  Change the prompt or images; sending the same request will be refused again."
        )
    raise PromptGenError(
        f"{provider} LLM returned an error: {text}\n  Check the model and the request, then try again."
    )


def _tool_call(item: Any, provider: str, cut: bool = False) -> ToolCall:
    function = item.get("function") if isinstance(item, dict) else None
    call_id = item.get("id") if isinstance(item, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(call_id, str)
        or not isinstance(name, str)
        or not isinstance(function, dict)
    ):
        raise PromptGenError(
            f"{provider} returned an incomplete tool call.\n"
            "  Expected id and function.name on every choices[0].message.tool_calls entry."
        )
    arguments = function.get("arguments")
    if arguments is None or arguments == "":
        value: Any = {}
    elif isinstance(arguments, str):
        try:
            value = valid_text(json.loads(arguments))
        except ValueError:
            if (
                not cut
            ):  # a cut-off call is never run: its half-written arguments are no error
                raise ToolArgumentsError(name, arguments) from None
            value = {}
    else:
        value = arguments
    return ToolCall(id=call_id, name=name, input=value)


def token_count(data: dict[str, Any], key: str) -> int | None:
    """A usage count: a finite number as a whole count >= 0; None when absent or not a number."""
    value = data.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
    ):
        return None
    return max(int(value), 0)


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)
