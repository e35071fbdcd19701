"""The simulator's per-key rate limits, as Anthropic applies them: a token bucket per API key and
limit (requests, input tokens, output tokens per minute), each holding at most one minute of its
limit and refilled continuously. A request that finds a bucket short is answered 429
`rate_limit_error` with `retry-after` (whole seconds, rounded up); every answer carries the
`anthropic-ratelimit-*` headers:

    anthropic-ratelimit-requests-limit / -remaining / -reset        (reset: RFC 3339, when full)
    anthropic-ratelimit-input-tokens-limit / -remaining / -reset
    anthropic-ratelimit-output-tokens-limit / -remaining / -reset

Input tokens are counted before the answer (the simulator's estimate, toolloop/sim/tokens.py),
output tokens once the answer is made (they may take a bucket below zero: the next request waits).
Keys are held by their SHA-256, never in the clear. `SimRateLimits(rpm=0)` (the default) is off.
`burst_s` (default 60) is the seconds of each limit a bucket holds. The fal wire has limits of its
own (`Simulator(fal_rate_limits=)`): its 429 carries `retry-after` and no `anthropic-ratelimit-*`.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import threading
import time
from dataclasses import dataclass, field

_KINDS = ("requests", "input-tokens", "output-tokens")


@dataclass
class _Bucket:
    limit: float
    level: float
    at: float
    cap: float

    def refill(self, now: float) -> None:
        self.level = min(self.cap, self.level + (now - self.at) * self.limit / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` fits (0 when it fits now)."""
        short = amount - self.level
        return 0.0 if short <= 0 else short * 60.0 / self.limit

    def full_in(self) -> float:
        return max(0.0, (self.cap - self.level) * 60.0 / self.limit)


@dataclass
class SimRateLimits:
    """Limits per minute for every API key (0: that limit is off)."""

    rpm: int = 0
    input_tpm: int = 0
    output_tpm: int = 0
    burst_s: float = 60.0
    """Seconds of each limit a bucket holds (one minute, as Anthropic's)."""
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def on(self) -> bool:
        return bool(self.rpm or self.input_tpm or self.output_tpm)

    def _limits(self) -> dict[str, int]:
        return {
            "requests": self.rpm,
            "input-tokens": self.input_tpm,
            "output-tokens": self.output_tpm,
        }

    def _bucket(self, key: str, kind: str, now: float) -> _Bucket | None:
        limit = self._limits()[kind]
        if not limit:
            return None
        bucket = self._buckets.get((key, kind))
        if bucket is None:
            cap = limit * self.burst_s / 60.0
            bucket = self._buckets[(key, kind)] = _Bucket(limit, cap, now, cap)
        bucket.refill(now)
        return bucket

    def admit(
        self, api_key: str, input_tokens: int
    ) -> tuple[float | None, dict[str, str]]:
        """Take one request and its input tokens: (None, headers) when admitted, else (seconds to
        wait, headers) and nothing is taken."""
        key = hashlib.sha256(api_key.encode()).hexdigest()
        want = {
            "requests": 1.0,
            "input-tokens": float(input_tokens),
            "output-tokens": 0.0,
        }
        with self._lock:
            now = time.monotonic()
            buckets = {kind: self._bucket(key, kind, now) for kind in _KINDS}
            waits = [b.wait_for(want[k]) for k, b in buckets.items() if b is not None]
            wait = max(waits, default=0.0)
            if wait <= 0:
                for kind, bucket in buckets.items():
                    if bucket is not None:
                        bucket.level -= want[kind]
            headers = self._headers(buckets)
        return (wait if wait > 0 else None), headers

    def used_output(self, api_key: str, output_tokens: int) -> None:
        key = hashlib.sha256(api_key.encode()).hexdigest()
        with self._lock:
            bucket = self._bucket(key, "output-tokens", time.monotonic())
            if bucket is not None:
                bucket.level -= output_tokens

    def _headers(self, buckets: dict[str, _Bucket | None]) -> dict[str, str]:
        headers: dict[str, str] = {}
        wall = time.time()
        for kind, bucket in buckets.items():
            if bucket is None:
                continue
            reset = datetime.datetime.fromtimestamp(
                wall + bucket.full_in(), datetime.UTC
            )
            name = f"anthropic-ratelimit-{kind}"
            headers[f"{name}-limit"] = str(int(bucket.limit))
            headers[f"{name}-remaining"] = str(max(0, math.floor(bucket.level)))
            headers[f"{name}-reset"] = reset.isoformat(timespec="seconds").replace(
                "+00:00", "Z"
            )
        return headers

    def reset(self) -> None:
        with self._lock:
            self._buckets.clear()
