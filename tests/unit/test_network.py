"""`Network` (toolloop/http/network.py): which proxy a URL goes through, read from the
environment as curl and the standard library read it or set in code, and the certificates trusted;
`Timeouts` (toolloop/providers/timeouts.py): the anthropic SDK's rule for streaming and waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolloop import PromptGenError
from toolloop.http import Network
from toolloop.providers.timeouts import Timeouts

VARIABLES = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_the_scheme_picks_the_proxy_and_no_proxy_names_the_direct_hosts(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("HTTPS_PROXY", "http://proxy:3128")
    env.setenv("HTTP_PROXY", "http://plain:3128")
    env.setenv("NO_PROXY", " internal.example , .corp.test,10.0.0.5,sim:8443")
    network = Network()
    assert (
        network.proxy_for("https://api.anthropic.com/v1/messages")
        == "http://proxy:3128"
    )
    assert (
        network.proxy_for("http://api.anthropic.com/v1/messages") == "http://plain:3128"
    )
    for direct in (
        "https://internal.example/x",
        "https://a.internal.example/x",
        "https://b.corp.test/x",
        "https://corp.test/x",
        "https://10.0.0.5:443/x",
        "https://sim:8443/x",
    ):
        assert network.proxy_for(direct) is None, direct
    for proxied in (
        "https://notinternal.example/x",
        "https://sim:9443/x",
        "https://10.0.0.50/x",
    ):
        assert network.proxy_for(proxied) == "http://proxy:3128", proxied


def test_all_proxy_and_a_star(env: pytest.MonkeyPatch) -> None:
    env.setenv("ALL_PROXY", "http://every:1")
    assert Network().proxy_for("https://fal.run/x") == "http://every:1"
    env.setenv("NO_PROXY", "*")
    assert Network().proxy_for("https://fal.run/x") is None


def test_a_proxy_in_code_wins_and_trust_env_false_ignores_the_environment(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("HTTPS_PROXY", "http://from-env:1")
    env.setenv("NO_PROXY", "fal.run")
    assert (
        Network(proxy="http://mine:2").proxy_for("https://api.anthropic.com/")
        == "http://mine:2"
    )
    # NO_PROXY still applies
    assert Network(proxy="http://mine:2").proxy_for("https://fal.run/") is None
    assert (
        Network(proxy="http://mine:2", trust_env=False).proxy_for("https://fal.run/")
        == "http://mine:2"
    )
    assert Network(trust_env=False).proxy_for("https://api.anthropic.com/") is None


def test_a_ca_bundle_that_cannot_be_read_is_a_two_line_error(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(PromptGenError) as caught:
        Network().ssl_context()
    first, second = str(caught.value).split("\n")
    assert "SSL_CERT_FILE=" in first and "missing.pem" in first
    assert second.startswith("  Point it at a PEM file")
    with pytest.raises(PromptGenError, match=r"'/nowhere/ca\.pem'"):
        Network(verify="/nowhere/ca.pem").ssl_context()


@pytest.mark.parametrize(
    ("max_tokens", "expected_s"), [(8192, 230.4), (16384, 460.8), (32000, 900.0)]
)
def test_the_expected_time_is_the_sdks(max_tokens: int, expected_s: float) -> None:
    assert Timeouts().expected_s(max_tokens) == pytest.approx(expected_s)


def test_a_call_streams_above_10_minutes_and_a_whole_answer_waits_at_least_its_expected_time() -> (
    None
):
    sdk = Timeouts()
    assert not sdk.streams(21_333) and sdk.streams(21_334)
    assert sdk.whole(8192) == 600.0  # the SDK's default timeout
    # the old anthropic default: no longer a cap below the answer's time
    short = Timeouts.of(180.0)
    assert short.whole(8192) == pytest.approx(230.4) and short.whole(1000) == 180.0
    scaled = sdk.scaled(0.01)  # the same decisions on a clock 100 times as fast
    assert not scaled.streams(21_333) and scaled.streams(21_334)
    assert (
        scaled.whole(8192) == pytest.approx(6.0) and scaled.connect_s == sdk.connect_s
    )


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_timeouts_refuse_values_that_are_not_a_positive_finite_number(
    bad: float,
) -> None:
    with pytest.raises(ValueError, match="must be a finite number of seconds above 0"):
        Timeouts(whole_s=bad)
