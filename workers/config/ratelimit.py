"""Provider rate limits per API key and model, shared by every worker process through Redis.

Configured in the worker with TOOLLOOP_RATE_LIMITS: inline JSON, or the path of a JSON or YAML
file, mapping a provider to models ("*": any model) to limits (docs/flow-control.md):

    {"anthropic": {"*": {"requests_per_minute": 600, "input_tokens_per_minute": 400000,
                         "output_tokens_per_minute": 80000, "concurrent": 50, "burst_s": 1}}}

One Redis hash per (key, model), `tl:rl:{sha256(key)[:32]}:{model}` (the key's hash, never the key),
and a sorted set of the calls in flight beside it, updated by one Lua script per call:

- Requests and input tokens are booked as a generic cell rate (GCRA): each bucket holds at most
  `burst_s` seconds of its limit and refills continuously; a booking always takes its share, and a
  bucket below zero answers how long until the booking is covered. The caller sleeps that long on
  its loop (lending its step-consumer slot meanwhile) and then sends: one script call per model
  call however many wait, and no thundering herd. Output tokens are unknown before the answer: the
  answer's usage is taken afterwards (`settle`), with the input estimate corrected to the real count.
- `concurrent`: at most that many calls in flight per (key, model); a holder's entry expires after a
  lease, so a killed worker frees its places; a call still running re-dates it every third of a
  lease (`RENEW`, also the account's reservation of the call: workers/flow/limiter.py).
- The provider's answers teach the limiter (`LEARN`): `anthropic-ratelimit-*-remaining` lowers a
  bucket to what the provider says is left, a remaining of 0 blocks until its `-reset`, and a
  `retry-after` (a 429) blocks bookings until then; no header blocks longer than
  TOOLLOOP_MAX_RETRY_AFTER (300 s by default: a longer ask is logged and capped).
  `anthropic-ratelimit-*-limit` is kept as the limit in force where none is configured (the lower of
  the two where both are): a provider in `LEARNS` is booked with or without a TOOLLOOP_RATE_LIMITS
  entry. Until an answer has taught its requests limit, one call of the (key, model) goes first
  (`probe`) and BOOK answers the others `learning` until its answer (or its settle) is in; an answer
  that names no limit marks the bucket `open`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toolloop.providers.retry import MAX_RETRY_AFTER_S, capped_wait, parse_retry_after
from workers.protocol.keys import RATE_PREFIX

ENV = "TOOLLOOP_RATE_LIMITS"

KEY_ENVS = {
    "anthropic": "ANTHROPIC_API_KEY",
    "fal": "FAL_KEY",
    "openai": "OPENAI_API_KEY",
}
"""The environment variable each provider's key is read from (only its hash is ever used)."""

LEARNS = frozenset({"anthropic"})
"""The providers whose answers name the key's limits (`anthropic-ratelimit-*-limit`): their calls are
booked against the limits learned from them even when TOOLLOOP_RATE_LIMITS names none."""

_FIELDS = {
    "requests_per_minute": "rpm",
    "input_tokens_per_minute": "itpm",
    "output_tokens_per_minute": "otpm",
    "concurrent": "concurrent",
    "burst_s": "burst_s",
    "key_env": "key_env",
}


@dataclass(frozen=True)
class Limits:
    """Limits of one (provider key, model); 0 turns a limit off."""

    rpm: float = 0
    itpm: float = 0
    otpm: float = 0
    concurrent: int = 0
    burst_s: float = 1.0
    """Most seconds of each limit a bucket holds: the largest burst above the steady rate."""
    key_env: str | None = None


class RateLimitConfigError(ValueError):
    pass


def parse(raw: str) -> dict[str, dict[str, Limits]]:
    """TOOLLOOP_RATE_LIMITS (inline JSON or a JSON/YAML file's path) -> provider -> model -> Limits."""
    raw = raw.strip()
    if not raw:
        return {}
    try:
        if raw.startswith("{"):
            data: Any = json.loads(raw)
        else:
            text = Path(raw).read_text()
            data = (
                yaml.safe_load(text)
                if raw.endswith((".yaml", ".yml"))
                else json.loads(text)
            )
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise RateLimitConfigError(
            f"{ENV} could not be read ({error}).\n"
            '  Give inline JSON like {"anthropic": {"*": {"requests_per_minute": 600}}} or a JSON/YAML file.'
        ) from None
    if not isinstance(data, dict):
        raise RateLimitConfigError(
            f"{ENV} must map providers to models to limits; got {type(data).__name__}."
        )
    found: dict[str, dict[str, Limits]] = {}
    for provider, models in data.items():
        if not isinstance(models, dict):
            raise RateLimitConfigError(
                f"{ENV}: {provider!r} must map model names (or '*') to limits."
            )
        for model, limits in models.items():
            if not isinstance(limits, dict) or set(limits) - set(_FIELDS):
                bad = (
                    sorted(set(limits) - set(_FIELDS))
                    if isinstance(limits, dict)
                    else limits
                )
                raise RateLimitConfigError(
                    f"{ENV}: {provider}/{model}: unknown limits {bad!r}; use {', '.join(_FIELDS)}."
                )
            for name, value in limits.items():
                _check(f"{provider}/{model}", name, value)
            values = {_FIELDS[name]: value for name, value in limits.items()}
            found.setdefault(str(provider), {})[str(model)] = Limits(**values)
    return found


RANGES: dict[str, tuple[float, float, bool]] = {
    "requests_per_minute": (1, 1e7, True),
    "input_tokens_per_minute": (1, 1e10, True),
    "output_tokens_per_minute": (1, 1e10, True),
    "concurrent": (1, 100_000, True),
    "burst_s": (0.01, 3600, False),
}
"""Each limit's (least, most, whether 0 turns it off): a value outside is refused at load. The
bounds are wide of any provider's tiers: what lies outside is a typo (1e-9 requests a minute is one
in 1,900 years; 1e308 is no limit, and 0 says that)."""


def _check(where: str, name: str, value: Any) -> None:
    """Refuse a limit that is not a number in its range (RANGES), naming it, its value and the range."""
    if name == "key_env":
        if not isinstance(value, str) or not value.strip():
            raise RateLimitConfigError(
                f"{ENV}: {where}: key_env is {value!r}, not the name of an environment variable.\n"
                f'  Give the variable that holds the key, e.g. "key_env": "ANTHROPIC_API_KEY_BATCH".'
            )
        return
    least, most, off = RANGES[name]
    whole = name == "concurrent"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    fits = (
        number
        and ((value == 0 and off) or least <= value <= most)
        and (not whole or value == int(value))
    )
    if not fits:
        shape = "a whole number" if whole else "a number"
        zero = "0 (off) or " if off else ""
        raise RateLimitConfigError(
            f"{ENV}: {where}: {name} is {value!r}; it must be {zero}{shape} from {least:g} to {most:g}.\n"
            f"  Fix {name} in {ENV} (docs/flow-control.md lists each limit and its range)."
        )


def limits_for(
    config: dict[str, dict[str, Limits]], provider: str, model: str
) -> Limits | None:
    models = config.get(provider)
    if not models:
        return None
    return models.get(model) or models.get("*")


def key_hash(provider: str, limits: Limits, env: dict[str, str] | None = None) -> str:
    """The SHA-256 (first 32 hex digits) of the provider's key; "nokey" when it has none."""
    source = os.environ if env is None else env
    key = source.get(limits.key_env or KEY_ENVS.get(provider, ""), "").strip()
    return hashlib.sha256(key.encode()).hexdigest()[:32] if key else "nokey"


def bucket_key(hashed: str, model: str) -> str:
    return f"{RATE_PREFIX}{hashed}:{model}"


_HEADER_FIELDS = {"requests": "r", "input-tokens": "i", "output-tokens": "o"}


@dataclass(frozen=True)
class Lessons:
    """What an answer's headers teach (`lessons`): `blocked` until (epoch seconds, 0: not blocked);
    `remaining` [(field, left)] and `limits` [(field, per minute)] of the buckets it names; `open`:
    a 2xx answer that names no limit (the provider publishes none for this key)."""

    blocked: float
    remaining: list[tuple[str, float]]
    limits: list[tuple[str, float]]
    open: bool

    def args(self) -> list[Any]:
        """LEARN's ARGV."""
        pairs = [
            *self.remaining,
            *((f"l{field}", limit) for field, limit in self.limits),
        ]
        return [
            int(self.blocked * 1000),
            int(self.open),
            *(x for pair in pairs for x in pair),
        ]

    def __bool__(self) -> bool:
        return bool(self.blocked or self.remaining or self.limits or self.open)


def lessons(
    status: int,
    headers: Mapping[str, str],
    now: float,
    cap_s: float = MAX_RETRY_AFTER_S,
) -> Lessons:
    """What an answer's headers teach. A remaining of 0 blocks until its reset; a 429's
    `retry-after` blocks for that long; each `anthropic-ratelimit-*-limit` is the provider's limit.
    No header blocks past `now + cap_s` (TOOLLOOP_MAX_RETRY_AFTER; a longer ask is logged and
    capped), and a remaining that is not a finite number >= 0 is ignored."""
    blocked = 0.0
    remaining: list[tuple[str, float]] = []
    limits: list[tuple[str, float]] = []
    for kind, field in _HEADER_FIELDS.items():
        limit = _number(headers.get(f"anthropic-ratelimit-{kind}-limit"))
        if limit is not None and limit > 0:
            limits.append((field, limit))
        value = _number(headers.get(f"anthropic-ratelimit-{kind}-remaining"))
        if value is None:
            continue
        if not 0 <= value < math.inf:
            continue
        remaining.append((field, value))
        if value <= 0:
            name = f"anthropic-ratelimit-{kind}-reset"
            raw = headers.get(name)
            reset = _when(raw)
            if reset is not None and raw is not None:
                blocked = max(blocked, now + capped_wait(reset - now, cap_s, name, raw))
    if status == 429:
        after = parse_retry_after(headers, cap_s)
        blocked = max(blocked, now + (after if after is not None else 1.0))
    return Lessons(blocked, remaining, limits, 200 <= status < 300 and not limits)


def _number(raw: str | None) -> float | None:
    """A header's finite number (None: absent, not a number, inf or nan)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _when(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None
