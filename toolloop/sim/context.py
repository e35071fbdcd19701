"""Anthropic context management in the simulator: context editing and threshold compaction, as strictly
as their docs and the SDK's beta types say (PROVIDERS.md "Context management"; docs/simulator.md).

Rules (each refused with a 400 `invalid_request_error`, the API's envelope):
- `context_management` edits need their beta header in `anthropic-beta`: `clear_tool_uses_20250919`
  and `clear_thinking_20251015` `context-management-2025-06-27`, `compact_20260112`
  `compact-2026-01-12`; on-demand compaction (the top-level `compaction: {"type": "summarize"}`)
  `compact-2026-09-04`, and it cannot be combined with `context_management` (the SDK's
  `MessageCreateParams` docstring); a request that sends a `compaction` block back needs one of the
  two compaction headers (which one: unconfirmed).
  The body is checked against the SDK's beta types (toolloop/sim/sdk_check.py).
- `compact_20260112`'s trigger is at least 50,000 input tokens (default 150,000).
- A compaction block must come back as the simulator made it: its `signature` is this server's HMAC
  over the summary and `encrypted_content` (which holds the turns it covers); a tampered or missing
  one is refused. A
  block whose `content` is null is a failed compaction, a no-op (the SDK's docstring); an empty
  string is refused.

What it does:
- On-demand compaction: the answer is the signed block alone (`stop_reason: "compaction"`), its
  summary made as toolloop/sim/compaction.py makes one, billed as one sampling of the request.
- The prompt of a request with a compaction block starts at the block: every block before it (the
  tools and system excepted) is dropped before the cache and the usage are computed, as the API
  drops what the block summarizes.
- `clear_tool_uses_20250919`: when the prompt passes the trigger (default 100,000 input tokens:
  unconfirmed, the secondary sources' figure), every tool result but the latest `keep` (default 3)
  and those of `exclude_tools` is replaced by a placeholder, if that clears at least
  `clear_at_least`; the cache then misses from the first cleared result on. The answer reports
  `context_management.applied_edits` (`cleared_tool_uses`, `cleared_input_tokens`).
- `compact_20260112`: when the prompt passes the trigger, the answer starts with a signed compaction
  block (its summary made as toolloop/sim/compaction.py makes one); the summary pass is billed as a
  `compaction` entry of `usage.iterations` (the request's prompt, cache reads and writes included),
  the answer as a `message` entry on the compacted prompt (tools, system and the summary, uncached);
  the top-level usage is the `message` entry's alone (PROVIDERS.md: the summary pass is outside it).
  With `pause_after_compaction` the answer is the block alone, `stop_reason: "compaction"`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from toolloop.sim.cache import Block, CacheUsage
from toolloop.sim.common import Parsed, WireInputError
from toolloop.sim.tokens import text_tokens

CONTEXT_BETA = "context-management-2025-06-27"
COMPACT_BETA = "compact-2026-01-12"
ON_DEMAND_BETA = "compact-2026-09-04"
BETAS = {
    "clear_tool_uses_20250919": CONTEXT_BETA,
    "clear_thinking_20251015": CONTEXT_BETA,
    "compact_20260112": COMPACT_BETA,
}
MIN_COMPACT_TRIGGER = 50_000
DEFAULT_COMPACT_TRIGGER = 150_000
DEFAULT_CLEAR_TRIGGER = 100_000
DEFAULT_KEEP = 3
CLEARED = "[tool result cleared]"
"""The placeholder of a cleared tool result (unconfirmed: the docs say only that a placeholder tells
the model the result was removed)."""


@dataclass
class Managed:
    """What context management did to one request: the parsed request (prompt blocks edited), the
    clear it applied, and the compaction it is due."""

    parsed: Parsed
    applied: list[dict[str, Any]] = field(default_factory=list)
    compact: dict[str, Any] | None = None
    head_tokens: int = 0
    beta: bool = False
    on_demand: bool = False


class ContextRules:
    """One server's context management: its signing key and the rules above."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    # -- signing -----------------------------------------------------------------------------------

    def sign(self, content: str, turns: int) -> dict[str, str]:
        """The block's `encrypted_content` (the turns it covers, opaque to the client) and
        `signature` (this server's HMAC over both and the summary)."""
        meta = base64.urlsafe_b64encode(json.dumps({"turns": turns}).encode()).decode()
        mac = hmac.new(
            self.secret, f"{meta}\x00{content}".encode(), hashlib.sha256
        ).hexdigest()
        return {"encrypted_content": meta, "signature": mac}

    def verify(self, content: str, block: dict[str, Any]) -> int | None:
        """The turns a block covers, or None when it is not as this server signed it."""
        meta, mac = block.get("encrypted_content"), block.get("signature")
        if not isinstance(meta, str) or not isinstance(mac, str):
            return None
        good = hmac.new(
            self.secret, f"{meta}\x00{content}".encode(), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(mac, good):
            return None
        try:
            return int(json.loads(base64.urlsafe_b64decode(meta))["turns"])
        except (ValueError, KeyError, TypeError):
            return None

    # -- the rules ---------------------------------------------------------------------------------

    def check(self, body: dict[str, Any], headers: Any) -> None:
        """Refuse what the API refuses (WireInputError: a 400)."""
        betas = {
            part.strip()
            for part in str(headers.get("anthropic-beta") or "").split(",")
            if part.strip()
        }
        for index, edit in enumerate(_edits(body)):
            kind = str(edit.get("type"))
            needed = BETAS.get(kind)
            if needed is not None and needed not in betas:
                raise WireInputError(
                    f"context_management.edits.{index}: {kind} requires the beta header "
                    f"'anthropic-beta: {needed}'."
                )
            if kind == "compact_20260112":
                trigger = _value(edit.get("trigger"), DEFAULT_COMPACT_TRIGGER)
                if trigger < MIN_COMPACT_TRIGGER:
                    raise WireInputError(
                        f"context_management.edits.{index}.trigger.value: must be at least "
                        f"{MIN_COMPACT_TRIGGER} input tokens, got {trigger}."
                    )
        self._check_blocks(body, betas)

    def _check_blocks(self, body: dict[str, Any], betas: set[str]) -> None:
        if isinstance(body.get("compaction"), dict):
            if ON_DEMAND_BETA not in betas:
                raise WireInputError(
                    f"compaction: requires the beta header 'anthropic-beta: {ON_DEMAND_BETA}'."
                )
            if "context_management" in body:
                raise WireInputError(
                    "compaction: cannot be combined with context_management."
                )
        for where, block in _compaction_blocks(body):
            if not betas & {COMPACT_BETA, ON_DEMAND_BETA}:
                raise WireInputError(
                    f"{where}: a compaction block requires the beta header '{ON_DEMAND_BETA}' "
                    f"(or '{COMPACT_BETA}')."
                )
            content = block.get("content")
            if content is None:
                continue  # a failed compaction: a no-op
            if not isinstance(content, str) or not content:
                raise WireInputError(
                    f"{where}.content: must be a non-empty string or null."
                )
            if self.verify(content, block) is None:
                raise WireInputError(
                    f"{where}.signature: does not match the block's content and encrypted_content; "
                    "send compaction blocks back exactly as they were received."
                )

    def covered(self, body: dict[str, Any]) -> tuple[int, int] | None:
        """(message index of the latest compaction block with content, the turns it covers)."""
        found = None
        for index, turn in enumerate(body.get("messages") or []):
            for block in _content(turn):
                if block.get("type") == "compaction" and isinstance(
                    block.get("content"), str
                ):
                    turns = self.verify(block["content"], block)
                    if turns is not None:
                        found = (index, turns)
        return found

    def apply(self, body: dict[str, Any], parsed: Parsed) -> Managed:
        """The request as the model sees it after the block and the edits (see the module doc)."""
        on_demand = isinstance(body.get("compaction"), dict)
        beta = (
            on_demand or "context_management" in body or bool(_compaction_blocks(body))
        )
        managed = Managed(parsed, beta=beta, on_demand=on_demand)
        if not managed.beta:
            return managed
        head = len(parsed.request.tools) + _system_blocks(body.get("system"))
        spans = _spans(body.get("messages") or [], head)
        blocks = list(parsed.blocks)
        request = parsed.request
        drop_from = 0
        latest = self.covered(body)
        if latest is not None:
            index, turns = latest
            drop_from = _block_of_compaction(body["messages"][index], spans[index])
            visible = sum(
                1
                for turn in body["messages"][index:]
                if turn.get("role") == "assistant"
            )
            request = dataclasses.replace(request, assistant_turns=turns + visible)
        edits = _edits(body)
        visible = sum(b.tokens for b in blocks[:head]) + sum(
            b.tokens for b in blocks[max(head, drop_from) :]
        )
        for edit in edits:
            if edit.get("type") == "clear_tool_uses_20250919":
                managed.applied += _clear(edit, body, spans, blocks, drop_from, visible)
        kept = blocks[:head] + blocks[max(head, drop_from) :]
        managed.parsed = Parsed(request, kept)
        managed.head_tokens = sum(block.tokens for block in blocks[:head])
        prompt = sum(block.tokens for block in kept)
        for edit in edits:
            due = prompt >= _value(edit.get("trigger"), DEFAULT_COMPACT_TRIGGER)
            if edit.get("type") == "compact_20260112" and due:
                managed.compact = edit
        return managed

    # -- the answer --------------------------------------------------------------------------------

    def answer(
        self, managed: Managed, body: dict[str, Any], usage: CacheUsage, summary: str
    ) -> None:
        """Put the compaction (block, iterations) and the applied edits into a rendered answer."""
        if not managed.beta:
            return
        if managed.applied or "context_management" in managed.parsed.request.body:
            body["context_management"] = {"applied_edits": managed.applied}
        turns = managed.parsed.request.assistant_turns
        if managed.on_demand:  # the answer is the block alone, billed as one sampling
            body["content"] = [
                {"type": "compaction", "content": summary, **self.sign(summary, turns)}
            ]
            body["stop_reason"] = "compaction"
            body["usage"]["output_tokens"] = text_tokens(summary)
            return
        edit = managed.compact
        if edit is None:
            return
        top = body["usage"]
        block = {"type": "compaction", "content": summary, **self.sign(summary, turns)}
        summary_tokens = text_tokens(summary)
        compaction = {
            "type": "compaction",
            "input_tokens": usage.input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "output_tokens": summary_tokens,
        }
        if edit.get("pause_after_compaction") is True:
            body["content"] = [block]
            body["stop_reason"] = "compaction"
            body["usage"] = {
                **top,
                **{k: v for k, v in compaction.items() if k != "type"},
                "iterations": [compaction],
            }
            return
        message = {
            "type": "message",
            "model": managed.parsed.request.model,
            "input_tokens": managed.head_tokens + summary_tokens,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": int(top.get("output_tokens", 0)),
        }
        body["content"] = [block, *body["content"]]
        top.update({k: v for k, v in message.items() if k not in ("type", "model")})
        top["cache_creation"] = {
            "ephemeral_5m_input_tokens": 0,
            "ephemeral_1h_input_tokens": 0,
        }
        top["iterations"] = [compaction, message]


def _edits(body: dict[str, Any]) -> list[dict[str, Any]]:
    managed = body.get("context_management")
    edits = managed.get("edits") if isinstance(managed, dict) else None
    return (
        [edit for edit in edits if isinstance(edit, dict)]
        if isinstance(edits, list)
        else []
    )


def _value(setting: Any, default: int) -> int:
    value = setting.get("value") if isinstance(setting, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _content(turn: Any) -> list[dict[str, Any]]:
    content = turn.get("content") if isinstance(turn, dict) else None
    return (
        [block for block in content if isinstance(block, dict)]
        if isinstance(content, list)
        else []
    )


def _compaction_blocks(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"messages.{index}.content.{position}", block)
        for index, turn in enumerate(body.get("messages") or [])
        for position, block in enumerate(_content(turn))
        if block.get("type") == "compaction"
    ]


def _system_blocks(system: Any) -> int:
    if system is None:
        return 0
    return (
        1 if isinstance(system, str) else len(system) if isinstance(system, list) else 0
    )


def _spans(messages: list[Any], start: int) -> list[list[tuple[int, int]]]:
    """Per message, per content item: (first prompt block, block count), as anthropic_wire parses."""
    spans: list[list[tuple[int, int]]] = []
    at = start
    for turn in messages:
        content = turn.get("content") if isinstance(turn, dict) else None
        items: list[tuple[int, int]] = []
        if not isinstance(content, list):
            items.append((at, 1))
            at += 1
        else:
            for block in content:
                count = 1
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    inner = block.get("content")
                    count = len(inner) if isinstance(inner, list) and inner else 1
                items.append((at, count))
                at += count
        spans.append(items)
    return spans


def _block_of_compaction(turn: dict[str, Any], items: list[tuple[int, int]]) -> int:
    for position, block in enumerate(_content(turn)):
        if block.get("type") == "compaction":
            return items[position][0]
    return items[0][0]


def _clear(
    edit: dict[str, Any],
    body: dict[str, Any],
    spans: list[list[tuple[int, int]]],
    blocks: list[Block],
    floor: int,
    prompt: int,
) -> list[dict[str, Any]]:
    """Clear old tool results in `blocks` (in place) as `edit` says, those from `floor` on (what a
    compaction block left), when the `prompt` tokens pass its trigger; the applied edit, if any."""
    if prompt <= _value(edit.get("trigger"), DEFAULT_CLEAR_TRIGGER):
        return []
    keep = _value(edit.get("keep"), DEFAULT_KEEP)
    excluded = set(edit.get("exclude_tools") or [])
    names: dict[str, str] = {}
    results: list[tuple[int, int]] = []
    for index, turn in enumerate(body.get("messages") or []):
        for position, block in enumerate(_content(turn)):
            if block.get("type") == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
            elif block.get("type") == "tool_result":
                start, count = spans[index][position]
                if (
                    start >= floor
                    and names.get(str(block.get("tool_use_id"))) not in excluded
                ):
                    results.append((start, count))
    old = results[: max(0, len(results) - keep)]
    cleared = sum(
        block.tokens for start, count in old for block in blocks[start : start + count]
    )
    if not old or cleared < _value(edit.get("clear_at_least"), 0):
        return []
    placeholder = text_tokens(CLEARED)
    for start, count in old:
        first = blocks[start]
        context = (
            first.key.split("text\x01", 1)[0] if "text\x01" in first.key else first.key
        )
        mark = next(
            (block.mark for block in blocks[start : start + count] if block.mark), None
        )
        blocks[start] = Block(f"{context}cleared\x01{CLEARED}", placeholder, mark)
        for offset in range(1, count):
            blocks[start + offset] = Block(f"{context}cleared\x01{offset}", 0, None)
    return [
        {
            "type": "clear_tool_uses_20250919",
            "cleared_tool_uses": len(old),
            "cleared_input_tokens": cleared - placeholder * len(old),
        }
    ]
