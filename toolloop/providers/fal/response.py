"""What fal's router answers beyond the chat-completions shape (toolloop/providers/chat_completions.py
parses that): a content-policy refusal in an error body (`flag`), and the price of a streamed
attempt cut mid-answer (`cut_cost`, toolloop/providers/cutcost.py).
"""

from __future__ import annotations

import re
from typing import Any

from toolloop.errors import PromptGenError
from toolloop.providers.catalog import ModelPrice
from toolloop.providers.chat_completions import parse_completion, token_count
from toolloop.providers.common import CacheTtl, estimate_tokens
from toolloop.providers.cutcost import Cut, Partial

_FLAGGED = re.compile(
    r"content_policy|sensitive|likeness|nsfw|moderation", re.IGNORECASE
)


def flag(detail: str) -> PromptGenError | None:
    """A content-policy refusal in an error body: an error of its own, never retried."""
    if not _FLAGGED.search(detail):
        return None
    return PromptGenError(
        f"fal flagged the LLM request (content policy): {detail}\n"
        "  Change the prompt or images; sending the same request will be refused again."
    )


def cut_cost(
    partial: Partial,
    *,
    price: ModelPrice,
    model: str,
    input_text: str,
    provider: str = "fal",
    ttl: CacheTtl = "5m",
) -> Cut:
    """A streamed attempt cut mid-answer, priced as the answer it had become: by the usage it
    reported (only the last chunk carries one), else by the character rule ("chars": the request's
    text and the pieces received; toolloop/providers/cutcost.py)."""
    choice = {"message": {"content": partial.received}, "finish_reason": "length"}
    body: dict[str, Any] = {"choices": [choice]}
    output, source = estimate_tokens(partial.received), "chars"
    if partial.usage:
        output, source = partial.output_tokens(
            token_count(partial.usage, "completion_tokens") or 0
        )
        body["usage"] = {**partial.usage, "completion_tokens": output}
    priced = parse_completion(
        body,
        price=price,
        model=model,
        input_text=input_text,
        provider=provider,
        ttl=ttl,
    )
    usage, cost_source = priced.usage, str((priced.meta or {}).get("cost_source"))
    if cost_source == "chars":  # the tokens the character rule priced
        counted = {
            "prompt_tokens": estimate_tokens(input_text),
            "completion_tokens": output,
        }
        usage = usage.model_copy(update=counted)
    return Cut(provider, priced.cost_usd, usage, source, cost_source)
