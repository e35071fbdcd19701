"""The simulator's per-key rate limits: Anthropic's `anthropic-ratelimit-*` headers on every answer,
and a 429 `rate_limit_error` with `retry-after` once a key's bucket is empty (the SDK reads it as
`RateLimitError`)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx

from toolloop.sim import SimServer
from toolloop.sim.ratelimit import SimRateLimits

HELLO: Any = [{"role": "user", "content": "Hi"}]


def post(sim: SimServer, key: str) -> httpx.Response:
    return httpx.post(
        f"{sim.base_url}/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={"model": "claude-haiku-4-5", "max_tokens": 10, "messages": HELLO},
    )


def test_a_key_past_its_requests_per_minute_gets_429_with_the_headers() -> None:
    with SimServer([{"text": "Hi."}], rate_limits=SimRateLimits(rpm=3)) as sim:
        answers = [post(sim, "key-a") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [
            a.headers["anthropic-ratelimit-requests-remaining"] for a in answers
        ] == ["2", "1", "0"]
        assert answers[0].headers["anthropic-ratelimit-requests-limit"] == "3"
        assert answers[0].headers["anthropic-ratelimit-requests-reset"].endswith("Z")
        refused = post(sim, "key-a")
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert refused.headers["retry-after"] == "20"  # one request refills in 60 / 3 s
        assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert post(sim, "key-b").status_code == 200  # limits are per key
        with anthropic.Anthropic(
            api_key="key-a", base_url=sim.base_url, max_retries=0
        ) as sdk:
            try:
                sdk.messages.create(
                    model="claude-haiku-4-5", max_tokens=10, messages=HELLO
                )
                raise AssertionError("not limited")
            except anthropic.RateLimitError as error:
                assert error.response.headers["retry-after"] == "20"
        assert sim.stats()["statuses"]["429"] == 2


def test_input_tokens_per_minute_count_the_prompt() -> None:
    with SimServer([{"text": "Hi."}], rate_limits=SimRateLimits(input_tpm=100)) as sim:
        first = post(sim, "key-t")
        assert first.status_code == 200
        left = int(first.headers["anthropic-ratelimit-input-tokens-remaining"])
        assert 0 < left < 100
        # only the limits that are set
        assert "anthropic-ratelimit-requests-limit" not in first.headers


def post_fal(sim: SimServer, key: str) -> httpx.Response:
    return httpx.post(
        f"{sim.base_url}/openrouter/router/openai/v1/chat/completions",
        headers={"authorization": f"Key {key}"},
        json={
            "model": "anthropic/claude-haiku-4.5",
            "max_tokens": 10,
            "messages": HELLO,
        },
    )


def test_the_fal_wire_has_limits_of_its_own_and_burst_s_sizes_a_bucket() -> None:
    # 60 rpm holding 2 s of it: two requests, then a 429 (one request refills in 1 s)
    limits = SimRateLimits(rpm=60, burst_s=2)
    with SimServer([{"text": "Hi."}] * 9, fal_rate_limits=limits) as sim:
        answers = [post_fal(sim, "fal-a") for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429], [
            a.text for a in answers
        ]
        assert answers[2].headers["retry-after"] == "1"
        # fal sends none
        assert not [
            h for h in answers[2].headers if h.startswith("anthropic-ratelimit")
        ]
        assert [post(sim, "fal-a").status_code for _ in range(3)] == [
            200
        ] * 3  # Anthropic's wire: no limit
        assert sim.stats()["statuses"]["429"] == 1
