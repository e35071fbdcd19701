"""The pieces of a streamed model call without a network: the SSE parser (any chunking gives the
same events), the readers of both wires (error events classified as their HTTP status, unreadable
streams refused), and the classification of a mid-stream error as the pure `classify` does it."""

from __future__ import annotations

import json

import pytest

from toolloop import DeltaEvent, PromptGenError
from toolloop.providers.anthropic.stream import MessageStream
from toolloop.providers.call import StreamFailure, stream_failure
from toolloop.providers.fal.stream import CompletionStream
from toolloop.providers.retry import (
    Endpoint,
    RetryPolicy,
    classify,
    error_detail,
    error_fields,
)
from toolloop.providers.sse import SseParser
from toolloop.sim.stream import anthropic_events, encode

RAW = (
    b'event: message_start\r\ndata: {"a": 1}\r\n\r\n'
    b": a comment\n"
    b"event: ping\ndata: {}\n\n"
    b"data: line one\ndata: line two \xc3\xa9\n\n"
    b"data: [DONE]\n\n"
)
EVENTS = [
    ("message_start", '{"a": 1}'),
    ("ping", "{}"),
    ("message", "line one\nline two é"),
    ("message", "[DONE]"),
]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(RAW)])
def test_the_sse_parser_gives_the_same_events_however_the_bytes_are_cut(
    size: int,
) -> None:
    parser = SseParser()
    events = []
    for start in range(0, len(RAW), size):
        events.extend(parser.feed(RAW[start : start + size]))
    assert events == EVENTS


def test_an_anthropic_error_event_is_the_status_its_type_stands_for() -> None:
    reader = MessageStream(None)
    body = json.dumps(
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
        }
    )
    with pytest.raises(StreamFailure) as caught:
        reader.event("error", body)
    assert caught.value.status == 529
    endpoint = Endpoint(
        "anthropic", "http://x", "ANTHROPIC_API_KEY", 1.0, RetryPolicy()
    )
    error, wait = classify(
        "anthropic", endpoint, 529, {}, error_detail(body), error_fields(body), 0.5
    )
    assert error.status == 529 and error.retryable and wait == 0.5
    assert (
        stream_failure(
            '{"type": "error", "error": {"type": "invalid_request_error"}}'
        ).status
        == 400
    )
    assert stream_failure("not json").status == 500


def test_anthropic_deltas_before_message_start_or_not_json_are_refused() -> None:
    with pytest.raises(PromptGenError, match="before message_start"):
        MessageStream(None).event(
            "content_block_delta", '{"type": "content_block_delta", "index": 0}'
        )
    with pytest.raises(PromptGenError, match="not JSON"):
        MessageStream(None).event("message_start", "{oops")


def test_anthropic_text_and_thinking_deltas_go_to_on_delta_and_into_the_message() -> (
    None
):
    got: list[DeltaEvent] = []
    reader = MessageStream(got.append)
    events = [
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "content": [],
                "usage": {"input_tokens": 3, "output_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Hm."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "s"},
        },
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "1}"},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        reader.event(event["type"], json.dumps(event))
    assert reader.done and got == [DeltaEvent(text="Hm.", thinking=True)]
    assert reader.result() == {
        "id": "m",
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 9},
        "content": [
            {"type": "thinking", "thinking": "Hm.", "signature": "s"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
        ],
    }


def args(piece: str) -> dict[str, object]:
    return {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [{"index": 0, "function": {"arguments": piece}}]
                },
            }
        ]
    }


def test_a_fal_error_chunk_is_a_failure_with_its_code_and_tool_calls_merge_by_index() -> (
    None
):
    reader = CompletionStream(None)
    with pytest.raises(StreamFailure) as caught:
        reader.event(
            "message", json.dumps({"error": {"code": 502, "message": "upstream died"}})
        )
    assert caught.value.status == 502
    reader = CompletionStream(None)
    chunks = [
        {
            "id": "g",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": ""},
                            }
                        ],
                    },
                }
            ],
        },
        args('{"a"'),
        args(":1}"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    ]
    for chunk in chunks:
        reader.event("message", json.dumps(chunk))
    reader.event("message", "[DONE]")
    result = reader.result()
    assert reader.done and result["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
    }
    (choice,) = result["choices"]
    assert (
        choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    )
    assert choice["message"]["tool_calls"] == [
        {
            "id": "c",
            "type": "function",
            "function": {"name": "f", "arguments": '{"a":1}'},
        }
    ]


TRICKY = 'He said "cut it" \\ twice.\nThen: é, 🎬, \u2028 and a tab\t.'
ANSWER = {
    "id": "msg_t",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-5-5",
    "content": [
        {"type": "thinking", "thinking": "Hm, " * 30 + TRICKY, "signature": "sig"},
        {"type": "text", "text": "plain words " * 40 + TRICKY + " done"},
        {
            "type": "tool_use",
            "id": "t1",
            "name": "note",
            "input": {"shot": 3, "text": TRICKY},
        },
        {"type": "text", "text": "after the call"},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "stop_details": None,
    "usage": {"input_tokens": 120, "output_tokens": 90},
}


@pytest.mark.parametrize("size", [1, 5, 64, 333, 1400, 100_000])
def test_anthropic_feed_reads_any_chunking_as_the_event_by_event_reader_and_the_whole(
    size: int,
) -> None:
    raw = b"".join(encode(name, data) for name, data, _ in anthropic_events(ANSWER))
    slow: list[DeltaEvent] = []
    one_by_one = MessageStream(slow.append)  # every event parsed as JSON
    for name, data in SseParser().feed(raw):
        one_by_one.event(name, data)
        one_by_one.flush()
    fast: list[DeltaEvent] = []
    # runs of text / thinking deltas read without JSON
    reader = MessageStream(fast.append)
    for start in range(0, len(raw), size):
        reader.feed(raw[start : start + size])
        reader.flush()
    assert reader.done and reader.result() == one_by_one.result() == ANSWER
    for thinking in (True, False):
        text = "".join(d.text for d in fast if d.thinking is thinking)
        assert text == "".join(d.text for d in slow if d.thinking is thinking)
    # a read's pieces (several events) go out as one delta
    assert len(fast) < len(slow) or size < 333
    assert (
        "".join(d.text for d in fast if not d.thinking)
        == ANSWER["content"][1]["text"] + "after the call"
    )


@pytest.mark.parametrize("size", [1, 333, 100_000])
def test_anthropic_feed_of_a_crlf_stream_reads_the_same_answer(size: int) -> None:
    lf = b"".join(encode(name, data) for name, data, _ in anthropic_events(ANSWER))
    # a CR part way: the line path from there on
    raw = lf[:500] + lf[500:].replace(b"\n", b"\r\n")
    got: list[DeltaEvent] = []
    reader = MessageStream(got.append)
    for start in range(0, len(raw), size):
        reader.feed(raw[start : start + size])
        reader.flush()
    assert reader.done and reader.result() == ANSWER
    assert (
        "".join(d.text for d in got if d.thinking) == ANSWER["content"][0]["thinking"]
    )
