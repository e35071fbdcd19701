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
another provider produced are left out of this request (the history keeps them). A `compaction`
block (threshold compaction, SPEC 5.3) goes back the same way, `encrypted_content` verbatim.
Context management (SPEC 5.3): `params["context_management"]` (the loop's edits) is sent as the
body's `context_management`, with the `anthropic-beta` header `betas` names.

Top-level parameters (`max_tokens`, `thinking`, `output_config`, `tool_choice`) come from the
model's catalogue row (`params.py`: the same thinking setting on every step); `params["cache_ttl"]`
"1h" puts `"ttl": "1h"` on every mark. Temperature is never sent (see params.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    ImagePart,
    PromptGenRequest,
    TextPart,
    ToolMessage,
)
from toolloop.providers.anthropic.params import top_level
from toolloop.providers.catalog import ModelInfo
from toolloop.providers.common import (
    CacheTtl,
    Reasoning,
    cache_ttl_of,
    ttl_block,
    with_ttl,
)
from toolloop.providers.models import default_catalog

EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
"""Beta header of context editing (`clear_tool_uses_20250919`, `clear_thinking_20251015`): the
context-editing docs and the SDK's `AnthropicBetaParam`."""
COMPACTION_BETA = "compact-2026-01-12"
"""Beta header of threshold compaction (`compact_20260112`): the compaction docs
(platform.claude.com/docs/en/build-with-claude/compaction)."""
ON_DEMAND_BETA = "compact-2026-09-04"
"""Beta header of on-demand compaction (the top-level `compaction` parameter): the SDK's
`AnthropicBetaParam` and `BetaCompactionConfigParam` (anthropic 2.14.0). Which header a request that
only sends a block back needs is unconfirmed: it gets this one, or compact-2026-01-12 beside a
`compact_20260112` edit."""

Block = dict[str, Any]
PROVIDER = "anthropic"


def build_body(
    request: PromptGenRequest,
    *,
    model: str,
    reasoning: Reasoning | None,
    images: Mapping[str, str],
    info: ModelInfo | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The JSON body. `images` maps each image path to its base64 bytes (read at send time); `info`
    is the model's catalogue row (default: looked up, else a row that accepts what current models
    accept); `notes` collects what the shaping changed. (The handler sends the same body as bytes,
    built by `encode.encode_body` from `body_frame`.)"""
    body = body_frame(request, model=model, reasoning=reasoning, info=info, notes=notes)
    body["messages"] = turns(request, images, cache_ttl_of(request))
    return body


def body_frame(
    request: PromptGenRequest,
    *,
    model: str,
    reasoning: Reasoning | None,
    info: ModelInfo | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The body without its messages: `"messages"` is an empty list in its place (after the system
    text, before the tools); every other mark has its TTL already."""
    info = info or default_catalog().find(model) or ModelInfo(id=model)
    top, shaped = top_level(request, info, reasoning)
    if notes is not None:
        notes.extend(shaped)
    body: dict[str, Any] = {"model": model, "max_tokens": top.pop("max_tokens")}
    tools = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in request.tools or []
    ]
    if request.system:
        if request.cache_system:
            body["system"] = [
                {
                    "type": "text",
                    "text": request.system,
                    "cache_control": dict(EPHEMERAL),
                }
            ]
        else:
            body["system"] = request.system
    elif request.cache_system and tools:
        tools[-1]["cache_control"] = dict(EPHEMERAL)
    body["messages"] = []
    if tools:
        body["tools"] = tools
    body.update(top)
    managed = (request.params or {}).get("context_management")
    if isinstance(managed, dict) and managed.get("edits"):
        body["context_management"] = (
            managed  # the loop's edits (toolloop/loop/context.py), as documented
        )
    compaction = (request.params or {}).get("compaction")
    if isinstance(compaction, dict):
        body["compaction"] = (
            compaction  # an on-demand compaction request (the loop's compact:<n>)
        )
    return with_ttl(body, cache_ttl_of(request))


COUNT_FIELDS = (
    "model",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "context_management",
    "compaction",
)
"""What a `POST /v1/messages/count_tokens` body keeps of a message body (the SDK's
`MessageCountTokensParams`, anthropic 2.14.0: a message's fields minus `max_tokens`, `stream`,
`metadata`, `stop_sequences`, the sampling ones; the docs' token counting page: "the same
structured list of inputs for creating a message")."""


def count_body(body: dict[str, Any]) -> dict[str, Any]:
    """The token-counting body of a message body: its `COUNT_FIELDS`, in the message's order."""
    return {key: value for key, value in body.items() if key in COUNT_FIELDS}


def betas(request: PromptGenRequest) -> list[str]:
    """The `anthropic-beta` values the request needs: context editing for a clear edit, compaction
    for a compact edit or a compaction block sent back (the API refuses either without its header)."""
    needed: list[str] = []
    managed = (request.params or {}).get("context_management")
    edits = managed.get("edits") if isinstance(managed, dict) else None
    kinds = (
        {edit.get("type") for edit in edits if isinstance(edit, dict)}
        if isinstance(edits, list)
        else set()
    )
    if kinds & {"clear_tool_uses_20250919", "clear_thinking_20251015"}:
        needed.append(CONTEXT_MANAGEMENT_BETA)
    sends_block = any(
        block.provider == PROVIDER and block.type == "compaction"
        for message in request.messages or []
        if isinstance(message, AssistantMessage)
        for block in message.reasoning or []
    )
    if "compact_20260112" in kinds:
        needed.append(COMPACTION_BETA)
    elif sends_block or isinstance((request.params or {}).get("compaction"), dict):
        needed.append(ON_DEMAND_BETA)
    return needed


def turns(
    request: PromptGenRequest, images: Mapping[str, str], ttl: CacheTtl
) -> list[dict[str, Any]]:
    """The `messages` of the body: each message's blocks (`message_blocks`), consecutive user
    blocks in one turn."""
    if request.messages is None:
        return [{"role": "user", "content": request.prompt}]
    out: list[dict[str, Any]] = []
    for message in request.messages:
        role, blocks = message_blocks(message, images, ttl)
        if not blocks:
            continue
        if role == "user" and out and out[-1]["role"] == "user":
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def message_blocks(
    message: ChatMessage, images: Mapping[str, str], ttl: CacheTtl
) -> tuple[Literal["user", "assistant"], list[Block]]:
    """The role of the turn a message goes in and its blocks (fresh dicts), marks with `ttl`."""
    role, blocks = _blocks(message, images)
    if ttl != "5m":
        blocks = [ttl_block(block, ttl) for block in blocks]
    return role, blocks


def _blocks(
    message: ChatMessage, images: Mapping[str, str]
) -> tuple[Literal["user", "assistant"], list[Block]]:
    if isinstance(message, AssistantMessage):
        return "assistant", _assistant_blocks(message)
    if isinstance(message, ToolMessage):
        return "user", [_tool_result(message, images)]
    return "user", _parts(message.content, images)


def has_image(message: ChatMessage) -> bool:
    content = message.content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, ImagePart):
                return True
    return False


def _assistant_blocks(message: AssistantMessage) -> list[Block]:
    """Reasoning blocks first (this provider's own, exactly as they came; another provider's are
    left out of this request), then the text, then the tool calls."""
    blocks: list[Block] = [
        dict(block.data)
        for block in message.reasoning or []
        if block.provider == PROVIDER
    ]
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls or []:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": _input(call.input),
            }
        )
    return blocks


def _input(value: Any) -> Any:
    """The API takes an object only: a missing input is `{}`, any other non-object is wrapped."""
    if value is None:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def _tool_result(message: ToolMessage, images: Mapping[str, str]) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    content = _parts(message.content, images)
    if content:
        block["content"] = content
    if message.is_error:
        block["is_error"] = True
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
            source = {
                "type": "base64",
                "media_type": part.mime_type,
                "data": images[part.path],
            }
            blocks.append({"type": "image", "source": source})
    return blocks
