"""Our `PromptGenRequest` -> an Anthropic Messages API body (`POST /v1/messages`).

Prefix order of Anthropic's cache: tools -> system -> messages. Marks (SPEC 3.3):
- `cache_system`: `cache_control` on the system block; with no system text, on the last tool
  definition (the same prefix: everything before the messages).
- a `TextPart` with `cache=True`: `cache_control` on its text block, also inside a `tool_result`.
Turns: consecutive tool messages become one user turn of `tool_result` blocks, and a user message
right after them joins that turn. Each assistant message is a message of its own: a paused answer
and its continuation go back as two (the API reads consecutive assistant messages as one turn).
Reasoning (SPEC 4.1): an assistant turn starts with its own `thinking` / `redacted_thinking` blocks,
sent back exactly as the API gave them (signature included), before its text and tool use; blocks
another provider produced are left out of this request (the history keeps them).

Reasoning (`params["reasoning"]`), in the shapes of the official SDK (anthropic 2.10):
    None     -> no `thinking`, no `output_config` (the model's default)
    "off"    -> `thinking: {"type": "disabled"}`
    "low" | "medium" | "high" -> `output_config: {"effort": level}` and
                `thinking: {"type": "adaptive"}`; `max_tokens` grows by 2,048 / 8,192 / 24,576 so the
                thinking does not eat the answer's room
Inside a tool-use turn (the last message is a tool result) and when `tool_choice` forces a tool,
thinking is sent as disabled (effort stays): our history does not keep the signed thinking blocks
Anthropic wants back inside a tool-use turn, and it refuses forced tool use with thinking. So the
model thinks at the start of each user turn.
Temperature: the SDK's `MessageCreateParams` has no `temperature` field, so it is not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolloop.contract import (
    AssistantMessage,
    ContentPart,
    ImagePart,
    PromptGenRequest,
    TextPart,
    ToolChoiceName,
    ToolMessage,
)
from toolloop.providers.common import Reasoning, max_tokens_of

THINKING_BUDGET: Mapping[Reasoning, int] = {"low": 2048, "medium": 8192, "high": 24576}
DEFAULT_MAX_TOKENS = 8192
EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}

Block = dict[str, Any]
PROVIDER = "anthropic"


def build_body(
    request: PromptGenRequest, *, model: str, reasoning: Reasoning | None, images: Mapping[str, str]
) -> dict[str, Any]:
    """The JSON body. `images` maps each image path to its base64 bytes (read at send time)."""
    max_tokens = max_tokens_of(request, DEFAULT_MAX_TOKENS)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    tools = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in request.tools or []
    ]
    if request.system:
        if request.cache_system:
            body["system"] = [{"type": "text", "text": request.system, "cache_control": dict(EPHEMERAL)}]
        else:
            body["system"] = request.system
    elif request.cache_system and tools:
        tools[-1]["cache_control"] = dict(EPHEMERAL)
    body["messages"] = _turns(request, images)
    if tools:
        body["tools"] = tools
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request)
    if reasoning == "off":
        body["thinking"] = {"type": "disabled"}
    elif reasoning is not None:
        body["output_config"] = {"effort": reasoning}
        if _thinking_allowed(request):
            body["max_tokens"] = max_tokens + THINKING_BUDGET[reasoning]
            body["thinking"] = {"type": "adaptive"}
        else:
            body["thinking"] = {"type": "disabled"}
    return body


def _thinking_allowed(request: PromptGenRequest) -> bool:
    if request.tool_choice == "required" or isinstance(request.tool_choice, ToolChoiceName):
        return False
    messages = request.messages or []
    return not (messages and isinstance(messages[-1], ToolMessage))


def _tool_choice(request: PromptGenRequest) -> dict[str, Any]:
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceName):
        return {"type": "tool", "name": choice.name}
    return {"type": {"auto": "auto", "none": "none", "required": "any"}[str(choice)]}


def _turns(request: PromptGenRequest, images: Mapping[str, str]) -> list[dict[str, Any]]:
    if request.messages is None:
        return [{"role": "user", "content": request.prompt}]
    turns: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message)
        elif isinstance(message, ToolMessage):
            role, blocks = "user", [_tool_result(message, images)]
        else:
            role, blocks = "user", _parts(message.content, images)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role == "user":
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def _assistant_blocks(message: AssistantMessage) -> list[Block]:
    """Reasoning blocks first (this provider's own, exactly as they came; another provider's are
    left out of this request), then the text, then the tool calls."""
    blocks: list[Block] = [
        dict(block.data) for block in message.reasoning or [] if block.provider == PROVIDER
    ]
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls or []:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.input)})
    return blocks


def _input(value: Any) -> Any:
    return {} if value is None else value


def _tool_result(message: ToolMessage, images: Mapping[str, str]) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    content = _parts(message.content, images)
    if content:
        block["content"] = content
    return block


def _parts(content: str | list[ContentPart], images: Mapping[str, str]) -> list[Block]:
    """Text and image blocks in order; blank texts are left out (Anthropic refuses empty text)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    blocks: list[Block] = []
    for part in content:
        if isinstance(part, TextPart):
            if not part.text.strip():
                continue
            block: Block = {"type": "text", "text": part.text}
            if part.cache:
                block["cache_control"] = dict(EPHEMERAL)
            blocks.append(block)
        elif isinstance(part, ImagePart):
            source = {"type": "base64", "media_type": part.mime_type, "data": images[part.path]}
            blocks.append({"type": "image", "source": source})
    return blocks
