"""The flow-control scripts on a real Redis: the rate limiter's bookings (workers/config/ratelimit.py) and
the accounts' reservations (workers/client/accounts.py)."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from workers.client import accounts
from workers.config import ratelimit
from workers.config.ratelimit import Limits
from workers.protocol.scripts import accounts as account_scripts
from workers.protocol.scripts import ratelimit as rate_scripts


def book(
    client: redis.Redis,
    bucket: str,
    limits: Limits,
    tokens: int = 0,
    holder: str = "h",
    lease_ms: int = 5000,
) -> tuple[int, str]:
    wait, why = client.eval(
        rate_scripts.BOOK,
        2,
        bucket,
        f"{bucket}:inflight",
        limits.rpm,
        limits.itpm,
        limits.otpm,
        limits.concurrent,
        limits.burst_s,
        tokens,
        holder,
        lease_ms,
    )
    return int(wait), str(why)


def test_bookings_beyond_the_burst_wait_their_turn_at_the_limits_rate(
    redis_client: redis.Redis,
) -> None:
    bucket = ratelimit.bucket_key(
        ratelimit.key_hash("anthropic", Limits(), {"ANTHROPIC_API_KEY": "k1"}), "m"
    )
    limits = Limits(rpm=600, burst_s=1)  # 10 a second, at most 10 at once
    started = time.monotonic()
    waits = [book(redis_client, bucket, limits)[0] for _ in range(13)]
    took_ms = (time.monotonic() - started) * 1000
    assert waits[:10] == [0] * 10
    # the 11th waits 100 ms from the first booking, less the time the bookings took (a loaded
    # machine: tens of ms), rounded down to a whole ms
    for k, wait in enumerate(waits[10:], start=1):
        assert 100 * k - took_ms - 1 <= wait <= 100 * k, waits


def test_input_tokens_are_booked_and_settled_to_the_real_count(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-tokens:m"
    limits = Limits(itpm=60_000, burst_s=1)  # 1,000 tokens a second
    assert book(redis_client, bucket, limits, tokens=900)[0] == 0
    # it used 1,500
    redis_client.eval(rate_scripts.SETTLE, 2, bucket, f"{bucket}:inflight", "h", 600, 0)
    wait, why = book(redis_client, bucket, limits, tokens=500)
    # -1,000 left after this booking: ~1 s
    assert why == "rate" and 900 <= wait <= 1000, wait


def test_a_concurrency_limit_answers_busy_until_a_call_settles(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-busy:m"
    limits = Limits(rpm=60_000, concurrent=2)
    assert book(redis_client, bucket, limits, holder="a")[1] == ""
    assert book(redis_client, bucket, limits, holder="b")[1] == ""
    assert book(redis_client, bucket, limits, holder="c")[1] == "busy"
    redis_client.eval(rate_scripts.SETTLE, 2, bucket, f"{bucket}:inflight", "a", 0, 0)
    assert book(redis_client, bucket, limits, holder="c")[1] == ""


def test_a_killed_callers_place_frees_after_its_lease(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-lease:m"
    limits = Limits(rpm=60_000, concurrent=1)
    assert book(redis_client, bucket, limits, holder="dead", lease_ms=300)[1] == ""
    assert book(redis_client, bucket, limits, holder="next")[1] == "busy"
    time.sleep(0.35)
    assert book(redis_client, bucket, limits, holder="next")[1] == ""


def test_a_429s_retry_after_and_an_empty_bucket_block_the_next_bookings(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-learn:m"
    limits = Limits(rpm=60_000)
    headers = httpx.Headers(
        {
            "retry-after": "2",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2000-01-01T00:00:00Z",
        }
    )
    taught = ratelimit.lessons(429, headers, time.time())
    assert taught.remaining == [("r", 0.0)] and taught.blocked == pytest.approx(
        time.time() + 2, abs=0.5
    )
    redis_client.eval(rate_scripts.LEARN, 1, bucket, *taught.args())
    wait, why = book(redis_client, bucket, limits)
    assert why == "rate" and 1500 <= wait <= 2000, wait
    ok = httpx.Headers({"anthropic-ratelimit-requests-remaining": "7"})
    assert ratelimit.lessons(200, ok, time.time()) == ratelimit.Lessons(
        0.0, [("r", 7.0)], [], True
    )


def test_key_names_hold_the_keys_hash_never_the_key() -> None:
    hashed = ratelimit.key_hash(
        "anthropic", Limits(), {"ANTHROPIC_API_KEY": "sk-ant-secret"}
    )
    name = ratelimit.bucket_key(hashed, "claude-sonnet-4-5")
    assert "secret" not in name and len(hashed) == 32
    assert (
        ratelimit.key_hash(
            "anthropic", Limits(key_env="OTHER"), {"OTHER": "sk-ant-secret"}
        )
        == hashed
    )


def test_the_config_is_read_from_json_and_a_bad_one_says_how_to_fix_it(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    config = ratelimit.parse(
        '{"anthropic": {"*": {"requests_per_minute": 600, "concurrent": 5}}}'
    )
    assert ratelimit.limits_for(config, "anthropic", "any") == Limits(
        rpm=600, concurrent=5
    )
    assert ratelimit.limits_for(config, "fal", "any") is None
    path = tmp_path / "limits.yaml"
    path.write_text(
        "anthropic:\n  claude-haiku-4-5:\n    input_tokens_per_minute: 1000\n"
    )
    assert ratelimit.parse(str(path))["anthropic"]["claude-haiku-4-5"].itpm == 1000
    with pytest.raises(
        ratelimit.RateLimitConfigError, match="unknown limits \\['rpm'\\]"
    ):
        ratelimit.parse('{"anthropic": {"*": {"rpm": 600}}}')
    broken = tmp_path / "broken.yaml"
    broken.write_text("anthropic: [unclosed\n")
    with pytest.raises(ratelimit.RateLimitConfigError, match="could not be read"):
        ratelimit.parse(str(broken))


def reserve(
    client: redis.Redis, name: str, rid: str, usd: float, lease_ms: int = 5000
) -> accounts.Verdict:
    reply = client.eval(
        account_scripts.RESERVE,
        3,
        *accounts.keys_of(name),
        rid,
        usd,
        lease_ms,
        *accounts.periods(time.time()),
    )
    return accounts.Verdict.of(reply)


def settle(client: redis.Redis, name: str, rid: str, usd: float) -> None:
    client.eval(
        account_scripts.SETTLE,
        3,
        *accounts.keys_of(name),
        rid,
        usd,
        *accounts.periods(time.time()),
    )


def test_reservations_hold_the_limit_and_settle_the_real_cost(
    redis_client: redis.Redis,
) -> None:
    name = "team-a"
    # no limit set: not limited
    assert reserve(redis_client, name, "x", 0.5).verdict == "none"
    accounts.set_limit(redis_client, name, 1.0, "day", finish_at=0.8)
    assert reserve(redis_client, name, "r1", 0.5).verdict == "ok"
    assert reserve(redis_client, name, "r2", 0.4).verdict == "finish"  # 0.9 of 1.0 held
    # fits once those settle
    assert reserve(redis_client, name, "r3", 0.2).verdict == "wait"
    # never fits: refused, nothing held
    assert reserve(redis_client, name, "r3", 1.2).verdict == "stop"
    settle(redis_client, name, "r1", 0.05)
    settle(redis_client, name, "r2", 0.05)
    (row,) = [a for a in accounts.spend(redis_client, time.time()) if a.name == name]
    assert (row.name, row.period, row.spent_usd, row.reserved_usd) == (
        name,
        "day",
        pytest.approx(0.1),
        0.0,
    )
    assert reserve(redis_client, name, "r4", 0.2).verdict == "ok"


def held(client: redis.Redis, name: str) -> float:
    return next(
        a.reserved_usd for a in accounts.spend(client, time.time()) if a.name == name
    )


def test_an_unsettled_reservation_frees_after_its_lease(
    redis_client: redis.Redis,
) -> None:
    name = "team-lease"
    accounts.set_limit(redis_client, name, 1.0, "total")
    assert reserve(redis_client, name, "dead", 0.95, lease_ms=300).verdict == "finish"
    assert reserve(redis_client, name, "next", 0.1).verdict == "wait"
    assert held(redis_client, name) == pytest.approx(0.95)
    time.sleep(0.35)
    assert held(redis_client, name) == 0.0
    assert reserve(redis_client, name, "next", 0.1).verdict == "ok"


def test_bad_account_settings_say_what_is_allowed(redis_client: redis.Redis) -> None:
    with pytest.raises(
        accounts.AccountError, match="period must be one of day, month, total"
    ):
        accounts.set_limit(redis_client, "a", 1.0, "week")
    with pytest.raises(
        accounts.AccountError, match="must be a finite number more than 0"
    ):
        accounts.set_limit(redis_client, "a", 0)
    with pytest.raises(accounts.AccountError, match="without spaces"):
        accounts.set_limit(redis_client, "a b", 1)


def book_learning(
    client: redis.Redis, bucket: str, holder: str, limits: Limits | None = None
) -> tuple[int, str]:
    """BOOK for a provider whose answers name its limits (anthropic), no tokens."""
    limits = limits or Limits()
    wait, why = client.eval(
        rate_scripts.BOOK,
        2,
        bucket,
        f"{bucket}:inflight",
        limits.rpm,
        limits.itpm,
        limits.otpm,
        limits.concurrent,
        limits.burst_s,
        0,
        holder,
        5000,
        1,
    )
    return int(wait), str(why)


def test_before_an_answer_taught_the_limit_one_call_goes_and_the_rest_wait_for_it(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-probe:m"
    # it goes, to learn the limit
    assert book_learning(redis_client, bucket, "first") == (
        0,
        "",
    )
    wait, why = book_learning(redis_client, bucket, "second")
    # nothing booked: it asks again
    assert why == "learning" and 10 <= wait <= 100, (
        wait,
        why,
    )
    headers = httpx.Headers(
        {
            "anthropic-ratelimit-requests-limit": "120",
            "anthropic-ratelimit-requests-remaining": "119",
        }
    )
    taught = ratelimit.lessons(200, headers, time.time())
    assert taught.limits == [("r", 120.0)] and not taught.open
    redis_client.eval(rate_scripts.LEARN, 1, bucket, *taught.args())
    redis_client.eval(
        rate_scripts.SETTLE, 2, bucket, f"{bucket}:inflight", "first", 0, 0
    )
    # 120 a minute learned, a bucket of 1 s: 2 at once, then one every 0.5 s
    waits = [book_learning(redis_client, bucket, f"next{i}") for i in range(3)]
    assert (
        [w for w, _ in waits[:2]] == [0, 0]
        and waits[2][1] == "rate"
        and 400 <= waits[2][0] <= 500
    ), waits
    # a configured limit lower than the learned one is the one in force
    assert book_learning(redis_client, bucket, "low", Limits(rpm=6))[1] == "rate"


def test_a_provider_that_names_no_limit_is_open_and_a_lost_probe_lets_the_next_call_go(
    redis_client: redis.Redis,
) -> None:
    bucket = "tl:rl:test-open:m"
    assert book_learning(redis_client, bucket, "first") == (0, "")
    # failed
    redis_client.eval(
        rate_scripts.SETTLE, 2, bucket, f"{bucket}:inflight", "first", 0, 0
    )

    # the next call goes to learn it
    assert book_learning(redis_client, bucket, "second") == (
        0,
        "",
    )
    odd = httpx.Headers(
        {
            "anthropic-ratelimit-requests-limit": "inf",
            "anthropic-ratelimit-requests-remaining": "nan",
        }
    )
    # not numbers
    assert ratelimit.lessons(200, odd, time.time()) == ratelimit.Lessons(
        0.0, [], [], True
    )
    taught = ratelimit.lessons(200, httpx.Headers({}), time.time())
    assert taught.open
    redis_client.eval(rate_scripts.LEARN, 1, bucket, *taught.args())
    assert book_learning(redis_client, bucket, "third") == (0, "open")
