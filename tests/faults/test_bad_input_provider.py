"""Malformed provider bodies never crash the loop (property-based), for both tool-serving wires.

A 200 answer whose body is a valid Anthropic message / fal chat completion with one to three parts
broken (a value of the wrong type, a key missing, strings with lone surrogates from `\\ud800`
escapes, NaN, huge numbers), or not JSON at all. Whatever arrives, `execute` either returns a result
that a journal can store (its JSON encodes to UTF-8: Redis needs that) or raises a toolloop error
with the two-line message style; never a bare KeyError, TypeError or UnicodeEncodeError.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolloop import PromptGenRequest, ToolDefinition, UserMessage
from toolloop.abort import NEVER_ABORTED
from toolloop.errors import ToolloopError
from toolloop.providers import AnthropicHandler, FalHandler, RetryPolicy

pytestmark = pytest.mark.faults

ANTHROPIC_BODY: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-5-5",
    "content": [
        {"type": "text", "text": "Looking at shot 3."},
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "note",
            "input": {"tag": "a", "text": "ok"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 0},
}
FAL_BODY: dict[str, Any] = {
    "id": "gen-1",
    "object": "chat.completion",
    "model": "anthropic/claude-sonnet-5",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Looking at shot 3.",
                "tool_calls": [
                    {
                        "id": "call_01",
                        "type": "function",
                        "function": {
                            "name": "note",
                            "arguments": '{"tag": "a", "text": "ok"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 120, "completion_tokens": 30, "cost": 0.0012},
}

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        ["\ud800", "ok\udfff", "{not json", "", "tool_use", "text", "[]", "{}"]
    ),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(
        st.sampled_from(["type", "id", "name", "input", "text"]),
        st.text(max_size=5),
        max_size=3,
    ),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def broken_bodies(draw: st.DrawFn, skeleton: dict[str, Any]) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(
            st.sampled_from(
                [b"", b"<html>502 Bad Gateway</html>", b"{", b"null", b"[]", b'"text"']
            )
        )
    body = copy.deepcopy(skeleton)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(junk)
    return json.dumps(
        body
    ).encode()  # ensure_ascii: surrogates travel as \ud800 escapes, as on the wire


REQUEST = PromptGenRequest(
    model="claude-sonnet-5-5",
    system="You review storyboards.",
    messages=[UserMessage(content="Review shot 3.")],
    tools=[
        ToolDefinition(
            name="note", description="Write a note.", input_schema={"type": "object"}
        )
    ],
)
FAST = RetryPolicy(attempts=1)


def _transport(body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda _: httpx.Response(
            200, content=body, headers={"content-type": "application/json"}
        )
    )


async def _check(handler: Any, request: PromptGenRequest) -> None:
    try:
        result = await handler.execute(request, NEVER_ABORTED)
    except ToolloopError as error:
        lines = str(error).splitlines()
        assert len(lines) >= 2 and lines[1].startswith("  "), (
            f"not the two-line style: {error!r}"
        )
        return
    stored = json.dumps(
        result.model_dump(mode="json"), ensure_ascii=False, allow_nan=False
    )
    stored.encode("utf-8")  # what Redis does with a journal entry


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=broken_bodies(ANTHROPIC_BODY))
async def test_malformed_anthropic_bodies_never_crash(body: bytes) -> None:
    handler = AnthropicHandler(
        "sk-ant-FAKE-bodies",
        base_url="http://sim.invalid",
        retry=FAST,
        transport=_transport(body),
    )
    await _check(handler, REQUEST)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=broken_bodies(FAL_BODY))
async def test_malformed_fal_bodies_never_crash(body: bytes) -> None:
    handler = FalHandler(
        "fal-FAKE-bodies",
        run_url="http://sim.invalid",
        retry=FAST,
        transport=_transport(body),
    )
    await _check(
        handler, REQUEST.model_copy(update={"model": "anthropic/claude-sonnet-5"})
    )


async def test_lone_surrogates_from_the_wire_become_replacement_characters() -> None:
    """`\\ud800` escapes are valid JSON but not text: left as they are, the answer could not be
    journaled (the model step failed with a bare UnicodeEncodeError, and again on every retry)."""
    anthropic = copy.deepcopy(ANTHROPIC_BODY)
    anthropic["content"][0]["text"] = "shot \ud800 3"
    anthropic["content"][1]["input"] = {"tag": "a\udfff", "text": '{"x": "\\ud800"}'}
    fal = copy.deepcopy(FAL_BODY)
    fal["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = (
        '{"tag": "\\ud800", "text": "ok"}'
    )
    handlers = [
        (
            AnthropicHandler(
                "k",
                base_url="http://sim.invalid",
                retry=FAST,
                transport=_transport(json.dumps(anthropic).encode()),
            ),
            REQUEST,
        ),
        (
            FalHandler(
                "k",
                run_url="http://sim.invalid",
                retry=FAST,
                transport=_transport(json.dumps(fal).encode()),
            ),
            REQUEST.model_copy(update={"model": "anthropic/claude-sonnet-5"}),
        ),
    ]
    for handler, request in handlers:
        result = await handler.execute(request, NEVER_ABORTED)
        json.dumps(result.model_dump(mode="json"), ensure_ascii=False).encode("utf-8")
        assert "\ufffd" in result.tool_calls[0].input["tag"]
