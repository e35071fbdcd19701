"""What the loop makes from a step's stored value: the stop details of an answer (`refusal_of`,
`cut_off`, `retry_room`), the validated value (`validated`) and the history message and event
(`derived`, `model_records`, `tool_records`), memoized in the run's `RunMemo` (toolloop/memo.py) by
the identity of the stored value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

import toolloop.memo
from toolloop.contract import (
    AssistantMessage,
    FinishReason,
    PromptGenResult,
    ToolCall,
    ToolMessage,
)
from toolloop.loop.tools import message_content, summary
from toolloop.loop.types import ModelEvent, Refusal, ToolEvent, ToolOutput
from toolloop.memo import RunMemo

MIN_RETRY_MAX_TOKENS = 1024


def refusal_of(result: PromptGenResult) -> Refusal:
    meta = result.meta or {}
    category, explanation = meta.get("category"), meta.get("explanation")
    return Refusal(
        category=category if isinstance(category, str) else None,
        explanation=explanation if isinstance(explanation, str) else None,
    )


def cut_off(result: PromptGenResult) -> list[str]:
    """Ids of the answer's tool calls whose input was cut at the output limit: what the provider
    names in `meta["cut_off"]`, else the last call of a `length` answer (where a cut falls)."""
    if result.finish_reason != "length" or not result.tool_calls:
        return []
    named = (result.meta or {}).get("cut_off")
    if isinstance(named, list):
        ids = {call.id for call in result.tool_calls}
        return [call_id for call_id in named if call_id in ids]
    return [result.tool_calls[-1].id]


def retry_room(result: PromptGenResult) -> int:
    """The output room of a cut-off turn asked again: twice what the cut answer had (the provider's
    `meta["max_tokens"]`, else its output tokens), at least MIN_RETRY_MAX_TOKENS. The provider keeps
    it within what the model allows."""
    sent = (result.meta or {}).get("max_tokens")
    room = (
        sent if isinstance(sent, int) and not isinstance(sent, bool) and sent > 0 else 0
    )
    return max(2 * (room or result.usage.completion_tokens), MIN_RETRY_MAX_TOKENS)


_Model = TypeVar("_Model", PromptGenResult, ToolOutput)


def validated(memo: RunMemo, model: type[_Model], value: Any) -> _Model:
    """`model.model_validate(value)`, memoized in the run's memo by the identity of `value`.

    A journal that hands back the same decoded object for a stored step every time it replays it
    (MemoryJournal; the durable worker's segment journal, whose decoded entries live across a run's
    steps) gets the same frozen model back without validating it again: replay re-reads every stored
    step of the segment at every step, so this is most of what a long segment costs. The memo holds `value`
    itself, so its identity cannot be reused while the entry lives; it is emptied when full. A memo
    the loop made for itself (`replays` False) keeps nothing: no value is read twice in one loop.
    """
    if not memo.replays:
        return model.model_validate(value)
    done = memo.validated
    key = id(value)
    hit = done.get(key)
    if hit is not None and hit[0] is value and type(hit[1]) is model:
        return hit[1]
    result = model.model_validate(value)
    if len(done) >= toolloop.memo.MAX:
        done.clear()
    done[key] = (value, result)
    return result


def derived(
    memo: RunMemo,
    source: BaseModel,
    key: Any,
    make: Callable[..., tuple[Any, Any]],
    *args: Any,
) -> tuple[Any, Any]:
    """`make(*args)`: the history message and event the loop makes from a step's validated value,
    memoized like `validated`: a value replayed again (the same frozen object) under the same `key`
    gives the same frozen message and event without building them again."""
    if not memo.replays:
        return make(*args)
    memo_key = (id(source), key)
    hit = memo.derived.get(memo_key)
    if hit is not None and hit[0] is source:
        return hit[1]  # type: ignore[no-any-return]
    made = make(*args)
    if len(memo.derived) >= toolloop.memo.MAX:
        memo.derived.clear()
    memo.derived[memo_key] = (source, made)
    return made


def model_records(
    turn: int, result: PromptGenResult
) -> tuple[AssistantMessage, ModelEvent]:
    text = result.text or None
    message = AssistantMessage(
        content=text,
        tool_calls=list(result.tool_calls) or None,
        reasoning=result.reasoning or None,
    )
    meta = result.meta or {}
    provider = meta.get("provider") if isinstance(meta.get("provider"), str) else None
    fallback = (
        meta.get("fallback_from")
        if isinstance(meta.get("fallback_from"), list)
        else None
    )
    finish: FinishReason = result.finish_reason
    event = ModelEvent(
        step=turn,
        text=text,
        tool_calls=result.tool_calls,
        cost_usd=result.cost_usd,
        usage=result.usage,
        finish_reason=finish,
        refusal=refusal_of(result) if finish == "refusal" else None,
        provider=provider,
        fallback_from=fallback or None,
    )
    return message, event


def tool_records(
    turn: int, tool_call: ToolCall, output: ToolOutput, rows: list[str]
) -> tuple[ToolMessage, ToolEvent]:
    message = ToolMessage(
        tool_call_id=tool_call.id,
        content=message_content(output),
        is_error=output.is_error,
    )
    event = ToolEvent(
        step=turn,
        name=tool_call.name,
        call_id=tool_call.id,
        cost_usd=output.cost_usd,
        summary=summary(output),
        rows=rows or output.rows or [],
    )
    return message, event
