"""How long one model call may take: no whole-answer cap shorter than the answer can take.

The rule is the anthropic SDK's (`_base_client._calculate_nonstreaming_timeout`, `_constants`):
the expected time of an answer is 3,600 s x `max_tokens` / 128,000 (230 s for 8,192 tokens, 461 s
for 16,384, 900 s for 32,000); a call whose expected time is over 10 minutes must stream, and a
non-streamed call is given the SDK's default timeout of 10 minutes (connect 5 s). So:

    streams      when the caller publishes deltas, or `expected_s(max_tokens) > stream_above_s`
                 (600 s: `max_tokens` above 21,333); then `idle_s` bounds each wait for the next
                 bytes, never the whole answer
    whole_s      a non-streamed call waits max(`whole_s`, `expected_s(max_tokens)`) for its answer
                 (the read timeout: a non-streamed answer sends nothing before it is whole)
    connect_s    the wait for a connection

Both the Anthropic and the fal handler follow it (fal's default `max_tokens` of 32,000 streams).
`scaled(factor)` is the same rule on a clock `factor` times faster (every time x factor, the rate
/ factor): a test against `SimServer(time_scale=factor)` takes seconds where the real call takes
minutes, and decides exactly as the real one would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SDK_TIMEOUT_S = 600.0
"""The anthropic SDK's default timeout (`DEFAULT_TIMEOUT = httpx.Timeout(timeout=10 * 60, connect=5.0)`)."""
SDK_CONNECT_S = 5.0
SDK_TOKENS_PER_HOUR = 128_000.0
"""`expected_time = 60 * 60 * max_tokens / 128_000` in `_calculate_nonstreaming_timeout`."""


@dataclass(frozen=True)
class Timeouts:
    """The timeouts of a provider's model calls (module docstring); every value in seconds."""

    whole_s: float = SDK_TIMEOUT_S
    """The least wait for a non-streamed answer (the expected time of its max_tokens, if longer)."""
    idle_s: float = SDK_TIMEOUT_S
    """Streamed: the most wait for the next bytes of the answer."""
    connect_s: float = SDK_CONNECT_S
    stream_above_s: float = SDK_TIMEOUT_S
    """A call whose expected time is above this streams (the SDK refuses it non-streamed)."""
    tokens_per_hour: float = SDK_TOKENS_PER_HOUR
    """The generation rate the expected time assumes."""

    def __post_init__(self) -> None:
        for name in (
            "whole_s",
            "idle_s",
            "connect_s",
            "stream_above_s",
            "tokens_per_hour",
        ):
            value = getattr(self, name)
            if not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ValueError(
                    f"Timeouts.{name} must be a finite number of seconds above 0, got {value!r}.\n"
                    "  Pass e.g. Timeouts(whole_s=600, idle_s=600)."
                )

    @classmethod
    def of(cls, timeout_s: float) -> Timeouts:
        """A handler's `timeout_s`: the least whole-answer wait and the idle timeout, the rest the SDK's."""
        return cls(
            whole_s=timeout_s, idle_s=timeout_s, connect_s=min(timeout_s, SDK_CONNECT_S)
        )

    def expected_s(self, max_tokens: int) -> float:
        """How long an answer of `max_tokens` may take to generate."""
        return 3600.0 * max_tokens / self.tokens_per_hour

    def streams(self, max_tokens: int) -> bool:
        """The call must stream: its answer may take longer than a non-streamed call may wait."""
        return self.expected_s(max_tokens) > self.stream_above_s

    def whole(self, max_tokens: int) -> float:
        """The wait for a non-streamed answer of up to `max_tokens`."""
        return max(self.whole_s, self.expected_s(max_tokens))

    def scaled(self, factor: float) -> Timeouts:
        """The same rule on a clock `factor` times as fast (a scaled simulator's); the connect
        timeout stays (connections are not simulated)."""
        return Timeouts(
            whole_s=self.whole_s * factor,
            idle_s=self.idle_s * factor,
            connect_s=self.connect_s,
            stream_above_s=self.stream_above_s * factor,
            tokens_per_hour=self.tokens_per_hour / factor,
        )
