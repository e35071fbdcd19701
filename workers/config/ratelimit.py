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

KEY_ENVS = {"anthropic": "ANTHROPIC_API_KEY", "fal": "FAL_KEY", "openai": "OPENAI_API_KEY"}
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
            data = yaml.safe_load(text) if raw.endswith((".yaml", ".yml")) else json.loads(text)
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
            raise RateLimitConfigError(f"{ENV}: {provider!r} must map model names (or '*') to limits.")
        for model, limits in models.items():
            if not isinstance(limits, dict) or set(limits) - set(_FIELDS):
                bad = sorted(set(limits) - set(_FIELDS)) if isinstance(limits, dict) else limits
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
    fits = number and ((value == 0 and off) or least <= value <= most) and (not whole or value == int(value))
    if not fits:
        shape = "a whole number" if whole else "a number"
        zero = "0 (off) or " if off else ""
        raise RateLimitConfigError(
            f"{ENV}: {where}: {name} is {value!r}; it must be {zero}{shape} from {least:g} to {most:g}.\n"
            f"  Fix {name} in {ENV} (docs/flow-control.md lists each limit and its range)."
        )


def limits_for(config: dict[str, dict[str, Limits]], provider: str, model: str) -> Limits | None:
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


BOOK = """
-- KEYS[1] the (key, model) hash, KEYS[2] its calls in flight (zset holder -> expiry ms)
-- ARGV: rpm, itpm, otpm, concurrent, burst_s, input tokens, holder, lease ms, learns (1: the
--       provider's answers carry its limits, `anthropic-ratelimit-*-limit`: LEARN keeps them)
-- Each limit in force is the configured one, or the one the provider's answers taught ('lr', 'li',
-- 'lo'), the lower of the two when both are known.
-- -> {0, ""}: booked, send now; {ms, "rate"}: booked, send after ms; {ms, "busy"}: nothing booked,
--    every concurrent place is taken (ask again after ms); {ms, "learning"}: nothing booked, the
--    requests limit is neither configured nor learned and another call is out to learn it (ask
--    again after ms); {0, "open"}: nothing to book, the provider's answers name no limit and none
--    is configured
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, itpm, otpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local concurrent, burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local input, holder, lease = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local learns = tonumber(ARGV[9] or '0') == 1
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= concurrent then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {math.min(250, math.max(10, tonumber(first[2]) - now)), 'busy'}
  end
end
local state = redis.call('HMGET', KEYS[1], 'r', 'i', 'o', 'at', 'blocked', 'lr', 'li', 'lo', 'open',
  'probe', 'probe_until')
local taught = state[6] or state[7] or state[8]
local wait = math.max(0, (tonumber(state[5]) or 0) - now)
if learns and rpm == 0 and not taught then
  if state[9] then
    if itpm == 0 and otpm == 0 and concurrent == 0 and wait == 0 then return {0, 'open'} end
  else
    -- nothing known of the requests limit yet: one call goes first, its answer teaches it; an
    -- answer slower than a second lets one more go each second (nobody waits on a call that
    -- itself waits for another: a first answer never holds the rest longer than that)
    local until_ms = tonumber(state[11]) or 0
    if state[10] ~= holder and until_ms > now then
      return {math.min(100, math.max(10, until_ms - now)), 'learning'}
    end
    redis.call('HSET', KEYS[1], 'probe', holder, 'probe_until', now + math.min(lease, 1000))
  end
end
local at = tonumber(state[4]) or now
local elapsed = math.max(0, now - at)
local function refill(level, limit)
  local cap = limit * burst / 60
  if level == nil then return cap end
  return math.min(cap, level + elapsed * limit / 60000)
end
local function in_force(configured, learned)
  learned = tonumber(learned) or 0
  if configured > 0 and learned > 0 then return math.min(configured, learned) end
  return math.max(configured, learned)
end
local levels = {}
local limits = {in_force(rpm, state[6]), in_force(itpm, state[7]), in_force(otpm, state[8])}
local wants = {1, input, 0}
local names = {'r', 'i', 'o'}
for n = 1, 3 do
  if limits[n] > 0 then
    local level = refill(tonumber(state[n]), limits[n]) - wants[n]
    levels[#levels + 1] = names[n]
    levels[#levels + 1] = level
    if level < 0 then wait = math.max(wait, math.ceil(-level * 60000 / limits[n])) end
  end
end
levels[#levels + 1] = 'at'
levels[#levels + 1] = now
redis.call('HSET', KEYS[1], unpack(levels))
redis.call('PEXPIRE', KEYS[1], 3600000)
if concurrent > 0 then
  redis.call('ZADD', KEYS[2], now + wait + lease, holder)
  redis.call('PEXPIRE', KEYS[2], wait + lease + 60000)
end
if wait > 0 then return {wait, 'rate'} end
return {0, ''}
"""

SETTLE = """
-- KEYS[1] the (key, model) hash, KEYS[2] its calls in flight
-- ARGV: holder, input tokens beyond the estimate (may be < 0), output tokens
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'i', -tonumber(ARGV[2]))
  redis.call('HINCRBYFLOAT', KEYS[1], 'o', -tonumber(ARGV[3]))
  if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then  -- the call out to learn the limit is back
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
  end
end
return 1
"""

LEARN = """
-- KEYS[1] the (key, model) hash. ARGV: blocked until (ms, epoch; 0: none), open (1: a 2xx answer
-- that names no limit), then field, value pairs: 'r', 'i', 'o' lower that bucket to what the
-- provider says remains (never raise it); 'lr', 'li', 'lo' are the provider's limits per minute
-- (requests, input tokens, output tokens), kept as the limits in force where none is configured
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(ARGV[1])
if until_ms > now then
  local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked')) or 0
  if until_ms > blocked then redis.call('HSET', KEYS[1], 'blocked', until_ms) end
end
local i = 3
while i < #ARGV do
  local field, value = ARGV[i], tonumber(ARGV[i + 1])
  if string.sub(field, 1, 1) == 'l' then
    if value > 0 then redis.call('HSET', KEYS[1], field, value) end
  else
    local level = tonumber(redis.call('HGET', KEYS[1], field))
    if level == nil or value < level then redis.call('HSET', KEYS[1], field, value) end
  end
  i = i + 2
end
if ARGV[2] == '1' and redis.call('HEXISTS', KEYS[1], 'lr') == 0 and redis.call('HEXISTS', KEYS[1], 'li') == 0
    and redis.call('HEXISTS', KEYS[1], 'lo') == 0 then
  redis.call('HSET', KEYS[1], 'open', 1)
end
redis.call('PEXPIRE', KEYS[1], 3600000)
return 1
"""

RENEW = """
-- KEYS: sorted sets of holders -> expiry (ms, Redis clock): a (key, model)'s calls in flight, an
-- account's reservations. ARGV: lease ms, then the member of each key. Each member still held is
-- re-dated a lease from now (never earlier than it was); one gone (expired, settled) stays gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local score = tonumber(redis.call('ZSCORE', key, ARGV[i + 1]))
  if score ~= nil and score < now + lease then
    redis.call('ZADD', key, now + lease, ARGV[i + 1])
    local ttl = redis.call('PTTL', key)
    if ttl >= 0 and ttl < lease + 60000 then redis.call('PEXPIRE', key, lease + 60000) end
  end
end
return 1
"""

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
        pairs = [*self.remaining, *((f"l{field}", limit) for field, limit in self.limits)]
        return [int(self.blocked * 1000), int(self.open), *(x for pair in pairs for x in pair)]

    def __bool__(self) -> bool:
        return bool(self.blocked or self.remaining or self.limits or self.open)


def lessons(status: int, headers: Mapping[str, str], now: float, cap_s: float = MAX_RETRY_AFTER_S) -> Lessons:
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
