"""Request-side rules shared by the tool-serving providers (anthropic, fal): checks made before any
call, the `reasoning` level and `cache_ttl`, and image bytes read from their paths at send time
(SPEC 3.3)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Literal, cast

from toolloop.contract import (
    AssistantMessage,
    ImagePart,
    PromptGenRequest,
    PromptGenResult,
    TextPart,
)
from toolloop.errors import PromptGenError

log = logging.getLogger("toolloop.providers")

Reasoning = Literal["off", "low", "medium", "high"]
CacheTtl = Literal["5m", "1h"]
_LEVELS = ("off", "low", "medium", "high")


def check_request(provider: str, request: PromptGenRequest) -> None:
    """Refuse, before any call, a request that has nothing to send."""
    if request.messages is not None and not request.messages:
        raise PromptGenError(
            f"{provider} prompt-gen messages must not be empty.\n  Pass at least one user message."
        )
    if request.messages is None and not request.prompt.strip():
        raise PromptGenError(
            f"{provider} prompt-gen needs a non-empty prompt.\n"
            "  Pass the text to generate from in request.prompt, or pass messages."
        )


def reasoning_of(
    provider: str, request: PromptGenRequest, default: Reasoning | None
) -> Reasoning | None:
    """`params["reasoning"]`, checked; `default` when the request does not set it."""
    value = (request.params or {}).get("reasoning")
    if value is None:
        return default
    if value not in _LEVELS:
        raise PromptGenError(
            f"{provider} params.reasoning must be 'off', 'low', 'medium' or 'high', not {value!r}.\n"
            "  Pass one of the four levels."
        )
    return cast(Reasoning, value)


def max_tokens_of(request: PromptGenRequest, default: int) -> int:
    """`params["max_tokens"]` when it is a positive integer, else `default`."""
    value = (request.params or {}).get("max_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def image_parts(request: PromptGenRequest) -> list[ImagePart]:
    """Every image part of the request's user and tool messages, in message order."""
    found: list[ImagePart] = []
    for message in request.messages or []:
        if message.role != "assistant" and isinstance(message.content, list):
            found.extend(
                part for part in message.content if isinstance(part, ImagePart)
            )
    return found


async def read_images(provider: str, parts: list[ImagePart]) -> dict[str, str]:
    """Base64 text of the file of every part, by path, read now (off the event loop)."""
    paths = sorted({part.path for part in parts})
    if not paths:
        return {}
    encoded = await asyncio.gather(
        *(asyncio.to_thread(_read_base64, provider, p) for p in paths)
    )
    return dict(zip(paths, encoded, strict=True))


def _read_base64(provider: str, path: str) -> str:
    return base64.b64encode(read_image(provider, path)).decode("ascii")


def image_kind(data: bytes) -> str | None:
    """The image type its first bytes say (png, jpeg, gif, webp), None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def read_image(provider: str, path: str) -> bytes:
    """The bytes of the image file at `path`, refused unless it is a regular file whose bytes are a
    PNG, JPEG, GIF or WebP image: a run spec can name any path, and this is what a provider would be
    sent (a key file, /etc/passwd, a device that never ends are refused here, nothing is sent)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PromptGenError(
                f"{provider} refuses the image {path!r}: it is not a regular file.\n"
                "  Name image files (PNG, JPEG, GIF or WebP) only."
            )
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PromptGenError(
            f"{provider} cannot read the image {path!r} ({exc.strerror or exc}).\n"
            "  Keep every image file of a conversation at its path until the run ends."
        ) from None
    if image_kind(data) is None:
        raise PromptGenError(
            f"{provider} refuses the image {path!r}: its bytes are not a PNG, JPEG, GIF or WebP image.\n"
            "  Name image files only; nothing of this file was sent."
        )
    return data


def estimate_tokens(text: str) -> int:
    """A token estimate without a tokenizer: ceil(ASCII chars / 4) + one per non-ASCII character."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return -(-ascii_chars // 4) + (len(text) - ascii_chars)


def input_text(request: PromptGenRequest) -> str:
    """The text a request sends: system, tool definitions, then every message's text, by newlines."""
    if request.messages is None:
        return (request.system or "") + request.prompt
    chunks = [request.system or ""]
    chunks += [
        json.dumps(t.model_dump(), separators=(",", ":")) for t in request.tools or []
    ]
    for message in request.messages:
        if isinstance(message.content, str):
            chunks.append(message.content)
        elif isinstance(message.content, list):
            chunks += [
                part.text for part in message.content if isinstance(part, TextPart)
            ]
        if isinstance(message, AssistantMessage):
            chunks += [
                json.dumps(call.input, separators=(",", ":"))
                for call in message.tool_calls or []
            ]
    return "\n".join(chunks)


IMAGE_TOKENS = 1000
"""The estimate's allowance for one image part."""


def estimate_input_tokens(request: PromptGenRequest) -> int:
    return estimate_tokens(input_text(request)) + IMAGE_TOKENS * len(
        image_parts(request)
    )


def log_answer(provider: str, model: str, result: PromptGenResult) -> None:
    """One DEBUG line per answer (a WARNING when it was cut at max_tokens or refused); never the key
    or text."""
    usage, source = result.usage, (result.meta or {}).get("cost_source")
    log.debug(
        "%s: %s answered %s (%d prompt tokens, %d cached, %d written; %d out) $%.6f from %s",
        provider,
        model,
        result.finish_reason,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.cache_write_tokens,
        usage.completion_tokens,
        result.cost_usd,
        source,
    )
    if result.finish_reason == "length":
        log.warning(
            "%s: the answer of %s was cut at max_tokens (partial)", provider, model
        )
    elif result.finish_reason == "refusal":
        category = (result.meta or {}).get("category")
        log.warning(
            "%s: %s refused to answer (category %s)",
            provider,
            model,
            category or "not given",
        )


def cache_ttl_of(request: PromptGenRequest) -> CacheTtl:
    """`params["cache_ttl"]`: "5m" (default) or "1h"; anything else is an error before any call."""
    value = (request.params or {}).get("cache_ttl", "5m")
    if value not in ("5m", "1h"):
        raise PromptGenError(
            f"params.cache_ttl must be '5m' or '1h', not {value!r}.\n  Pass one of the two TTLs."
        )
    return "1h" if value == "1h" else "5m"


def with_ttl(body: dict[str, Any], ttl: CacheTtl) -> dict[str, Any]:
    """`body` with `"ttl": ttl` on every `cache_control` mark (system, tools, message blocks and
    the blocks inside a tool_result). Every mark of a request gets the same TTL, so a 1-hour mark
    never follows a 5-minute one (SPEC 2.9)."""
    if ttl == "5m":
        return body
    out = dict(body)
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            out[key] = [ttl_block(block, ttl) for block in body[key]]
    out["messages"] = [
        {**turn, "content": [ttl_block(b, ttl) for b in turn["content"]]}
        if isinstance(turn.get("content"), list)
        else turn
        for turn in body.get("messages", [])
    ]
    return out


def ttl_block(block: Any, ttl: CacheTtl) -> Any:
    """A copy of one block with `"ttl": ttl` on its `cache_control` mark and on those of the blocks
    inside it when it is a tool_result; anything but a dict as it is."""
    if not isinstance(block, dict):
        return block
    out = dict(block)
    if isinstance(block.get("cache_control"), dict):
        out["cache_control"] = {**block["cache_control"], "ttl": ttl}
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        out["content"] = [ttl_block(inner, ttl) for inner in block["content"]]
    return out
