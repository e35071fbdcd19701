"""The contract types of SPEC.md section 1: messages, parts, calls, one model request and its result.

Every model here is a frozen pydantic v2 model: values that go into journals, Redis and Celery
messages. Unions are discriminated by their `type` / `role` tag and read back through one
`TypeAdapter` each (`CHAT_MESSAGE`, `CONTENT_PART`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _unset(value: Any) -> bool:
    return value is None


class TextPart(_Value):
    type: Literal["text"] = "text"
    text: str
    cache: bool = False
    """A prompt-cache breakpoint after this part."""


class ImagePart(_Value):
    type: Literal["image"] = "image"
    path: str
    mime_type: str
    hash: str
    """Hex digest of the file bytes."""


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ToolCall(_Value):
    id: str
    name: str
    input: Any = None
    """The parsed JSON arguments."""


class ToolDefinition(_Value):
    name: str
    description: str
    input_schema: dict[str, Any]


class UserMessage(_Value):
    role: Literal["user"] = "user"
    content: str | list[ContentPart]


class ReasoningBlock(_Value):
    """One piece of a model's reasoning, opaque to the loop (SPEC 4.1). `provider` is the handler
    that produced it (`"anthropic"`, `"fal"`); `type` is what it is (`thinking`,
    `redacted_thinking`, `reasoning_details`, `reasoning`); `data` is the provider's own block,
    kept verbatim (Anthropic: `{"type": "thinking", "thinking": ..., "signature": ...}` or
    `{"type": "redacted_thinking", "data": ...}`; fal: one `reasoning_details` entry as OpenRouter
    sent it). The provider that produced it sends `data` back unchanged; others leave it out."""

    provider: str
    type: str
    data: dict[str, Any]


class AssistantMessage(_Value):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    """None unless the turn made at least one call."""
    reasoning: list[ReasoningBlock] | None = Field(default=None, exclude_if=_unset)
    """The reasoning blocks of the answer, in the order the provider gave them; None when none (then
    left out of dumps: a message without reasoning is stored as it was before the field existed)."""


def _false_flag(value: Any) -> bool:
    return value is False


class ToolMessage(_Value):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str | list[ContentPart]
    is_error: bool = Field(default=False, exclude_if=_false_flag)
    """The call failed (unknown tool, invalid input, a result over the limit, an MCP `isError`):
    Anthropic's `tool_result` carries `"is_error": true`. Left out of dumps when False, so a message
    stored before the field existed reads the same."""


ChatMessage = Annotated[
    UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]

CHAT_MESSAGE: TypeAdapter[ChatMessage] = TypeAdapter(ChatMessage)
CHAT_MESSAGES: TypeAdapter[list[ChatMessage]] = TypeAdapter(list[ChatMessage])
CONTENT_PART: TypeAdapter[ContentPart] = TypeAdapter(ContentPart)
CONTENT_PARTS: TypeAdapter[list[ContentPart]] = TypeAdapter(list[ContentPart])


class ToolChoiceName(_Value):
    name: str


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceName


class PromptGenRequest(_Value):
    """One model call. With none of `messages`, `tools`, `tool_choice`, `cache_system` set it is a
    one-turn prompt request."""

    prompt: str = ""
    system: str | None = None
    model: str | None = None
    temperature: float | None = None
    params: dict[str, Any] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    cache_system: bool | None = None

    @property
    def is_one_turn(self) -> bool:
        return (
            self.messages is None
            and self.tools is None
            and self.tool_choice is None
            and self.cache_system is None
        )


class PromptGenUsage(_Value):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None
    cache_write_5m_tokens: int | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    """Of the cache writes, those with the 5-minute TTL (None unless the provider's TTL is known)."""
    cache_write_1h_tokens: int | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    """Of the cache writes, those with the 1-hour TTL, priced at the model's 1-hour write rate."""


FinishReason = Literal["stop", "tool_calls", "length", "refusal", "paused", "other"]
"""`refusal`: the model declined (meta: `category`, `explanation`); `paused`: the provider paused a
long turn and wants it sent back to continue (Anthropic `pause_turn`); `length`: cut at the output
limit (meta `cut_off`: ids of tool calls whose input was cut short)."""


class PromptGenResult(_Value):
    text: str = ""
    cost_usd: float = 0.0
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: PromptGenUsage = Field(default_factory=PromptGenUsage)
    meta: dict[str, Any] | None = None
    reasoning: list[ReasoningBlock] | None = Field(default=None, exclude_if=_unset)
    """The answer's reasoning blocks (SPEC 4.1); the loop keeps them on the `AssistantMessage`.
    None is left out of dumps, so a journal step without reasoning reads as it did before."""


# -- streaming (SPEC 4.3) ----------------------------------------------------------------------


def _false(value: Any) -> bool:
    return value is False


class DeltaEvent(_Value):
    """A piece of a model answer as it streams in (SPEC 4.3). `text`: the new text (never journaled;
    the step's `ModelEvent` that follows holds the whole answer). `thinking`: it is reasoning text
    (Anthropic `thinking_delta`), not answer text. `step`: the 1-based model turn (0 when a provider
    is called outside a loop; the loop stamps it). `discard`: the deltas of this step so far are void
    (the answer is being made again: a retried attempt, a fallback provider, or the call failed);
    `text` is `""` then. A reader that shows deltas drops what it showed of the step on a discard."""

    kind: Literal["delta"] = "delta"
    step: int = 0
    text: str = ""
    thinking: bool = Field(default=False, exclude_if=_false)
    discard: bool = Field(default=False, exclude_if=_false)


OnDelta = Callable[[DeltaEvent], None]
"""What `generate(request, signal, on_delta=...)` calls with each delta; it must not block."""
