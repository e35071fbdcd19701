"""The Anthropic Messages API wire (`POST /v1/messages`): request parsing, answers, errors.

Parsing yields the neutral `SimRequest` and the prompt's cache blocks in prefix order (tools, system,
messages; a `tool_result`'s inner blocks count as blocks), after the thinking rules of
toolloop/sim/thinking.py (signed blocks back unchanged and first inside a tool loop). With thinking
on, an answer begins with its signed thinking blocks. A scripted refusal answers `stop_reason:
refusal` with `stop_details`; a turn cut under `max_tokens_needed` ends in a `tool_use` whose
input is `{}`, stop reason `max_tokens`. Answers follow the SDK's `Message` type;
tool arguments that are not JSON (`raw_arguments`) are sent as a string `input`, which no real
answer has: a client must refuse it as arguments that are not JSON.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
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
from toolloop.sim.tokens import IMAGE_TOKENS, json_tokens, text_tokens

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "other": "pause_turn",
}


def error_body(status: int, message: str, request_id: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": request_id,
    }


def api_key(headers: Any) -> str:
    """The `x-api-key` header, else an `Authorization: Bearer` token (newer SDKs send that)."""
    scheme, _, token = str(headers.get("authorization") or "").partition(" ")
    return str(
        headers.get("x-api-key") or (token if scheme == "Bearer" else "")
    ).strip()


VERSIONS = ("2023-06-01", "2026-10-21")
"""The `anthropic-version` values the simulator serves (the versioning page lists these two after
2023-01-01); the rules of each are in toolloop/sim/rules.py (`check_version`)."""


def header_problem(headers: Any) -> str | None:
    version = headers.get("anthropic-version")
    if not version:
        return "anthropic-version: header is required"
    if version not in VERSIONS:  # the real API's wording for this is not confirmed
        return f"anthropic-version: {version!r} is not a known version; use one of {', '.join(VERSIONS)}"
    return None


def parse(body: Any) -> Parsed:
    require(isinstance(body, dict), "The request body must be a JSON object.")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "model: Field required")
    require(isinstance(body.get("max_tokens"), int), "max_tokens: Field required")
    require(
        body.get("stream") in (None, True, False),
        "stream: Input should be a valid boolean",
    )
    raw_messages = body.get("messages")
    require(
        isinstance(raw_messages, list) and bool(raw_messages),
        "messages: at least one message is required",
    )
    blocks: list[Block] = []
    tools = _tools(body.get("tools") or [], blocks)
    system = _system(body.get("system"), blocks)
    messages: list[ChatMessage] = []
    choice = canonical(body.get("tool_choice"))
    start, first = len(blocks), 0
    for index, raw in enumerate(raw_messages):
        require(
            isinstance(raw, dict) and raw.get("role") in ("user", "assistant"),
            f"messages.{index}: bad role",
        )
        context = f"{raw['role']}|{choice if index == 0 else ''}|"
        if raw["role"] == "assistant":
            messages.append(_assistant(raw.get("content"), context, blocks))
        else:
            messages.extend(_user(raw.get("content"), context, blocks))
        first = first or len(blocks) - start
    problem = thinking.check_anthropic(body)
    if problem is not None:
        raise WireInputError(problem)
    conversation, history = conversation_ids("anthropic", system, blocks[start:], first)
    assistants = sum(1 for message in messages if message.role == "assistant")
    request = SimRequest(
        "anthropic",
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
    content = thinking.anthropic_blocks(turn, request)
    output = sum(
        text_tokens(str(block.get("thinking") or block.get("data")))
        for block in content
    )
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    output += text_tokens(turn.text)
    refused = refusal or turn.refusal is not None
    calls = [] if refused else turn.tool_calls
    cut = not refused and turn.cut_by(request.body.get("max_tokens"))
    for position, call in enumerate(calls):
        tool_input: Any = (
            call.raw_arguments if call.raw_arguments is not None else call.input
        )
        if cut and position == len(calls) - 1:
            tool_input = {}  # the answer stopped while this input was being written
        content.append(
            {
                "type": "tool_use",
                "id": call_id(request.history_hash, position, "toolu_"),
                "name": call.name,
                "input": tool_input,
            }
        )
        output += json_tokens({"name": call.name, "input": tool_input})
    if refused:
        stop = "refusal"
    elif cut:
        stop = "max_tokens"
    elif turn.stop_reason:
        stop = STOP_REASONS.get(turn.stop_reason, turn.stop_reason)
    else:
        stop = "tool_use" if turn.tool_calls else "end_turn"
    details = turn.refusal
    stop_details = (
        {
            "type": "refusal",
            "category": details.category if details else None,
            "explanation": details.explanation if details else None,
        }
        if refused
        else None
    )
    body_usage: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.ephemeral_5m_input_tokens,
            "ephemeral_1h_input_tokens": usage.ephemeral_1h_input_tokens,
        },
        "output_tokens": output,
        "service_tier": "standard",
    }
    body_usage.update(turn.usage or {})
    return {
        "id": message_id(request.history_hash, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "stop_details": stop_details,
        "usage": body_usage,
    }


def _tools(raw_tools: Any, blocks: list[Block]) -> list[ToolDefinition]:
    require(isinstance(raw_tools, list), "tools: must be a list")
    tools = []
    for index, tool in enumerate(raw_tools):
        require(
            isinstance(tool, dict) and isinstance(tool.get("name"), str),
            f"tools.{index}: name required",
        )
        plain = {key: value for key, value in tool.items() if key != "cache_control"}
        blocks.append(
            Block(
                "tool|" + canonical(plain),
                json_tokens(plain),
                parse_mark(tool.get("cache_control")),
            )
        )
        schema = tool.get("input_schema")
        tools.append(
            ToolDefinition(
                name=tool["name"],
                description=str(tool.get("description") or ""),
                input_schema=schema if isinstance(schema, dict) else {},
            )
        )
    return tools


def _system(raw: Any, blocks: list[Block]) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        blocks.append(text_block("system|", raw))
        return raw
    require(isinstance(raw, list), "system: must be a string or a list of text blocks")
    texts = []
    for block in raw:
        require(
            isinstance(block, dict) and block.get("type") == "text",
            "system: only text blocks are allowed",
        )
        texts.append(str(block.get("text", "")))
        blocks.append(
            text_block("system|", texts[-1], parse_mark(block.get("cache_control")))
        )
    return "\n".join(texts)


def _assistant(content: Any, context: str, blocks: list[Block]) -> AssistantMessage:
    if isinstance(content, str):
        blocks.append(text_block(context, content))
        return AssistantMessage(content=content or None)
    require(
        isinstance(content, list),
        "assistant content must be a string or a list of blocks",
    )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        require(isinstance(block, dict), "assistant content blocks must be objects")
        mark = parse_mark(block.get("cache_control"))
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
            blocks.append(text_block(context, texts[-1], mark))
            continue
        if block.get("type") == "tool_use":
            call = {
                "id": block.get("id"),
                "name": block.get("name"),
                "input": block.get("input"),
            }
            calls.append(
                ToolCall(
                    id=str(call["id"]), name=str(call["name"]), input=call["input"]
                )
            )
            key, tokens = (
                canonical(call),
                json_tokens({"name": call["name"], "input": call["input"]}),
            )
        else:
            plain = {
                key: value for key, value in block.items() if key != "cache_control"
            }
            key, tokens = canonical(plain), json_tokens(plain)
        blocks.append(Block(context + key, tokens, mark))
    return AssistantMessage(content="".join(texts) or None, tool_calls=calls or None)


def _user(content: Any, context: str, blocks: list[Block]) -> list[ChatMessage]:
    if isinstance(content, str):
        blocks.append(text_block(context, content))
        return [UserMessage(content=content)]
    require(
        isinstance(content, list), "user content must be a string or a list of blocks"
    )
    out: list[ChatMessage] = []
    parts: list[ContentPart] = []
    for block in content:
        require(isinstance(block, dict), "user content blocks must be objects")
        if block.get("type") == "tool_result":
            out.append(_tool_result(block, context, blocks))
        else:
            parts.append(
                _part(block, context, blocks, parse_mark(block.get("cache_control")))
            )
    if parts:
        out.append(UserMessage(content=parts))
    return out


def _tool_result(
    block: dict[str, Any], context: str, blocks: list[Block]
) -> ToolMessage:
    tool_use_id = str(block.get("tool_use_id") or "")
    context = f"{context}tool_result:{tool_use_id}:{bool(block.get('is_error'))}|"
    outer = parse_mark(block.get("cache_control"))
    inner = block.get("content")
    if inner is None or isinstance(inner, str):
        text = inner or ""
        blocks.append(text_block(context, text, outer))
        return ToolMessage(tool_call_id=tool_use_id, content=text)
    require(
        isinstance(inner, list),
        "tool_result content must be a string or a list of blocks",
    )
    parts = []
    for index, part in enumerate(inner):
        require(isinstance(part, dict), "tool_result content blocks must be objects")
        mark = parse_mark(part.get("cache_control")) or (
            outer if index == len(inner) - 1 else None
        )
        parts.append(_part(part, context, blocks, mark))
    if not inner:
        blocks.append(Block(context, 0, outer))
    return ToolMessage(tool_call_id=tool_use_id, content=parts)


def _part(
    block: dict[str, Any], context: str, blocks: list[Block], mark: Any
) -> ContentPart:
    plain = {key: value for key, value in block.items() if key != "cache_control"}
    if block.get("type") == "text":
        text = str(block.get("text", ""))
        blocks.append(text_block(context, text, mark))
        return text_part(text, mark is not None)
    if block.get("type") == "image":
        blocks.append(Block(context + canonical(plain), IMAGE_TOKENS, mark))
        return _image(block.get("source"))
    raise WireInputError(f"Unsupported content block type {block.get('type')!r}.")


def _image(source: Any) -> ImagePart:
    require(isinstance(source, dict), "image.source must be an object")
    if source.get("type") == "url":
        url = str(source.get("url"))
        return ImagePart(
            path=url, mime_type="image/*", hash=hashlib.sha256(url.encode()).hexdigest()
        )
    require(
        source.get("type") == "base64", "image.source.type must be 'base64' or 'url'"
    )
    try:
        data = base64.b64decode(str(source.get("data", "")), validate=True)
    except (binascii.Error, ValueError) as error:
        raise WireInputError("image.source.data is not valid base64.") from error
    digest = hashlib.sha256(data).hexdigest()
    mime = str(source.get("media_type") or "image/png")
    return ImagePart(
        path=f"sim://image/{digest[:16]}.{mime.rsplit('/', 1)[-1]}",
        mime_type=mime,
        hash=digest,
    )
