"""What a streamed attempt cut mid-answer counts (toolloop/providers/cutcost.py; docs/providers.md,
"Cut streams"), without a network: the readers of both wires say what they received at every
point of a stream (every piece of text, thinking and tool input, stopped blocks and the one in
flight), and a cut attempt is priced from the published rates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolloop import PromptGenResult, PromptGenUsage
from toolloop.providers.anthropic.response import cut_cost as anthropic_cut
from toolloop.providers.anthropic.stream import MessageStream
from toolloop.providers.cutcost import Partial, with_cuts
from toolloop.providers.fal.response import cut_cost as fal_cut
from toolloop.providers.fal.stream import CompletionStream
from toolloop.providers.models import default_catalog
from toolloop.sim.stream import anthropic_events, encode, fal_chunks

TRICKY = 'He said "cut it" \\ twice: é, 🎬.'
MESSAGE = {
    "id": "msg_c",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-5-5",
    "content": [
        {"type": "thinking", "thinking": "Check shot 3. " * 3, "signature": "sig"},
        {"type": "text", "text": "Reading it. " + TRICKY},
        {
            "type": "tool_use",
            "id": "t1",
            "name": "note",
            "input": {"shot": 3, "text": TRICKY},
        },
        {"type": "tool_use", "id": "t2", "name": "note", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "stop_details": None,
    "usage": {
        "input_tokens": 120,
        "cache_read_input_tokens": 2000,
        "output_tokens": 90,
    },
}
PRICE = default_catalog().require("anthropic", "claude-sonnet-5-5").price
# $2 in, $10 out, $0.10 cache read (Sonnet 5.5 migration guide), $2.50 5-minute write per MTok
assert PRICE is not None


def sent(data: Any) -> str:
    """The text, thinking or tool-input piece an event carries ("" for none)."""
    if not isinstance(data, dict):
        return ""
    delta = data.get("delta") or {}
    piece = "".join(
        str(delta.get(key) or "") for key in ("text", "thinking", "partial_json")
    )
    for choice in data.get("choices") or []:  # fal
        part = choice.get("delta") or {}
        piece += str(part.get("content") or "") + str(part.get("reasoning") or "")
        piece += "".join(
            c.get("function", {}).get("arguments") or ""
            for c in part.get("tool_calls") or []
        )
    return piece


def test_an_anthropic_stream_cut_anywhere_says_what_it_received_and_the_usage_it_reported() -> (
    None
):
    events = list(anthropic_events(MESSAGE))
    assert MessageStream(None).partial() is None  # before message_start: not begun
    for cut in range(1, len(events)):  # after message_start, before message_stop
        reader = MessageStream(None)
        # the fast path too
        reader.feed(b"".join(encode(name, data) for name, data, _ in events[:cut]))
        partial = reader.partial()
        assert partial is not None and partial.received == "".join(
            sent(d) for _, d, _ in events[:cut]
        )
        assert partial.usage is not None and partial.usage["input_tokens"] == 120
        assert partial.usage["cache_read_input_tokens"] == 2000
    # message_delta's, merged (1 in message_start)
    assert partial.usage["output_tokens"] == 90


def test_a_fal_stream_cut_anywhere_says_what_it_received() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "note", "arguments": json.dumps({"t": TRICKY})},
    }
    message = {
        "role": "assistant",
        "content": "Reading it. " + TRICKY,
        "reasoning": "Check shot 3. " * 3,
        "tool_calls": [call],
    }
    choice = {"message": message, "finish_reason": "tool_calls"}
    body = {
        "id": "gen-1",
        "model": "anthropic/claude-sonnet-5.5",
        "choices": [choice],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    chunks = list(fal_chunks(body))
    assert CompletionStream(None).partial() is None
    for cut in range(1, len(chunks)):  # after the first chunk, before [DONE]
        reader = CompletionStream(None)
        reader.feed(b"".join(encode(name, data) for name, data, _ in chunks[:cut]))
        partial = reader.partial()
        assert partial is not None
        assert sorted(partial.received) == sorted(
            "".join(sent(d) for _, d, _ in chunks[:cut])
        )
        assert partial.usage == (body["usage"] if cut == len(chunks) - 1 else None)


@pytest.mark.parametrize(
    ("reported", "output", "source"), [(1, 11, "chars"), (50, 50, "usage")]
)
def test_an_anthropic_cut_costs_its_message_start_input_and_the_larger_output(
    reported: int, output: int, source: str
) -> None:
    usage = {
        "input_tokens": 1000,
        "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 300,
        "output_tokens": reported,
    }
    cut = anthropic_cut(
        Partial(usage, "x" * 40 + "é"), price=PRICE, model="claude-sonnet-5-5"
    )
    assert cut.usd == pytest.approx(
        (1000 * 2 + 2000 * 0.10 + 300 * 2.50 + output * 10) / 1e6, abs=1e-12
    )
    assert (cut.usage.prompt_tokens, cut.usage.completion_tokens, cut.output_from) == (
        3300,
        output,
        source,
    )
    hour = anthropic_cut(
        Partial(usage, ""), price=PRICE, model="claude-sonnet-5-5", ttl="1h"
    )
    assert hour.usd == pytest.approx(
        (1000 * 2 + 2000 * 0.10 + 300 * 4.00 + reported * 10) / 1e6, abs=1e-12
    )


def test_a_fal_cut_without_usage_costs_the_character_estimate_of_request_and_pieces() -> (
    None
):
    cut = fal_cut(
        Partial(None, "y" * 40),
        price=PRICE,
        model="anthropic/claude-sonnet-5.5",
        input_text="x" * 400,
    )
    assert cut.usd == pytest.approx((100 * 2 + 10 * 10) / 1e6, abs=1e-12)
    assert (cut.usage.prompt_tokens, cut.usage.completion_tokens) == (100, 10)
    assert (cut.cost_source, cut.output_from, cut.provider) == ("chars", "chars", "fal")
    reported = fal_cut(
        Partial({"prompt_tokens": 900, "completion_tokens": 3, "cost": 0.5}, "y" * 40),
        price=PRICE,
        model="m",
        input_text="x",
    )
    assert reported.usd == 0.5 and reported.cost_source == "usage"


def test_with_cuts_adds_each_cut_before_those_listed_and_marks_the_cost_source_once() -> (
    None
):
    usage = PromptGenUsage(prompt_tokens=1, completion_tokens=1)
    answer = PromptGenResult(
        text="ok", cost_usd=0.01, usage=usage, meta={"cost_source": "tokens"}
    )
    assert with_cuts(answer, []) is answer
    late = anthropic_cut(Partial({"input_tokens": 1000}, ""), price=PRICE, model="m")
    early = fal_cut(
        Partial(None, "y" * 40), price=PRICE, model="m", input_text="x" * 400
    )
    once = with_cuts(answer, [late])
    both = with_cuts(once, [early])
    assert both.meta is not None and both.meta["cost_source"] == "tokens+cut"
    assert both.meta["cut_usd"] == [
        early.usd,
        late.usd,
    ] and both.cost_usd == pytest.approx(0.01 + 0.002 + 0.0003)
    assert [u["provider"] for u in both.meta["cut_usage"]] == ["fal", "anthropic"]
