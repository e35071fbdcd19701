"""A streamed fal router answer (`"stream": true`, OpenAI chat-completion chunks as OpenRouter sends
them), read chunk by chunk into the completion the non-streamed answer would have been, so
`parse_completion` (toolloop/providers/chat_completions.py) maps both the same way.

Each SSE `data:` is one chunk `{id, model, provider, choices: [{index, delta, finish_reason,
native_finish_reason}], usage}`; `data: [DONE]` ends the stream. Per delta:
    content            appended to the message's content (a text delta to `on_delta`); the content
                       stays null when no delta carried a string
    reasoning          appended to the message's `reasoning` (a thinking delta)
    reasoning_details  merged by each entry's `index`: `text` (and `summary`, `data`) appended,
                       any other field set when it is not null (e.g. the `signature` that ends it)
    tool_calls         by `index`: `id`, `type` and `function.name` set when given,
                       `function.arguments` appended (parsed by `parse_completion`)
`usage` comes in the last chunk (`stream_options.include_usage`, whose choices may be empty).
A chunk with an `error` (`{code, message}`; OpenRouter's mid-stream error) is a `StreamFailure` with
`code` as its status (500 when not a status). Comment lines (`: OPENROUTER PROCESSING`) are skipped
by the SSE parser.
"""

from __future__ import annotations

import json
from typing import Any

from toolloop.contract import OnDelta
from toolloop.errors import PromptGenError
from toolloop.fastjson import event_json
from toolloop.providers.call import StreamFailure
from toolloop.providers.cutcost import Partial
from toolloop.providers.sse import DeltaOut, SseParser

_APPENDED = ("text", "summary", "data")


class CompletionStream(DeltaOut):
    """The `StreamReader` of one streamed attempt (toolloop/providers/call.py)."""

    def __init__(self, on_delta: OnDelta | None) -> None:
        super().__init__(on_delta)
        self.sse = SseParser()
        self.top: dict[str, Any] = {}
        self.content: list[str] | None = None
        self.reasoning: list[str] | None = None
        self.details: dict[int, dict[str, Any]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: dict[str, Any] = {
            "finish_reason": None,
            "native_finish_reason": None,
        }
        self.usage: Any = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, chunk: bytes) -> None:
        for name, data in self.sse.feed(chunk):
            self.event(name, data)

    def event(self, name: str, data: str) -> None:
        if data.strip() == "[DONE]":
            self._done = True
            self.flush()
            return
        try:
            chunk = event_json(data)
        except ValueError:
            raise _broken(f"a chunk that is not JSON ({data[:80]!r})") from None
        if not isinstance(chunk, dict):
            raise _broken("a chunk that is not an object")
        error = chunk.get("error")
        if isinstance(error, dict) and error.get("message"):
            self.flush()  # the text read before the error goes out, so its discard marker follows
            code = error.get("code")
            status = code if isinstance(code, int) and 400 <= code <= 599 else 500
            raise StreamFailure(status, json.dumps({"error": error}))
        for key in ("id", "created", "model", "provider"):
            if key in chunk and key not in self.top:
                self.top[key] = chunk[key]
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        for key in self.finish:
            if choice.get(key) is not None:
                self.finish[key] = choice[key]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        content = delta.get("content")
        if isinstance(content, str):
            if self.content is None:
                self.content = []
            self.content.append(content)
            self.emit(content, thinking=False)
        reasoning = delta.get("reasoning")
        if isinstance(reasoning, str):
            if self.reasoning is None:
                self.reasoning = []
            self.reasoning.append(reasoning)
            self.emit(reasoning, thinking=True)
        for entry in delta.get("reasoning_details") or []:
            if isinstance(entry, dict):
                self._detail(entry)
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict):
                self._call(call)

    def _detail(self, entry: dict[str, Any]) -> None:
        index = entry.get("index", len(self.details))
        found = self.details.get(index)
        if found is None:
            self.details[index] = dict(entry)
            return
        for key, value in entry.items():
            if (
                key in _APPENDED
                and isinstance(value, str)
                and isinstance(found.get(key), str | list)
            ):
                if isinstance(found[key], str):
                    # pieces, joined in result(): no copy per piece
                    found[key] = [found[key]]
                found[key].append(value)
            elif value is not None:
                found[key] = value

    def _call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.calls))
        found = self.calls.setdefault(
            index,
            {
                "id": None,
                "type": "function",
                "function": {"name": None, "arguments": []},
            },
        )
        for key in ("id", "type"):
            if call.get(key) is not None:
                found[key] = call[key]
        function = call.get("function")
        if isinstance(function, dict):
            if function.get("name") is not None:
                found["function"]["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                found["function"]["arguments"].append(function["arguments"])

    def partial(self) -> Partial | None:
        """What this attempt received, for the cost of a cut (toolloop/providers/cutcost.py): its
        usage (None: only the last chunk carries one) and its content, reasoning and tool-argument
        pieces, joined; None before a first chunk."""
        pieces = [*(self.content or []), *(self.reasoning or [])]
        pieces += [
            piece
            for call in self.calls.values()
            for piece in call["function"]["arguments"]
        ]
        if not (self.top or pieces or self.details or self.usage is not None):
            return None
        return Partial(
            self.usage if isinstance(self.usage, dict) else None, "".join(pieces)
        )

    def result(self) -> Any:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.content is None else "".join(self.content),
        }
        if self.reasoning is not None:
            message["reasoning"] = "".join(self.reasoning)
        if self.details:
            message["reasoning_details"] = [
                _joined(self.details[i]) for i in sorted(self.details)
            ]
        if self.calls:
            message["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": "".join(call["function"]["arguments"]),
                    },
                }
                for call in (self.calls[i] for i in sorted(self.calls))
            ]
        body = {
            **self.top,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, **self.finish}],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return body  # every string came through event_json: no lone surrogate


def _joined(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        key: "".join(value) if key in _APPENDED and isinstance(value, list) else value
        for key, value in entry.items()
    }


def _broken(what: str) -> PromptGenError:
    return PromptGenError(
        f"fal sent a stream that cannot be read: {what}.\n"
        "  Check the run URL points at fal's router; try again or use another prompt-gen provider.",
        status=502,
        retryable=True,
    )
