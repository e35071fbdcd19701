"""Context management of a long run (SPEC.md section 5): the policy, the input-token count that
decides a compaction, and the request a compaction step sends. docs/context.md explains it to users.

A compaction is a journal step of its own, `compact:<n>` (n: the model turn it comes before). Its
work sends the history the request would carry up to the cut (the previous summary, then the turns
since it) followed by `COMPACT_PROMPT`, through the run's own `generate` (the same provider chain as
every model call), and stores the summary text with the call's result (usage, cost). After it, each
request's first (user) message is the conversation's first user message (the task, verbatim)
followed by `SUMMARY_HEADER` + the summary, then comes the history from the cut on, unchanged.
The cut is always at an assistant message, so a tool call and its result are never split.
`result.messages` and the journal keep every turn.

Replay contract: every decision here is made from journaled values (the history, the usage of the
model steps, the stored compaction steps) and the options, so a replay decides the same: it reads
the stored step and never summarizes again.

Input tokens of the next request (`input_tokens`): the provider's count of the latest request
(`usage.prompt_tokens` of the latest model step, journaled with it: input + cache reads + cache
writes as the provider billed them), plus the estimate of what joined the history since; with no
such step since the latest compaction, the estimate of the whole request. The estimate
(`estimate_tokens`): 4 characters of a message's JSON per token (non-ASCII characters 1 each), an
image 1,000 tokens: the simulator's own rule (toolloop/sim/tokens.py), close to Anthropic's count
for English text and JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    ImagePart,
    ReasoningBlock,
    TextPart,
    ToolDefinition,
    UserMessage,
)

COMPACT_PROMPT = (
    "Summarize the conversation above for a continuation: it will be replaced by your summary, and "
    "the work goes on from the turns that follow it. Do not call any tool. Keep: the task and its "
    "success criteria as the user gave them; what has been done and what it found (names, paths, "
    "numbers, decisions and their reasons); errors met and how they were resolved; what remains to "
    "do, in order. Be concise and concrete. Write only the summary."
)
"""The last user message of a client-side compaction request (docs/context.md)."""

SUMMARY_HEADER = "Summary of the first {turns} model turns of this conversation (they were compacted):\n\n"
"""The head of the summary message that requests after a compaction start with."""

IMAGE_TOKENS = 1000
MIN_COMPACT_AT_TOKENS = 1024
MIN_SERVER_COMPACT_AT_TOKENS = 50_000
"""The least trigger of Anthropic's `compact_20260112` edit (its compaction docs: default 150,000)."""


class ContextPolicy(BaseModel):
    """How a long run keeps its requests small (SPEC.md 5.1). Every field off by default.

    `compact_at_tokens`: before a model call whose input would pass it, the loop runs a compaction
    step (`compact:<n>`). `keep_turns`: the most recent model turns (each with its tool results) a
    compaction keeps verbatim after the summary. `summary_prompt`: replaces `COMPACT_PROMPT`.
    `max_summary_tokens`: the output room of the summary call (`params["max_tokens"]`).

    Server-side (Anthropic only; other providers ignore them, docs/context.md):
    `clear_tool_results_at_tokens`: context editing `clear_tool_uses_20250919` with that input-token
    trigger, `keep_tool_results` recent tool uses kept, `clear_at_least` (`clear_floor()`), and
    `exclude_tools` never cleared. `server_compact_at_tokens`: threshold compaction
    `compact_20260112` with that trigger (at least 50,000); the answer's compaction block is
    journaled with the model step and sent back. It replaces the client-side compaction, so the
    two cannot be asked for together: nothing is summarized twice.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    compact_at_tokens: int | None = Field(default=None, ge=MIN_COMPACT_AT_TOKENS)
    keep_turns: int = Field(default=2, ge=0)
    clear_tool_results_at_tokens: int | None = Field(default=None, ge=1)
    keep_tool_results: int = Field(default=3, ge=0)
    clear_at_least: int | None = Field(default=None, ge=1)
    exclude_tools: list[str] = Field(default_factory=list)
    server_compact_at_tokens: int | None = Field(
        default=None, ge=MIN_SERVER_COMPACT_AT_TOKENS
    )
    on_demand: bool | None = None
    """Whether the compaction step asks the provider for its own summary (Anthropic on-demand
    compaction: `compaction: {"type": "summarize"}`, beta `compact-2026-09-04`) instead of making
    the client-side summary call with `summary_prompt`; its signed block is journaled and sent back
    first. None (the default): by the model's capability, as the model catalogue gives it
    (`ModelInfo.on_demand_compaction`, read through `options.supports`): on demand where the model
    has it, the summary call elsewhere (fal, other models). True / False force one way. True needs
    `compact_at_tokens`."""
    summary_prompt: str | None = None
    max_summary_tokens: int = Field(default=4096, ge=256)
    count_margin: float = Field(default=0.1, ge=0.0, le=1.0)
    """When the loop's figure for the next request is within this share of `compact_at_tokens`
    (either side), it asks the provider to count the request (Anthropic's token counting, journal
    step `count:<n>`) and decides on that count; further from the threshold, and where the
    provider cannot count (fal), the loop's figure decides alone. 0: count only at the threshold."""

    @model_validator(mode="after")
    def _check(self) -> ContextPolicy:
        if self.summary_prompt is not None and not self.summary_prompt.strip():
            raise ValueError(
                "summary_prompt is blank.\n  Leave it unset for the documented prompt, or write one."
            )
        if (
            self.compact_at_tokens is not None
            and self.server_compact_at_tokens is not None
        ):
            raise ValueError(
                "compact_at_tokens and server_compact_at_tokens are both set: a run compacts one way.\n"
                "  Keep server_compact_at_tokens for Anthropic's threshold compaction, or compact_at_tokens."
            )
        if self.on_demand and self.compact_at_tokens is None:
            raise ValueError(
                "on_demand is set without compact_at_tokens: nothing would ask for a compaction.\n"
                "  Set compact_at_tokens (when to compact), or leave on_demand off."
            )
        return self

    def edits(self) -> list[dict[str, Any]]:
        """The `context_management.edits` of every model request (Anthropic's shape, as its SDK's
        `BetaContextManagementConfigParam` types them); [] when the policy asks for none."""
        edits: list[dict[str, Any]] = []
        if self.clear_tool_results_at_tokens is not None:
            edit: dict[str, Any] = {
                "type": "clear_tool_uses_20250919",
                "trigger": {
                    "type": "input_tokens",
                    "value": self.clear_tool_results_at_tokens,
                },
                "keep": {"type": "tool_uses", "value": self.keep_tool_results},
                "clear_at_least": {"type": "input_tokens", "value": self.clear_floor()},
            }
            if self.exclude_tools:
                edit["exclude_tools"] = list(self.exclude_tools)
            edits.append(edit)
        if self.server_compact_at_tokens is not None:
            edits.append(
                {
                    "type": "compact_20260112",
                    "trigger": {
                        "type": "input_tokens",
                        "value": self.server_compact_at_tokens,
                    },
                }
            )
        return edits

    @property
    def prompt(self) -> str:
        return self.summary_prompt or COMPACT_PROMPT

    def clear_floor(self) -> int:
        """`clear_at_least`, or the default: half the clear trigger (docs/context.md: a clear
        breaks the cached prefix from the first cleared result on; clearing at least half of the
        context at once keeps those re-writes to one per half-context of growth)."""
        if self.clear_at_least is not None:
            return self.clear_at_least
        assert self.clear_tool_results_at_tokens is not None
        return max(1, self.clear_tool_results_at_tokens // 2)


# -- the estimate ------------------------------------------------------------------------------


def text_tokens(text: str) -> int:
    """ceil(ASCII characters / 4) + the number of non-ASCII code points."""
    if text.isascii():
        return math.ceil(len(text) / 4)
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


def message_tokens(message: ChatMessage) -> int:
    """The estimate of one message: its texts, tool-call inputs as JSON, images IMAGE_TOKENS each."""
    total = 4
    content = message.content
    if isinstance(content, str):
        total += text_tokens(content)
    elif content is not None:
        for part in content:
            total += (
                IMAGE_TOKENS if isinstance(part, ImagePart) else text_tokens(part.text)
            )
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls or ():
            total += text_tokens(call.name) + text_tokens(
                json.dumps(call.input, separators=(",", ":"))
            )
        for block in message.reasoning or ():
            total += text_tokens(json.dumps(block.data, separators=(",", ":")))
    return total


def estimate_tokens(
    system: str, tools: Sequence[ToolDefinition], messages: Sequence[ChatMessage]
) -> int:
    """The estimate of a whole request: system text, tool definitions as JSON, every message."""
    total = text_tokens(system)
    for tool in tools:
        total += text_tokens(
            json.dumps(tool.model_dump(mode="json"), separators=(",", ":"))
        )
    return total + sum(message_tokens(m) for m in messages)


# -- the compacted view ------------------------------------------------------------------------


class Compacted(BaseModel):
    """The state after the latest compaction: requests carry `head` then the history from `cut`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cut: int
    covered_turns: int
    head: list[UserMessage]
    block: ReasoningBlock | None = None
    """On-demand compaction: the provider's signed `compaction` block, sent first in the assistant
    message at the cut (then `head` is empty)."""


class CompactionState(BaseModel):
    """The compaction in force at the end of a `run_tool_loop` call (`result.compacted`), to pass as
    `options.compacted` to the call that goes on with the same history (a resume after an ask or an
    approval, a follow-up): that call's requests start from the summary instead of compacting the
    whole history again. `cut`: index in the history of the assistant message the summary ends
    before; `covered_turns`: the model turns it covers; `summary`: its text (a client-side summary)
    or `block` (an on-demand compaction's signed block, sent back unchanged)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cut: int = Field(ge=1)
    covered_turns: int = Field(ge=0)
    summary: str = ""
    block: ReasoningBlock | None = None


def summary_message(
    summary: str, covered_turns: int, first: ChatMessage | None
) -> UserMessage:
    """The first message of every request after a compaction: the conversation's first user message
    (the task, kept verbatim), then the summary text."""
    text = TextPart(text=SUMMARY_HEADER.format(turns=covered_turns) + summary)
    if not isinstance(first, UserMessage):
        return UserMessage(content=[text])
    content = first.content
    parts: list[ContentPart] = (
        [TextPart(text=content)] if isinstance(content, str) else list(content)
    )
    return UserMessage(content=[*parts, text])


def choose_cut(
    assistant_at: Sequence[int], keep_turns: int, length: int, current: int
) -> int | None:
    """Where a compaction cuts the history: at the `keep_turns`-th most recent assistant message
    (the end of the history for 0), never at or before the current cut; None when nothing new
    would be covered."""
    cut = (
        length
        if keep_turns == 0
        else (assistant_at[-keep_turns] if len(assistant_at) >= keep_turns else 0)
    )
    if cut <= current or cut <= 0:
        return None
    return cut


def stored_value(
    summary: str,
    cut: int,
    covered_turns: int,
    input_tokens: int,
    source: str,
    result: dict[str, Any],
) -> dict[str, Any]:
    """The value of a `compact:<n>` step."""
    return {
        "summary": summary,
        "cut": cut,
        "covered_turns": covered_turns,
        "input_tokens": input_tokens,
        "count": source,
        "result": result,
    }
