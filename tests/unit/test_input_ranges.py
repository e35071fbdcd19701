"""Every number from outside has a range: a provider's wait headers are capped (and the cap logged),
TOOLLOOP_RATE_LIMITS, the worker's number settings, account limits and outside spend refuse a value
one step past their range with two lines naming what to fix, and take the value at the range's end."""

from __future__ import annotations

import logging
import math
import time

import pytest

from toolloop.cli import main
from toolloop.providers.retry import MAX_RETRY_AFTER_S, parse_retry_after
from workers.client import accounts, ops
from workers.config import ratelimit
from workers.config.settings import Settings

CAP = MAX_RETRY_AFTER_S


def test_the_default_cap_is_300_seconds() -> None:
    assert CAP == 300.0
    assert Settings.from_env().max_retry_after == CAP


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "1000000000"}, CAP),
        ({"retry-after": "inf"}, CAP),
        ({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, CAP),
        ({"retry-after-ms": "1e12"}, CAP),
        ({"retry-after": str(CAP + 0.001)}, CAP),
    ],
)
def test_a_wait_past_the_cap_is_capped_and_logged(
    headers: dict[str, str], expected: float, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="toolloop.providers"):
        assert parse_retry_after(headers) == expected
    assert any(
        "longer than the cap of 300 s" in record.getMessage()
        for record in caplog.records
    )


def test_a_wait_within_the_cap_is_kept_and_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="toolloop.providers"):
        assert parse_retry_after({"retry-after": str(CAP)}) == CAP
        assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
        assert parse_retry_after({"retry-after": "-5"}) == 0.0
        assert parse_retry_after({"retry-after": "nan"}) is None
        assert parse_retry_after({"retry-after-ms": "nan", "retry-after": "2"}) == 2.0
    assert not caplog.records
    assert parse_retry_after({"retry-after": "9"}, cap_s=3) == 3  # a policy's own cap


def test_the_rate_limit_key_is_never_blocked_past_the_cap() -> None:
    now = time.time()
    assert ratelimit.lessons(
        429, {"retry-after": "1000000000"}, now
    ).blocked == pytest.approx(now + CAP)
    dated = ratelimit.lessons(
        429, {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, now, 3.0
    )
    assert dated.blocked == pytest.approx(now + 3.0)
    reset = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
    }
    taught = ratelimit.lessons(200, reset, now)
    assert taught.blocked == pytest.approx(now + CAP) and taught.remaining == [
        ("r", 0.0)
    ]
    for bad in ("nan", "inf", "-1"):
        ignored = ratelimit.lessons(
            200, {"anthropic-ratelimit-input-tokens-remaining": bad}, now
        )
        assert (ignored.blocked, ignored.remaining) == (0.0, [])


def _limits(name: str, value: object) -> str:
    return f'{{"anthropic": {{"*": {{"{name}": {value}}}}}}}'


@pytest.mark.parametrize(
    ("name", "inside", "outside"),
    [
        (
            "requests_per_minute",
            ["0", "1", "1e7"],
            ["0.999", "10000001", "-1", "NaN", "Infinity", "1e-9", "true", '"600"'],
        ),
        ("input_tokens_per_minute", ["0", "1e10"], ["1e308", "10000000001", "NaN"]),
        ("output_tokens_per_minute", ["0", "1"], ["0.5", "-Infinity"]),
        ("concurrent", ["0", "1", "100000"], ["-1", "1.5", "100001", "NaN"]),
        ("burst_s", ["0.01", "3600"], ["0", "0.0099", "3601", "Infinity"]),
    ],
)
def test_rate_limits_refuse_one_step_past_their_range(
    name: str, inside: list[str], outside: list[str]
) -> None:
    for value in inside:
        ratelimit.parse(_limits(name, value))
    for value in outside:
        with pytest.raises(ratelimit.RateLimitConfigError) as caught:
            ratelimit.parse(_limits(name, value))
        first, second = str(caught.value).split("\n")
        assert (
            first.startswith(f"TOOLLOOP_RATE_LIMITS: anthropic/*: {name} is ")
            and "must be" in first
        )
        assert second.startswith("  Fix ") and "TOOLLOOP_RATE_LIMITS" in second


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("TOOLLOOP_MAX_RETRY_AFTER", "86400", "86401"),
        ("TOOLLOOP_MAX_RETRY_AFTER", "0.5", "0"),
        ("TOOLLOOP_METRICS_PORT", "65535", "65536"),
        ("TOOLLOOP_LEASE_MS", "0", "-1"),
        ("TOOLLOOP_LEASE_MS", "3000", "nan"),
        ("TOOLLOOP_STEP_TIMEOUT", "900", "inf"),
        ("TOOLLOOP_MAX_DELIVERIES", "5", "five"),
    ],
)
def test_number_settings_refuse_what_is_out_of_range(
    name: str, good: str, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, good)
    Settings.from_env()
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError) as caught:
        Settings.from_env()
    first, second = str(caught.value).split("\n")
    assert first.startswith(f"{name} is ") and second.startswith(f"  Set {name} ")


def test_the_metrics_port_binds_to_localhost_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.from_env().metrics_host == "127.0.0.1"
    monkeypatch.setenv("TOOLLOOP_METRICS_HOST", "0.0.0.0")
    assert Settings.from_env().metrics_host == "0.0.0.0"


class NoRedis:
    def hset(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("a refused limit is never written")


@pytest.mark.parametrize("usd", [0.0, -1.0, math.nan, math.inf, 1e9 + 1])
def test_an_account_limit_out_of_range_is_refused(usd: float) -> None:
    with pytest.raises(accounts.AccountError) as caught:
        accounts.set_limit(NoRedis(), "tenant", usd)  # type: ignore[arg-type]
    first, second = str(caught.value).split("\n")
    assert (
        "The limit of account 'tenant' is" in first
        and "1,000,000,000" in first
        and second.startswith("  ")
    )


def test_an_account_limit_at_the_top_of_its_range_is_written() -> None:
    written: dict[str, object] = {}

    class Recorder:
        def hset(self, key: str, mapping: dict[str, str]) -> None:
            written.update(mapping)

    accounts.set_limit(Recorder(), "tenant", 1e9)  # type: ignore[arg-type]
    assert written["limit_usd"] == "1000000000.0"


@pytest.mark.parametrize("usd", [-0.01, math.nan, math.inf, 1e9 + 1])
def test_outside_spend_out_of_range_is_refused_before_redis(usd: float) -> None:
    with pytest.raises(accounts.AccountError) as caught:
        next(ops.add_spend("r1", usd))
    first, second = str(caught.value).split("\n")
    assert "The outside spend for run 'r1' is" in first and second.startswith("  ")
    # 0 and up to the top are taken: the op asks Redis next
    next(ops.add_spend("r1", 0.0))
    next(ops.add_spend("r1", 1e9))


def test_the_accounts_command_refuses_a_limit_that_is_not_a_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["accounts", "--set", "tenant", "lots"]) == 1
    first, second = capsys.readouterr().err.strip("\n").split("\n")
    assert (
        "'lots' of account 'tenant' is not a number of USD" in first
        and second.startswith("  ")
    )
