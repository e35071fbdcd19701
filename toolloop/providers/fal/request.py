"""Our `PromptGenRequest` -> a body for fal's OpenAI-compatible router
(`POST {run_url}/openrouter/router/openai/v1/chat/completions`), as PROVIDERS.md describes it.

Body keys, in this order: model, messages, max_tokens, temperature?, reasoning?, response_format?,
tools?, tool_choice?.
- System first (`cache_system` makes it one text part with `cache_control`), then the history.
- Text parts with `cache=True` carry `cache_control: {"type": "ephemeral"}`: the loop's rolling
  marks and the caller's marks land here.
- Images become `image_url` parts with the URL the handler got for each file: its fal storage URL
  (uploaded once, cached by content hash) or, when its upload failed or uploads are off, a
  `data:<mime>;base64,...` URI; the same file gives the same URL every step (stable prefix).
- Tool results carry text only (the OpenAI tool-message schema has no image parts; a router may drop
  them): each image of a tool result is replaced there by a text part `[image N of this result
  follows]`, and the images of a run of consecutive tool results go, in order, in one `user` message
  right after them: per result a text part `[images of the result of <tool_call_id>]` then its
  `image_url` parts. The same history always gives the same body.
- Reasoning: `params["reasoning"]` off|low|medium|high, default "medium"; sent as
  `{"effort": level}`, left out for "off". Temperature is clamped to 0..2.
- Assistant tool calls go back as `function.arguments` compact JSON (`{}` when the input is missing).
- Reasoning (SPEC 4.1): an assistant turn's own blocks go back as OpenRouter asks for tool flows:
  `reasoning_details` with every entry exactly as it came (a `reasoning` text block as the
  `reasoning` field); blocks another provider produced are left out of this request.
"""

from __future__ import annotations

import json
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
from toolloop.errors import PromptGenError
from toolloop.providers.common import Reasoning, max_tokens_of

DEFAULT_MAX_TOKENS = 32000
EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}

Part = dict[str, Any]
PROVIDER = "fal"


def build_body(
    request: PromptGenRequest,
    *,
    model: str,
    reasoning: Reasoning,
    images: Mapping[str, str],
) -> dict[str, Any]:
    """The JSON body. `images` maps each image path to the URL to send for it."""
    params = request.params or {}
    body: dict[str, Any] = {
        "model": model,
        "messages": _messages(request, images),
        "max_tokens": max_tokens_of(request, DEFAULT_MAX_TOKENS),
    }
    if request.temperature is not None:
        body["temperature"] = min(max(request.temperature, 0.0), 2.0)
    if reasoning != "off":
        body["reasoning"] = {"effort": reasoning}
    schema = params.get("response_schema", params.get("responseSchema"))
    if isinstance(schema, dict):
        strict = params.get("strict_schema", params.get("strictSchema")) is True
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": strict},
        }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if isinstance(choice, ToolChoiceName):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        body["tool_choice"] = choice
    return body


def prompt_images(request: PromptGenRequest) -> list[ImagePart]:
    """`params["images"]` of a one-turn prompt, checked: local files only, and never with messages."""
    raw = (request.params or {}).get("images")
    if raw is None:
        return []
    if request.messages is not None:
        raise PromptGenError(
            "fal prompt-gen takes no params.images with messages.\n  Put images in message content parts."
        )
    images: list[ImagePart] = []
    for item in raw if isinstance(raw, list) else [raw]:
        data = dict(item) if isinstance(item, Mapping) else None
        if data is not None and "mimeType" in data:
            data["mime_type"] = data.pop("mimeType")
        try:
            images.append(ImagePart.model_validate({**(data or {}), "type": "image"}))
        except ValueError:
            raise PromptGenError(
                "fal params.images must be local files.\n"
                "  Pass {'path', 'mime_type', 'hash'} for every image."
            ) from None
    return images


def _messages(
    request: PromptGenRequest, images: Mapping[str, str]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system is not None:
        if request.cache_system:
            system: Any = [
                {
                    "type": "text",
                    "text": request.system,
                    "cache_control": dict(EPHEMERAL),
                }
            ]
        else:
            system = request.system
        out.append({"role": "system", "content": system})
    if request.messages is None:
        extra = prompt_images(request)
        if extra:
            parts = [
                {"type": "text", "text": request.prompt},
                *(_image(p, images) for p in extra),
            ]
            out.append({"role": "user", "content": parts})
        else:
            out.append({"role": "user", "content": request.prompt})
        return out
    pending: list[
        Part
    ] = []  # the images of the tool results just sent, for one user message
    for message in request.messages:
        if not isinstance(message, ToolMessage) and pending:
            out.append({"role": "user", "content": pending})
            pending = []
        if isinstance(message, AssistantMessage):
            out.append(_assistant(message))
        elif isinstance(message, ToolMessage):
            content, shown = _tool_content(message, images)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": content,
                }
            )
            pending.extend(shown)
        else:
            out.append({"role": "user", "content": _content(message.content, images)})
    if pending:
        out.append({"role": "user", "content": pending})
    return out


def _tool_content(
    message: ToolMessage, images: Mapping[str, str]
) -> tuple[str | list[Part], list[Part]]:
    """The tool message's text-only content and the parts of the user message that shows its images."""
    if isinstance(message.content, str):
        return message.content, []
    parts: list[Part] = []
    shown: list[Part] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(_text(part))
        else:
            if not shown:
                shown.append(
                    {
                        "type": "text",
                        "text": f"[images of the result of {message.tool_call_id}]",
                    }
                )
            shown.append(_image(part, images))
            parts.append(
                {
                    "type": "text",
                    "text": f"[image {len(shown) - 1} of this result follows]",
                }
            )
    return parts, shown


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    own = [block for block in message.reasoning or [] if block.provider == PROVIDER]
    details = [dict(block.data) for block in own if block.type == "reasoning_details"]
    texts = [block.data.get("reasoning") for block in own if block.type == "reasoning"]
    if details:
        out["reasoning_details"] = details
    elif texts and isinstance(texts[0], str):
        out["reasoning"] = texts[0]
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(
                        {} if call.input is None else call.input,
                        separators=(",", ":"),
                        ensure_ascii=False,
                    ),
                },
            }
            for call in message.tool_calls
        ]
    return out


def _content(
    content: str | list[ContentPart], images: Mapping[str, str]
) -> str | list[Part]:
    if isinstance(content, str):
        return content
    parts: list[Part] = []
    for part in content:
        parts.append(
            _text(part) if isinstance(part, TextPart) else _image(part, images)
        )
    return parts


def _text(part: TextPart) -> Part:
    item: Part = {"type": "text", "text": part.text}
    if part.cache:
        item["cache_control"] = dict(EPHEMERAL)
    return item


def _image(part: ImagePart, images: Mapping[str, str]) -> Part:
    return {"type": "image_url", "image_url": {"url": images[part.path]}}
