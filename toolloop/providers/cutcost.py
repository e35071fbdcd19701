"""What a streamed attempt cut after its answer began may have cost, added to the answer that
completed (docs/providers.md, "Usage and cost": cut streams).

A stream cut mid-answer (the connection dropped, an `error` event such as `overloaded_error`, an
idle timeout) is retried (toolloop/providers/call.py). Whether the provider bills the cut attempt
is not documented; gateways that bill a cancelled Anthropic stream charge the input usage of its
`message_start` and the output generated. So the budget counts it, conservatively:

    begun       anthropic: message_start came; fal: a first chunk came. An attempt that failed
                before (an HTTP error, no answer) is not counted: nothing was generated.
    input       the usage the attempt reported (anthropic: message_start's input, cache read and
                cache write counts), priced by the catalogue as a completed answer's is; fal's
                router reports usage only in its last chunk, so a cut fal attempt has none: its
                input is the character estimate of the request (cost source "chars")
    output      the output tokens the attempt reported, or the character estimate
                (`common.estimate_tokens`) of the text, thinking and tool-input pieces received,
                whichever is larger (message_start reports output_tokens 1 or so)

An attempt that timed out after its request went out and before any answer began (a non-streamed
call's whole wait, toolloop/providers/timeouts.py; `http.Tally.unanswered`) has received nothing,
yet the provider may have generated the whole answer: `unanswered` prices it as the request's
estimate, the character estimate of its input at the input rate and its `max_tokens` at the output
rate (the wait was at least the expected time of max_tokens), output_from "max_tokens", cost source
"estimate".

Invariant: a cut attempt counts at least the input usage it reported; its output may be counted
where the provider did not bill it (at least once, never less). `with_cuts` adds the sum to the
result's `cost_usd` (so the loop's spend, the journaled step cost and a replay all carry it),
lists each attempt in `meta["cut_usd"]` / `meta["cut_usage"]`, and marks `meta["cost_source"]`
with `+cut`. A call that fails for good after cut attempts raises them on its error (`carry`,
`PromptGenError.cut_attempts`): the facade adds them to the answer of the provider it falls back to;
when no provider answers, the step raises and journals nothing, so they are only logged -- a known
gap (docs/providers.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from toolloop.contract import OnDelta, PromptGenResult, PromptGenUsage
from toolloop.errors import PromptGenError
from toolloop.providers.common import estimate_tokens

log = logging.getLogger("toolloop.providers")


@dataclass(frozen=True)
class Partial:
    """What one streamed attempt had received when it was cut: the usage it reported (None when it
    sent none) and its text, thinking and tool-input pieces, joined."""

    usage: dict[str, Any] | None
    received: str

    def output_tokens(self, reported: int) -> tuple[int, str]:
        """The output to count and where it comes from: the larger of `reported` and the character
        estimate of the pieces received ("usage" or "chars")."""
        estimated = estimate_tokens(self.received)
        return (reported, "usage") if reported >= estimated else (estimated, "chars")


class CutReader(Protocol):
    """A stream reader that can say what it received (anthropic's `MessageStream`, fal's
    `CompletionStream`)."""

    @property
    def done(self) -> bool: ...

    def partial(self) -> Partial | None:
        """What the attempt received; None when its answer had not begun."""


R = TypeVar("R", bound=CutReader)


class Readers(Generic[R]):
    """The stream factory handed to `call_json`: makes the provider's reader for each attempt and
    keeps them, so the handler can price the attempts that were cut (`cut`)."""

    def __init__(self, make: Callable[[OnDelta | None], R]) -> None:
        self.make = make
        self.made: list[R] = []

    def __call__(self, on_delta: OnDelta | None) -> R:
        reader = self.make(on_delta)
        self.made.append(reader)
        return reader

    def cut(self) -> list[Partial]:
        """What each attempt that began and did not end received, in order."""
        found = (reader.partial() for reader in self.made if not reader.done)
        return [partial for partial in found if partial is not None]


@dataclass(frozen=True)
class Cut:
    """One cut attempt, priced: the provider that made it, its usage as counted (output as
    `Partial.output_tokens` gives) and the cost source of its price ("tokens", "usage", "chars")."""

    provider: str
    usd: float
    usage: PromptGenUsage
    output_from: str
    cost_source: str

    def summary(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "prompt_tokens": self.usage.prompt_tokens,
            "cached_tokens": self.usage.cached_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "output_from": self.output_from,
            "cost_source": self.cost_source,
        }


def unanswered(
    provider: str,
    count: int,
    *,
    input_tokens: int,
    max_tokens: int,
    input_rate: float,
    output_rate: float,
) -> list[Cut]:
    """`count` attempts that timed out before any answer began, each at the request's estimate
    (module docstring); rates in USD per million tokens."""
    usd = round((input_tokens * input_rate + max_tokens * output_rate) / 1_000_000, 10)
    usage = PromptGenUsage(prompt_tokens=input_tokens, completion_tokens=max_tokens)
    return [Cut(provider, usd, usage, "max_tokens", "estimate") for _ in range(count)]


def with_cuts(result: PromptGenResult, cuts: Sequence[Cut]) -> PromptGenResult:
    """`result` with the cost of `cuts`, attempts made before it (and before those it already
    lists: a fallback adds the failed provider's), added (module docstring)."""
    if not cuts:
        return result
    meta = dict(result.meta or {})
    meta["cut_usd"] = [cut.usd for cut in cuts] + list(meta.get("cut_usd") or [])
    meta["cut_usage"] = [cut.summary() for cut in cuts] + list(
        meta.get("cut_usage") or []
    )
    source = str(meta.get("cost_source") or "none")
    meta["cost_source"] = source if source.endswith("+cut") else f"{source}+cut"
    cost = round(result.cost_usd + sum(cut.usd for cut in cuts), 10)
    return result.model_copy(update={"cost_usd": cost, "meta": meta})


def carry(error: PromptGenError, cuts: Sequence[Cut]) -> None:
    """A call that failed for good after cut attempts: they go on the error (`cut_attempts`), for
    the facade to count when another provider answers; logged, as a failed step journals no cost."""
    if not cuts:
        return
    error.cut_attempts = (*error.cut_attempts, *cuts)
    log.warning(
        "%s: the call failed after %d streamed attempt(s) cut mid-answer that may have cost $%.6f; "
        "counted only if a fallback provider answers the call (a failed step journals no cost)",
        cuts[0].provider,
        len(cuts),
        sum(cut.usd for cut in cuts),
    )
