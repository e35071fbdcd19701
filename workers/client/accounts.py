"""Budget accounts shared by runs: a USD limit per period (day, month, or total), reserved before a
model call or a tool runs and settled with the real cost once it returns.

Redis keys (per account name):

    tl:acct:{name}                  hash: limit_usd, period (day|month|total), finish_at (0..1]
    tl:acct:{name}:spent:{period}   the USD settled in that period (period: 2026-12-01, 2026-12, total;
                                    every settle counts in all three, so a changed period stays right)
    tl:acct:{name}:held             zset: reservation id -> expiry (ms, Redis clock)
    tl:acct:{name}:held:usd         hash: reservation id -> USD reserved

`RESERVE` (one script) drops expired reservations, then compares the estimate with the limit: when
spent + the estimate is over it the step does not run (the run stops `budget`); when spent +
reserved + the estimate is over it the step waits for reservations in flight to settle and asks
again; else the estimate is held until `SETTLE`, which frees it and adds the real cost, and at or
over `finish_at` of the limit the run goes into finish mode. Reserving a held id again replaces its
amount (a model call that falls back to a dearer provider: workers/flow/limiter.py). Concurrent runs of one
account
therefore never spend more than the limit while the estimates are ceilings (a model call's: its
input estimate plus max_tokens at list price).
A reservation expires a lease after it was made: a worker killed mid-call, or a Redis restart that
kept the reservation (AOF) but lost its settle, frees it within a lease. A settle after the expiry
still counts the cost: the money was spent.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import redis as redis_lib

from workers.protocol.keys import ACCOUNT_PREFIX

PERIODS = ("day", "month", "total")


def key(name: str) -> str:
    return f"{ACCOUNT_PREFIX}{name}"


def period_id(period: str, now: float) -> str:
    when = datetime.datetime.fromtimestamp(now, datetime.UTC)
    if period == "day":
        return when.strftime("%Y-%m-%d")
    if period == "month":
        return when.strftime("%Y-%m")
    return "total"


def keys_of(name: str) -> list[str]:
    return [key(name), f"{key(name)}:held", f"{key(name)}:held:usd"]


def periods(now: float) -> list[str]:
    return [period_id("day", now), period_id("month", now)]


@dataclass(frozen=True)
class Verdict:
    verdict: str
    spent_usd: float
    reserved_usd: float
    limit_usd: float
    period: str = "total"
    period_id: str = "total"

    @classmethod
    def of(cls, reply: Any) -> Verdict:
        verdict, spent, reserved, limit, *period = (str(x) for x in reply)
        return cls(verdict, float(spent), float(reserved), float(limit), *period)


@dataclass(frozen=True)
class AccountSpend:
    """One account as `toolloop accounts` shows it."""

    name: str
    limit_usd: float
    period: str
    finish_at: float
    spent_usd: float
    reserved_usd: float


class AccountError(ValueError):
    pass


MAX_USD = 1e9
"""The largest amount in USD an account limit or one outside spend may be: more is a typo."""


def check_usd(usd: float, what: str, *, least: float, zero: bool) -> None:
    """Refuse an amount that is not a finite number of USD from `least` (0 itself only with `zero`)
    to MAX_USD, naming `what` and the range (AccountError, two lines)."""
    number = isinstance(usd, int | float) and not isinstance(usd, bool)
    if not (number and (least < usd <= MAX_USD or (zero and usd == 0))):
        lowest = f"from {least:g}" if zero else f"more than {least:g}"
        raise AccountError(
            f"{what} is {usd!r} USD; it must be a finite number {lowest} to {MAX_USD:,.0f}.\n"
            "  Give the amount in USD, e.g. 25 or 0.5."
        )


def check_name(name: str) -> None:
    if not name or len(name) > 200 or any(c in name for c in "{}:* \n\t"):
        raise AccountError(
            f"Account names are 1-200 characters without spaces, ':', '*' or braces; got {name!r}."
        )


def set_limit(
    client: redis_lib.Redis,
    name: str,
    usd: float,
    period: str = "day",
    finish_at: float = 0.9,
) -> None:
    """Set (or change) an account's limit; spend so far is kept."""
    check_name(name)
    if period not in PERIODS:
        raise AccountError(
            f"period must be one of {', '.join(PERIODS)}; got {period!r}."
        )
    check_usd(usd, f"The limit of account {name!r}", least=0.0, zero=False)
    if not 0 < finish_at <= 1:
        raise AccountError(
            f"finish_at must be more than 0 and at most 1 (a share of the limit); got {finish_at!r}.\n"
            "  Give a share such as 0.9: runs go into finish mode at that share of the limit."
        )
    client.hset(
        key(name),
        mapping={
            "limit_usd": repr(float(usd)),
            "period": period,
            "finish_at": repr(finish_at),
        },
    )


def spend(client: redis_lib.Redis, now: float) -> list[AccountSpend]:
    """Every account with a limit, its spend in the current period and what is reserved now."""
    found: list[AccountSpend] = []
    for raw in client.scan_iter(match=f"{ACCOUNT_PREFIX}*", count=500):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        rest = name[len(ACCOUNT_PREFIX) :]
        if ":" in rest:
            continue
        conf = {_s(k): _s(v) for k, v in client.hgetall(name).items()}
        if "limit_usd" not in conf:
            continue
        period = conf.get("period", "total")
        spent = client.get(f"{name}:spent:{period_id(period, now)}")
        expiry_ms = now * 1000
        live = {_s(m) for m in client.zrangebyscore(f"{name}:held", expiry_ms, "+inf")}
        held = {
            _s(k): float(_s(v)) for k, v in client.hgetall(f"{name}:held:usd").items()
        }
        found.append(
            AccountSpend(
                rest,
                float(conf["limit_usd"]),
                period,
                float(conf.get("finish_at", 0.9)),
                float(_s(spent)) if spent is not None else 0.0,
                sum(v for k, v in held.items() if k in live),
            )
        )
    return sorted(found, key=lambda a: a.name)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
