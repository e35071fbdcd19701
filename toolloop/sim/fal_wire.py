"""fal's OpenAI-compatible router wire (`POST /openrouter/router/openai/v1/chat/completions`).

Requests are OpenAI chat completions with `cache_control` on text parts (PROVIDERS.md, fal section);
answers are OpenRouter-style chat completions whose `usage` carries `prompt_tokens` (every prompt
token, cached ones included), `completion_tokens`, `prompt_tokens_details.cached_tokens` (read),
`prompt_tokens_details.cache_write_tokens` and `cache_creation_input_tokens` (written),
`cache_read_input_tokens`, and `cost` in USD for the models of the model catalogue
(`toolloop.providers.models`: input, output, cache read, 5-minute and 1-hour write at each model's
own rates). A refusal is `finish_reason: "content_filter"`.
With reasoning on, the message carries OpenRouter's `reasoning` text and signed `reasoning_details`;
details sent back changed are a 400 (toolloop/sim/thinking.py). A turn cut under
`max_tokens_needed` ends `length` with its last call's arguments cut short.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    ImagePart,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from toolloop.providers.catalog import Catalog, token_cost
from toolloop.providers.models import default_catalog
from toolloop.sim import thinking
from toolloop.sim.cache import Block, CacheUsage
from toolloop.sim.common import (
    Parsed,
    WireInputError,
    call_id,
    canonical,
    conversation_ids,
    message_id,
    parse_mark,
    require,
    text_block,
    text_part,
)
from toolloop.sim.script import SimRequest, SimTurn
from toolloop.sim.tokens import IMAGE_TOKENS, compact_json, json_tokens, text_tokens

FINISH_REASONS = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

ERROR_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    402: "payment_required",
    403: "forbidden",
    404: "not_found_error",
    429: "rate_limited",
    500: "server_error",
    529: "overloaded",
}


def error_body(status: int, message: str, request_id: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "bad_request")
    return {
        "error": {"code": status, "type": kind, "message": message},
        "request_id": request_id,
    }


def api_key(headers: Any) -> str:
    scheme, _, key = str(headers.get("authorization") or "").partition(" ")
    return key.strip() if scheme == "Key" else ""


def header_problem(headers: Any) -> str | None:
    return None


def parse(body: Any) -> Parsed:
    require(isinstance(body, dict), "The request body must be a JSON object.")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "model is required")
    require(body.get("stream") in (None, True, False), "stream must be true or false")
    options = body.get("stream_options")
    require(
        options is None
        or (
            isinstance(options, dict)
            and options.get("include_usage") in (None, True, False)
        ),
        'stream_options must be an object like {"include_usage": true}',
    )
    raw_messages = body.get("messages")
    require(
        isinstance(raw_messages, list) and bool(raw_messages),
        "messages must not be empty",
    )
    blocks: list[Block] = []
    tools = _tools(body.get("tools") or [], blocks)
    system_texts: list[str] = []
    messages: list[ChatMessage] = []
    choice = canonical(body.get("tool_choice"))
    start, first = len(blocks), 0
    for index, raw in enumerate(raw_messages):
        require(isinstance(raw, dict), f"messages[{index}] must be an object")
        role = raw.get("role")
        context = f"{role}|{choice if not messages and role != 'system' else ''}|"
        if not messages:  # the history starts after the system messages
            start = len(blocks)
        if role == "system":
            require(not messages, "system messages must come first")
            system_texts.append(_system(raw.get("content"), context, blocks))
        elif role == "user":
            messages.append(
                UserMessage(content=_content(raw.get("content"), context, blocks))
            )
        elif role == "assistant":
            messages.append(_assistant(raw, context, blocks))
        elif role == "tool":
            tool_call_id = str(raw.get("tool_call_id") or "")
            _text_only(raw.get("content"), index)
            content = _content(raw.get("content"), f"{context}{tool_call_id}|", blocks)
            messages.append(ToolMessage(tool_call_id=tool_call_id, content=content))
        else:
            raise WireInputError(
                f"messages[{index}].role {role!r} is not system, user, assistant or tool"
            )
        first = first or (len(blocks) - start if messages else 0)
    problem = thinking.check_fal(body)
    if problem is not None:
        raise WireInputError(problem)
    system = "\n".join(system_texts) if system_texts else None
    conversation, history = conversation_ids("fal", system, blocks[start:], first)
    assistants = sum(1 for message in messages if message.role == "assistant")
    request = SimRequest(
        "fal",
        str(model),
        system,
        messages,
        tools,
        assistants,
        conversation,
        history,
        body,
    )
    return Parsed(request, blocks)


def render(
    turn: SimTurn, request: SimRequest, usage: CacheUsage, refusal: bool
) -> dict[str, Any]:
    calls = []
    reasoning = thinking.fal_fields(turn, request)
    completion = text_tokens(turn.text) + text_tokens(
        str(reasoning.get("reasoning") or "")
    )
    refused = refusal or turn.refusal is not None
    scripted = [] if refused else turn.tool_calls
    cut = not refused and turn.cut_by(request.body.get("max_tokens"))
    for position, call in enumerate(scripted):
        arguments = (
            call.raw_arguments
            if call.raw_arguments is not None
            else compact_json(call.input)
        )
        if cut and position == len(scripted) - 1:
            # stopped while writing them
            arguments = arguments[: max(1, len(arguments) // 2)]
        calls.append(
            {
                "id": call_id(request.history_hash, position, "call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            }
        )
        completion += text_tokens(call.name) + text_tokens(arguments)
    if refused:
        finish, native = "content_filter", "refusal"
    elif cut:
        finish, native = "length", "max_tokens"
    elif turn.stop_reason:
        finish = FINISH_REASONS.get(turn.stop_reason, turn.stop_reason)
        native = turn.stop_reason
    else:
        finish, native = ("tool_calls", "tool_use") if calls else ("stop", "end_turn")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn.text or (None if calls else ""),
    }
    message.update(reasoning)
    if calls:
        message["tool_calls"] = calls
    body_usage: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": usage.prompt_tokens + completion,
        "prompt_tokens_details": {
            "cached_tokens": usage.cache_read_input_tokens,
            "cache_write_tokens": usage.cache_creation_input_tokens,
        },
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
    }
    cost = price(request.model, usage, completion)
    if cost is not None:
        body_usage["cost"] = cost
    body_usage.update(turn.usage or {})
    return {
        "id": message_id(request.history_hash, "gen-"),
        "object": "chat.completion",
        "created": 0,
        "model": request.model,
        "provider": "Simulator",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "native_finish_reason": native,
            }
        ],
        "usage": body_usage,
    }


def price(
    model: str, usage: CacheUsage, completion: int, catalog: Catalog | None = None
) -> float | None:
    """The answer's cost in USD at the catalogue's rates, cache reads and 5-minute / 1-hour writes
    each at its own; None for a model the catalogue does not price."""
    found = (catalog or default_catalog()).price(model)
    if found is None:
        return None
    cost = token_cost(
        found,
        input=usage.input_tokens,
        output=completion,
        cache_read=usage.cache_read_input_tokens,
        cache_write=usage.ephemeral_5m_input_tokens,
        cache_write_1h=usage.ephemeral_1h_input_tokens,
    )
    return round(cost, 6)


def _tools(raw_tools: Any, blocks: list[Block]) -> list[ToolDefinition]:
    require(isinstance(raw_tools, list), "tools must be a list")
    tools = []
    for index, tool in enumerate(raw_tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        require(
            isinstance(function, dict) and isinstance(function.get("name"), str),
            f"tools[{index}]: bad tool",
        )
        assert isinstance(function, dict)
        plain = {key: value for key, value in tool.items() if key != "cache_control"}
        blocks.append(
            Block(
                "tool|" + canonical(plain),
                json_tokens(function),
                parse_mark(tool.get("cache_control")),
            )
        )
        schema = function.get("parameters")
        tools.append(
            ToolDefinition(
                name=function["name"],
                description=str(function.get("description") or ""),
                input_schema=schema if isinstance(schema, dict) else {},
            )
        )
    return tools


def _system(content: Any, context: str, blocks: list[Block]) -> str:
    parts = _content(content, context, blocks)
    if isinstance(parts, str):
        return parts
    return "\n".join(part.text for part in parts if part.type == "text")


def _content(
    content: Any, context: str, blocks: list[Block]
) -> str | list[ContentPart]:
    if content is None or isinstance(content, str):
        text = content or ""
        blocks.append(text_block(context, text))
        return text
    require(
        isinstance(content, list), "message content must be a string or a list of parts"
    )
    parts: list[ContentPart] = []
    for part in content:
        require(isinstance(part, dict), "content parts must be objects")
        plain = {key: value for key, value in part.items() if key != "cache_control"}
        mark = parse_mark(part.get("cache_control"))
        if part.get("type") == "text":
            text = str(part.get("text", ""))
            blocks.append(text_block(context, text, mark))
            parts.append(text_part(text, mark is not None))
        elif part.get("type") == "image_url":
            image_url = part.get("image_url")
            url = str(
                image_url.get("url") if isinstance(image_url, dict) else image_url
            )
            blocks.append(Block(context + canonical(plain), IMAGE_TOKENS, mark))
            parts.append(_image(url))
        else:
            raise WireInputError(f"Unsupported content part type {part.get('type')!r}.")
    return parts


def _text_only(content: Any, index: int) -> None:
    """A tool message carries text only (the OpenAI tool-message schema): an image there is refused."""
    if not isinstance(content, list):
        return
    for position, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        require(
            kind == "text",
            f"Invalid 'messages[{index}].content[{position}]': a tool message's content parts must be "
            f"of type 'text', got {kind!r}. Send images in a user message after the tool messages.",
        )


def _image(url: str) -> ImagePart:
    digest = hashlib.sha256(url.encode()).hexdigest()
    mime = url[5:].split(";", 1)[0] if url.startswith("data:") else "image/*"
    path = f"sim://image/{digest[:16]}" if url.startswith("data:") else url
    return ImagePart(path=path, mime_type=mime, hash=digest)


def _assistant(
    raw: dict[str, Any], context: str, blocks: list[Block]
) -> AssistantMessage:
    content = raw.get("content")
    text = content if isinstance(content, str) else None
    if isinstance(content, list):
        text = "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    if text:
        blocks.append(text_block(context, text))
    calls = []
    for raw_call in raw.get("tool_calls") or []:
        require(
            isinstance(raw_call, dict) and isinstance(raw_call.get("function"), dict),
            "bad tool_calls entry",
        )
        function = raw_call["function"]
        arguments = function.get("arguments")
        arguments_text = (
            arguments if isinstance(arguments, str) else compact_json(arguments)
        )
        tokens = text_tokens(str(function.get("name"))) + text_tokens(arguments_text)
        blocks.append(Block(context + canonical(raw_call), tokens))
        calls.append(
            ToolCall(
                id=str(raw_call.get("id")),
                name=str(function.get("name")),
                input=_arguments(arguments),
            )
        )
    return AssistantMessage(content=text or None, tool_calls=calls or None)


def _arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
